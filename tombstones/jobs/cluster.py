"""What a process knows of the django-q2 cluster it runs in: its size, its timeout, its mode.

django-q2's ``Conf`` reads the settings when it is imported, so it is imported where it is read,
not when this module is (``import tombstones`` must not need configured settings).
"""

from __future__ import annotations

import multiprocessing

from ..conf import tombstone_settings


def runs_in_sync() -> bool:
    """True when a wake-up runs the pump at once in the caller (django-q2's sync mode)."""
    from django_q.conf import Conf

    return bool(tombstone_settings.Q_OPTIONS.get("sync", Conf.SYNC))


def in_cluster_worker() -> bool:
    """True in a process that django-q2's cluster started, outside sync mode.

    Elsewhere (a test run, a management command driving the phases) nothing keeps the process
    alive for a timer, and a late wake-up would land in whatever runs next.
    """
    return not runs_in_sync() and multiprocessing.parent_process() is not None


def cluster_workers() -> int:
    """Worker processes of the django-q2 cluster this runs in (a claim takes its share)."""
    from django_q.conf import Conf

    return max(1, int(Conf.WORKERS or 1))


def task_seconds() -> float | None:
    """How long this wake-up may run: half of django-q2's task timeout, if it has one.

    django-q2 kills a task that outlives its timeout, and the job then running would be charged
    with the crash; a wake-up stops starting jobs at half of it and hands the rest to another
    message. So a handler must finish within half of the timeout.
    """
    from django_q.conf import Conf

    timeout = tombstone_settings.Q_OPTIONS.get("timeout", Conf.TIMEOUT)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        return None
    return float(timeout) / 2
