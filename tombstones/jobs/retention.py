"""Retention: how long a finished job stays in the ledger, and the bounded purge that removes it.

Two kinds of finished job, each with its setting:

- ``jobs`` (succeeded, cancelled, expired): ``TOMBSTONES_JOB_RETENTION``, 30 days;
- ``audit`` (rejected, failed, uncertain, superseded, escalated): the audit trail,
  ``TOMBSTONES_AUDIT_RETENTION``, 365 days, never shorter than a tombstone's retention (check
  ``tombstones.E040``): a tombstone's rejections outlive it.

A job's age is counted from its finish. An unfinished job (queued, running, retry_wait, paused)
is never removed. Nothing else reads a finished row: a lane is held by its unfinished jobs only
(:mod:`.queries`' ``holders_in_lane``, ``ahead``, ``behind``), the sweep and the claim look at
unfinished jobs, ``purge_tombstones`` at unfinished references. So a finished job placed after an
unfinished one of its lane (cancelled by staff behind a paused head) is needed by no one either.

The purge works in batches, each its own short transaction: the oldest jobs of one status,
chosen on the ``(status, finished_at)`` index, deleted with their events (the roll-up,
:class:`~.models.OutcomeRollup`, counted them as they finished, and keeps the dashboard's charts
whole and the outcome totals growing). A batch slower
than a target halves the batch size and pauses (River's job cleaner does the same).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import router
from django.db.models import Count, Q
from django.utils import timezone

from ..conf import tombstone_settings
from .cluster import task_seconds
from .ledger import rollup
from .ledger.purge import purge_batch
from .models import Job, JobEvent, OutcomeRollup
from .states import UNFINISHED, Status

logger = logging.getLogger("tombstones")

JOBS = "jobs"
AUDIT = "audit"
# Each final status and how long it is kept.
KINDS: dict[str, tuple[str, ...]] = {
    JOBS: (Status.SUCCEEDED, Status.CANCELLED, Status.EXPIRED),
    AUDIT: (Status.REJECTED, Status.FAILED, Status.UNCERTAIN, Status.SUPERSEDED, Status.ESCALATED),
}

DEFAULT_BATCH = 5000
MAX_BATCH = 10000  # SQLite takes at most 32766 parameters in one statement
MIN_BATCH = 100  # a slow batch halves the size down to this, not below
TARGET_SECONDS = 1.0  # a batch slower than this halves the next ones
PAUSE_SECONDS = 0.5  # and the purge pauses that long after it
GROW_AFTER = 5  # fast batches in a row before the size doubles back (up to the one asked for)
# The roll-up is kept as long as the audit trail, and never less than the dashboard's charts
# (14 days) need.
ROLLUP_AT_LEAST = timedelta(days=31)

PURGE_TASK = "tombstones.worker.run_purge"
SCHEDULE_NAME = "tombstones.purge_jobs"


def kind_of(status: str) -> str:
    """``jobs`` or ``audit``: which retention a job of ``status`` is kept for."""
    for kind, statuses in KINDS.items():
        if status in statuses:
            return kind
    raise ValueError(f"{status!r} is not a final status: unfinished jobs are never purged.")


def retention(kind: str) -> timedelta:
    """How long a finished job of ``kind`` is kept (its setting)."""
    if kind == JOBS:
        return tombstone_settings.JOB_RETENTION
    if kind == AUDIT:
        return tombstone_settings.AUDIT_RETENTION
    raise ValueError(f"Unknown kind {kind!r}: {JOBS!r} or {AUDIT!r}.")


def horizon(kind: str, now: datetime | None = None) -> datetime:
    """The oldest finish that ``purge_jobs`` keeps for jobs of ``kind`` (``jobs`` or ``audit``,
    or a final status): what finished before it may be gone, e.g. the rejection log goes back to
    ``horizon("audit")``. Jobs older than it stay until the purge runs."""
    if kind not in KINDS:
        kind = kind_of(kind)
    return (now or timezone.now()) - retention(kind)


def cutoffs(now: datetime) -> dict[str, datetime]:
    return {kind: horizon(kind, now) for kind in KINDS}


def rollup_horizon(now: datetime) -> datetime:
    return now - max(tombstone_settings.AUDIT_RETENTION, ROLLUP_AT_LEAST)


@dataclass
class Plan:
    """What a purge at ``now`` would remove and what it keeps, and why (counts)."""

    now: datetime
    cutoffs: dict[str, datetime]
    removable: dict[str, int]  # per final status: finished before its kind's cutoff
    events: int  # the removable jobs' events
    young: dict[str, int]  # per kind: finished since the cutoff
    unfinished: int
    no_finish: int  # a final status without finished_at (hand-edited rows): never aged
    rollups: int  # roll-up periods past their own horizon (to be summed into the totals)

    @property
    def total(self) -> int:
        return sum(self.removable.values())

    def by_kind(self, kind: str) -> int:
        return sum(self.removable.get(s, 0) for s in KINDS[kind])


def plan(using: str | None = None, now: datetime | None = None) -> Plan:
    """Count what a purge at ``now`` removes and keeps: one pass over the job index, one count
    of the removable jobs' events."""
    db = using or router.db_for_write(Job)
    now = now or timezone.now()
    cut = cutoffs(now)
    old = Q()
    for kind, statuses in KINDS.items():
        old |= Q(status__in=statuses, finished_at__lt=cut[kind])
    rows = (
        Job.objects.using(db)
        .values_list("status")
        .annotate(
            # Columns of the (status, finished_at) index: PostgreSQL can count on it alone.
            n=Count("status"),
            old=Count("status", filter=old),
            no_finish=Count("status", filter=Q(finished_at__isnull=True)),
        )
        .order_by()
    )
    removable: dict[str, int] = {}
    young = dict.fromkeys(KINDS, 0)
    unfinished = no_finish = 0
    for status, n, n_old, n_no_finish in rows:
        if status in UNFINISHED:
            unfinished += n
            continue
        if n_old:
            removable[status] = n_old
        no_finish += n_no_finish
        if status in KINDS[JOBS] or status in KINDS[AUDIT]:
            young[kind_of(status)] += n - n_old - n_no_finish
    events = JobEvent.objects.using(db).filter(job__in=Job.objects.using(db).filter(old)).count()
    rollups = (
        OutcomeRollup.objects.using(db)
        .filter(period__lt=rollup_horizon(now), period__gt=rollup.EPOCH)
        .values("period")
        .distinct()
        .count()
    )
    return Plan(now, cut, removable, events, young, unfinished, no_finish, rollups)


