"""Timers: a job that becomes due wakes a worker within a second, without waiting for the sweep.

django-q2 has no delayed messages. Every cluster worker process keeps alarms, rung in due order
by one daemon thread, at each moment it knows something becomes due:

- a retry it recorded (the backoff's end);
- when its pump found nothing due, the next moment the ledger says something becomes due: a
  delayed job's ``run_after``, another retry, a lease's end (:meth:`JobQuerySet.next_due_at`);
- at its start (a worker replaced after a crash or a timeout): at once.

A ringing alarm *ticks*: it takes back lapsed leases (a crashed worker's jobs), wakes a pump if
anything is due, and arms the next moment. A job due now is such a moment too: a tick that woke
one looks again a second later, and again while that same job still waits (its wake-up went
nowhere); once another job is at the head, the queue moves and the looks stop. A tick that
fails (the database is down) rings again a second later until one succeeds, and that one wakes
a pump whatever the wake-up gate says: a job that became due during an outage runs within about
a second of the database's return. Best effort: an alarm dies with its process and the sweep
repairs what it missed; a tick that finds nothing costs three small reads.
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
from typing import Any

from django.db import DatabaseError, connections

logger = logging.getLogger("tombstones")

# Alarms one process keeps at most; past it, the sweep wakes the rest.
MAX_PENDING = 10_000
# Seconds an alarm rings after its moment: the database's clock decides "due", and a wake-up
# that arrives early finds nothing to claim.
LATE = 0.1
# After a failed tick, or a tick that woke a due job: the next look.
AGAIN = timedelta(seconds=1)


class Alarms:
    """Pending ticks of one process, rung in due order by one daemon thread."""

    def __init__(self, ring: Callable[[bool], object]) -> None:
        self._ring_one = ring  # called with True when the tick before it failed
        self._failed = False
        self.watching: int | None = None  # the due job a tick woke, looked at again
        self._due: list[float] = []
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, delay: timedelta) -> bool:
        """Tick after ``delay``; False when too many are pending or one rings as soon or sooner."""
        ring_at = time.monotonic() + max(delay.total_seconds(), 0.0) + LATE
        with self._changed:
            if len(self._due) >= MAX_PENDING:
                return False
            if self._due and self._due[0] <= ring_at + LATE:
                # An alarm rings as soon: its tick arms the next moment the ledger knows of.
                return False
            heapq.heappush(self._due, ring_at)
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
                while not self._due or self._due[0] > time.monotonic():
                    timeout = self._due[0] - time.monotonic() if self._due else None
                    self._changed.wait(timeout)
                ring_at = heapq.heappop(self._due)
                # Alarms due together ring once.
                while self._due and self._due[0] <= ring_at + LATE:
                    heapq.heappop(self._due)
            try:
                self._ring_one(self._failed)
                self._failed = False
            except Exception as exc:  # noqa: BLE001 - rung again; the sweep is the fallback
                if not self._failed:
                    logger.warning(
                        "timer tick failed (%s); trying again every %ss",
                        type(exc).__name__,
                        int(AGAIN.total_seconds()),
                        extra={"tombstones": {"error_class": type(exc).__name__}},
                    )
                self._failed = True
                self.add(AGAIN)
            finally:
                connections.close_all()  # this thread's own connections


_alarms: dict[int, Alarms] = {}


def _process_alarms() -> Alarms:
    # Keyed by pid: a forked worker does not inherit its parent's thread.
    pid = os.getpid()
    found = _alarms.get(pid)
    if found is None:
        found = _alarms[pid] = Alarms(tick)
    return found


def _in_cluster_worker() -> bool:
    """True in a process that django-q2's cluster started, outside sync mode.

    Elsewhere (a test run, a management command driving the phases) nothing keeps the process
    alive for the alarm, and a late wake-up would land in whatever runs next.
    """
    from ..wakeups import runs_in_sync

    return not runs_in_sync() and multiprocessing.parent_process() is not None


def ring_in(delay: timedelta) -> bool:
    """Tick once ``delay`` has passed (after a retry commits). True if an alarm is set."""
    if not _in_cluster_worker():
        return False
    return _process_alarms().add(delay)


def arm_next(using: str | None = None) -> bool:
    """After a pump found nothing due: tick when the ledger says something becomes due."""
    if not _in_cluster_worker():
        return False
    from ..models import Job

    try:
        wait = Job.objects.using(using).next_due_in()
    except DatabaseError:
        return False  # the sweep is the fallback
    return wait is not None and ring_in(wait)


def tick(after_failure: bool = False, using: str | None = None) -> dict[str, Any]:
    """Take back lapsed leases, wake a pump if anything is due, arm the next moment.

    ``after_failure``: the tick before failed (an outage): what the wake-up gate says may be
    stale (a pump that held it may have died), so a due job is woken regardless.
    """
    from .. import ledger
    from ..models import Job
    from ..wakeups import hand_off, wake_soon

    taken = ledger.take_back_lapsed(using)
    # A hint that came due: a lane to look at (read from the hints' index, not the backlog).
    head = Job.objects.using(using).hinted().values_list("id", flat=True).first()
    if head is not None:
        if after_failure:
            hand_off(head)
        else:
            wake_soon(head)
    # A job due now is a next moment: look again in a second, as long as the same job still
    # waits (its wake-up went nowhere); another job at the head means the queue moves.
    pending = _process_alarms() if _in_cluster_worker() else None
    if pending is not None:
        again = head is not None and (after_failure or pending.watching in (None, head))
        pending.watching = head if again else None
        if again:
            ring_in(AGAIN)
    arm_next(using)
    return {**taken, "woken": int(head is not None)}


def on_worker_start(sender: Any = None, **kwargs: Any) -> None:
    """django-q2 ``post_spawn`` receiver: a new worker (perhaps replacing a dead one) ticks at
    once and opens the wake-up gate its predecessor may have held."""
    if not _in_cluster_worker():
        return
    from ..wakeups import open_gate

    try:
        open_gate()
    except Exception as exc:  # noqa: BLE001 - the gate expires by itself
        logger.warning("could not open the wake-up gate at start (%s)", type(exc).__name__)
    _process_alarms().add(timedelta(0))
