"""The purge's statements: one batch of finished jobs removed with their events (the roll-up,
:mod:`.rollup`, counted them as they finished).

The policy (which statuses, how old, how many at once) is :mod:`tombstones.jobs.retention`'s.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from ..models import Job, JobEvent


def oldest_finished(db: str, status: str, before: datetime, limit: int) -> QuerySet[Job, Any]:
    """The ids of the ``limit`` oldest jobs of ``status`` finished before
    ``before``, locked (on the ``tombstones_job_finished`` index)."""
    return (
        Job.objects.using(db)
        .filter(status=status, finished_at__lt=before)
        .order_by("finished_at")
        .select_for_update(skip_locked=True)
        .values_list("id", flat=True)[:limit]
    )


def purge_batch(db: str, status: str, before: datetime, limit: int) -> tuple[int, int]:
    """Remove up to ``limit`` of the jobs of ``status`` that finished before ``before`` (the
    oldest first) and their events, in one short transaction. The roll-up counted them when they
    finished: nothing is counted here and nothing taken away.

    The rows are locked as they are chosen (``SKIP LOCKED`` on PostgreSQL: a row a staff action
    or another purge holds is left for the next run). Returns (jobs removed, events removed).
    """
    with transaction.atomic(using=db):
        ids = list(oldest_finished(db, status, before, limit))
        if not ids:
            return 0, 0
        # Plain DELETEs: nothing listens for these rows' deletion, and the collector would load
        # every job (params included) to find the events deleted just before.
        events = JobEvent.objects.using(db).filter(job_id__in=ids)._raw_delete(db)
        jobs = Job.objects.using(db).filter(id__in=ids)._raw_delete(db)
    return jobs, events
