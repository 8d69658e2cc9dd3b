"""The purge's statements: one batch of finished jobs removed with their events, counted in the
roll-up (:class:`~tombstones.jobs.models.OutcomeRollup`) in the same transaction.

The policy (which statuses, how old, how many at once) is :mod:`tombstones.jobs.retention`'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet

from ..models import Job, JobEvent, OutcomeRollup

PERIOD_MINUTES = 15


def period_of(moment: datetime) -> datetime:
    """The start of the quarter hour (UTC) ``moment`` falls in: the roll-up's period."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    minute = moment.minute - moment.minute % PERIOD_MINUTES
    return moment.replace(minute=minute, second=0, microsecond=0)


def oldest_finished(db: str, status: str, before: datetime, limit: int) -> QuerySet[Job, Any]:
    """(id, finished_at, reason) of the ``limit`` oldest jobs of ``status`` finished before
    ``before``, locked (on the ``tombstones_job_finished`` index)."""
    return (
        Job.objects.using(db)
        .filter(status=status, finished_at__lt=before)
        .order_by("finished_at")
        .select_for_update(skip_locked=True)
        .values_list("id", "finished_at", "reason")[:limit]
    )


def purge_batch(
    db: str, status: str, before: datetime, limit: int, count_since: datetime | None = None
) -> tuple[int, int]:
    """Remove up to ``limit`` of the jobs of ``status`` that finished before ``before`` (the
    oldest first) and their events; count those finished since ``count_since`` in the roll-up
    (older periods are past the roll-up's own retention). One short transaction.

    The rows are locked as they are chosen (``SKIP LOCKED`` on PostgreSQL: a row a staff action
    or another purge holds is left for the next run), so the roll-up counts exactly the rows
    deleted. Returns (jobs removed, events removed).
    """
    with transaction.atomic(using=db):
        rows = list(oldest_finished(db, status, before, limit))
        if not rows:
            return 0, 0
        ids = [pk for pk, _, _ in rows]
        # Plain DELETEs: nothing listens for these rows' deletion, and the collector would load
        # every job (params included) to find the events deleted just before.
        events = JobEvent.objects.using(db).filter(job_id__in=ids)._raw_delete(db)
        jobs = Job.objects.using(db).filter(id__in=ids)._raw_delete(db)
        counted = (
            (at, reason)
            for _, at, reason in rows
            if at is not None and (count_since is None or at >= count_since)
        )
        add_to_rollup(db, status, counted)
    return jobs, events


def add_to_rollup(db: str, status: str, finished: Iterable[tuple[datetime, str]]) -> None:
    """Add jobs of ``status`` ((finished_at, reason) each) to the roll-up's counts."""
    tally = Counter((period_of(at), reason) for at, reason in finished)
    for (period, reason), n in sorted(tally.items()):
        _increment(db, period, status, reason, n)


def _increment(db: str, period: datetime, status: str, reason: str, n: int) -> None:
    rollups = OutcomeRollup.objects.using(db)
    key = {"period": period, "status": status, "reason": reason}
    if rollups.filter(**key).update(jobs=F("jobs") + n):
        return
    try:
        with transaction.atomic(using=db):  # a savepoint: the batch goes on if it fails
            rollups.create(**key, jobs=n)
    except IntegrityError:  # a purge running beside this one created the row meanwhile
        rollups.filter(**key).update(jobs=F("jobs") + n)


def prune_rollup(db: str, before: datetime) -> int:
    """Remove the roll-up's periods that started before ``before``; returns how many."""
    return OutcomeRollup.objects.using(db).filter(period__lt=before)._raw_delete(db)
