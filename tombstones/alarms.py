"""Wake a ``retry_wait`` job when its backoff ends, from the worker process that parked it.

django-q2 has no delayed messages, so a job in ``retry_wait`` has none. The worker that recorded
the retry keeps an alarm for it: one thread per worker process sleeps until the earliest due
job, then sends that job's wake-up (:func:`tombstones.dispatch.wake`). Best effort: a worker that
exits (recycled, killed) drops its alarms, and the sweep re-dispatches due retries as it always
did. A wake-up that arrives twice costs a message; the claim runs the job once.
"""

from __future__ import annotations

import heapq
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from django.db import connections

logger = logging.getLogger("tombstones")

# Alarms one process keeps at most; past it, the sweep wakes the rest.
MAX_PENDING = 10_000
# Seconds an alarm rings after its backoff: the database's clock decides "due", and a wake-up
# that arrives early finds nothing to claim.
LATE = 0.1


class Alarms:
    """Pending wake-ups of one process, rung in due order by one daemon thread."""

    def __init__(self, wake: Callable[[int], object]) -> None:
        self._wake = wake
        self._due: list[tuple[float, int]] = []
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, job_id: int, delay: timedelta) -> bool:
        """Ring for ``job_id`` after ``delay``; False when too many alarms are pending."""
        ring_at = time.monotonic() + max(delay.total_seconds(), 0.0) + LATE
        with self._changed:
            if len(self._due) >= MAX_PENDING:
                return False
            heapq.heappush(self._due, (ring_at, job_id))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._ring, name="tombstones-alarms", daemon=True
                )
                self._thread.start()
            self._changed.notify()
        return True

    def pending(self) -> int:
        with self._changed:
            return len(self._due)

    def _ring(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    timeout = self._due[0][0] - time.monotonic() if self._due else None
                    self._changed.wait(timeout)
                _, job_id = heapq.heappop(self._due)
            try:
                self._wake(job_id)
            except Exception as exc:  # noqa: BLE001 - the sweep wakes it; the others still ring
                logger.warning(
                    "retry alarm for job %s failed (%s); the sweep will wake it",
                    job_id,
                    type(exc).__name__,
                    extra={"tombstones": {"job_id": job_id, "error_class": type(exc).__name__}},
                )
            finally:
                connections.close_all()  # this thread's own connections (ORM broker)


_alarms: dict[int, Alarms] = {}


def _process_alarms() -> Alarms:
    # Keyed by pid: a forked worker does not inherit its parent's thread.
    pid = os.getpid()
    found = _alarms.get(pid)
    if found is None:
        from .dispatch import wake

        found = _alarms[pid] = Alarms(wake)
    return found


def _in_cluster_worker() -> bool:
    """True in a process that django-q2's cluster started, outside sync mode.

    Elsewhere (a test run, a management command driving the phases) nothing keeps the process
    alive for the alarm, and a late wake-up would land in whatever runs next.
    """
    from .dispatch import runs_in_sync

    return not runs_in_sync() and multiprocessing.parent_process() is not None


def wake_when_due(job_id: int, delay: timedelta) -> bool:
    """After a retry commits: ring for the job once its backoff ends. True if an alarm is set."""
    if not _in_cluster_worker():
        return False
    return _process_alarms().add(job_id, delay)