@dataclass
class Purged:
    """What a purge removed."""

    jobs: dict[str, int] = field(default_factory=dict)  # per status
    events: int = 0
    batches: int = 0
    slow_batches: int = 0  # batches over TARGET_SECONDS (each halved the size and paused)
    smallest_batch: int = 0  # the smallest batch size it came down to
    rollups: int = 0  # roll-up periods summed into the totals (at rollup.EPOCH)
    done: bool = True  # False: it stopped at its deadline with jobs left to remove

    @property
    def total(self) -> int:
        return sum(self.jobs.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.total,
            "by_status": dict(self.jobs),
            "events": self.events,
            "batches": self.batches,
            "slow_batches": self.slow_batches,
            "rollups": self.rollups,
            "done": self.done,
        }


def purge(
    using: str | None = None,
    *,
    now: datetime | None = None,
    batch_size: int = DEFAULT_BATCH,
    seconds: float | None = None,
    target: float = TARGET_SECONDS,
    pause: float = PAUSE_SECONDS,
    min_batch: int = MIN_BATCH,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Purged:
    """Remove the finished jobs past their retention at ``now``, with their events, in batches
    of at most ``batch_size`` jobs; after ``seconds``, stop at the end of a batch (one runs at
    least, so that a run always makes progress)."""
    db = using or router.db_for_write(Job)
    now = now or timezone.now()
    cut = cutoffs(now)
    deadline = clock() + seconds if seconds is not None else None
    floor = min(min_batch, batch_size)
    result = Purged(smallest_batch=batch_size)
    size, fast = batch_size, 0
    for kind, statuses in KINDS.items():
        for status in statuses:
            left = True
            while left:
                asked, started = size, clock()
                jobs, events = purge_batch(db, status, cut[kind], asked)
                took = clock() - started
                left = jobs == asked  # fewer: none left (or only rows another transaction holds)
                if jobs:
                    result.batches += 1
                    result.jobs[status] = result.jobs.get(status, 0) + jobs
                    result.events += events
                if took > target:
                    result.slow_batches += 1
                    size, fast = max(size // 2, floor), 0
                    result.smallest_batch = min(result.smallest_batch, size)
                    logger.info(
                        "purge_jobs: a batch took %.2f s; the next ones take %d jobs",
                        took,
                        size,
                        extra={"tombstones": {"seconds": took, "batch_size": size}},
                    )
                    sleep(pause)
                else:
                    fast += 1
                    if fast >= GROW_AFTER and size < batch_size:
                        size, fast = min(size * 2, batch_size), 0
                if deadline is not None and clock() >= deadline:
                    result.done = not left and _nothing_left(db, cut)
                    return result
    result.rollups = rollup.prune(rollup_horizon(now), db)
    return result


def _nothing_left(db: str, cut: dict[str, datetime]) -> bool:
    return not any(
        Job.objects.using(db).filter(status__in=statuses, finished_at__lt=cut[kind]).exists()
        for kind, statuses in KINDS.items()
    )


def run_purge() -> dict[str, Any]:
    """The daily schedule's task: purge within half of django-q2's timeout, and hand what is
    left to another message (as a wake-up does with its budget)."""
    purged = purge(batch_size=DEFAULT_BATCH, seconds=task_seconds())
    result = purged.as_dict()
    result["continued"] = False
    if not purged.done:
        result["continued"] = _continue() is not None
    return result


def _continue() -> str | None:
    from django_q.tasks import async_task

    from .wakeups import broker

    options = {"group": "tombstones", **tombstone_settings.Q_OPTIONS}
    return async_task(PURGE_TASK, broker=broker(), **options)


def install_schedule(**kwargs: Any) -> None:
    """post_migrate receiver: create or update the daily django-q2 schedule of the purge, on the
    cluster the jobs go to (as the sweep's, :func:`.engine.sweep.install_schedule`)."""
    from django_q.models import Schedule

    cluster = tombstone_settings.Q_OPTIONS.get("cluster") or None
    Schedule.objects.update_or_create(
        name=SCHEDULE_NAME,
        defaults={
            "func": PURGE_TASK,
            "schedule_type": Schedule.DAILY,
            "repeats": -1,
            "cluster": str(cluster) if cluster is not None else None,
        },
    )
