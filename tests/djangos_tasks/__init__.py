"""Django's own ``tests/tasks`` against TombstoneBackend (tests/acceptance/test_djangos_tests.py).

The test modules come from the source distribution of the Django this environment runs (PyPI),
adapted as little as they can be (:data:`REWRITES`): their backends become ours, and their test
cases reach the database, where our backend keeps its jobs. The two backends below stand in for
Django's dummy backend (jobs stay queued) with its two test helpers; Django's immediate backend
becomes TombstoneBackend itself, run with django-q2 in sync mode (a job runs once its enqueue
commits, in the enqueuing process).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tombstones.tasks import TombstoneBackend


class Stored(TombstoneBackend):
    """TombstoneBackend with the dummy backend's two test helpers: ``results`` (every job as a
    TaskResult, in enqueue order) and ``clear()`` (no job left)."""

    @property
    def results(self) -> list[Any]:
        # The dummy backend's are in memory, and its tests read them from async code too: ours
        # are in the database, read on a thread of their own there.
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._read()
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(self._read).result()

    def _read(self) -> list[Any]:
        from django.db import connection

        from tombstones.models import Job

        try:
            pks = list(Job.objects.order_by("pk").values_list("pk", flat=True))
            return [self.get_result(str(pk)) for pk in pks]
        finally:
            if threading.current_thread() is not threading.main_thread():
                connection.close()

    def clear(self) -> None:
        from tombstones.models import Job

        Job.objects.all().delete()
