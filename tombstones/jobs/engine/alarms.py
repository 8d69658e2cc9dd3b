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
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections

from .. import ledger, queues, wakeups
from ..cluster import in_cluster_worker
from ..models import Job

logger = logging.getLogger("tombstones")

# Alarms one process keeps at most; past it, the sweep wakes the rest.
MAX_PENDING = 10_000
# Seconds an alarm rings after its moment: the database's clock decides "due", and a wake-up
# that arrives early finds nothing to claim.
LATE = 0.1
# After a failed tick, or a tick that woke a due job: the next look.
AGAIN = timedelta(seconds=1)


class Alarms:
    """Pending ticks of one process, rung in due order by one daemon thread.

    Outside a cluster worker (:func:`in_cluster_worker`) nothing is armed: nothing would keep
    the process alive for it, and a late wake-up would land in whatever runs next.
    """

    def __init__(self, ring: Callable[[bool], object] | None = None) -> None:
        # Called with True when the tick before it failed (tests hand in their own).
        self._ring_one = ring if ring is not None else self.tick
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

    def ring_in(self, delay: timedelta) -> bool:
        """Tick once ``delay`` has passed (after a retry commits). True if an alarm is set."""
        if not in_cluster_worker():
            return False
        return self.add(delay)

    def arm_next(self, using: str | None = None) -> bool:
        """After a pump found nothing due: tick when the ledger says something becomes due."""
        if not in_cluster_worker():
            return False
        try:
            wait = Job.objects.using(using).next_due_in(queues.served())
        except DatabaseError:
            return False  # the sweep is the fallback
        return wait is not None and self.ring_in(wait)

    def tick(self, after_failure: bool = False, using: str | None = None) -> dict[str, Any]:
        """Take back lapsed leases, wake a pump if anything is due, arm the next moment.

        ``after_failure``: the tick before failed (an outage): what the wake-up gate says may be
        stale (a pump that held it may have died), so a due job is woken regardless.
        """
        taken = ledger.take_back_lapsed(using)
        # A hint that came due: a lane to look at (read from the hints' index, not the backlog).
        heads = Job.objects.using(using).first_hints(queues.served())
        head = min(heads.values(), default=None)
        if head is not None:
            if after_failure:
                wakeups.hand_off(head)
            else:
                wakeups.wake_soon(head)
        # A job due now is a next moment: look again in a second, as long as the same job still
        # waits (its wake-up went nowhere); another job at the head means the queue moves.
        if in_cluster_worker():
            again = head is not None and (after_failure or self.watching in (None, head))
            self.watching = head if again else None
            if again:
                self.ring_in(AGAIN)
        self.arm_next(using)
        return {**taken, "woken": int(head is not None)}
