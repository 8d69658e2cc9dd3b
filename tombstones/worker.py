"""The django-q2 task: run one job through its phases, then wake the next job of its lane.

Thin on purpose: the phases live in :mod:`tombstones.phases`.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import Q, Value
from django.db.models.functions import Now

from . import ledger, phases
from .conf import tombstone_settings
from .dispatch import wake
from .models import Job

# Statuses after which the django-q2 task is recorded as a success; anything else is stored as
# a failure, so a rejected job never shows up as a success in django-q2's own tables.
Q_SUCCESS = frozenset({Job.Status.SUCCEEDED, Job.Status.QUEUED, Job.Status.RUNNING})


def run(job_id: int) -> dict[str, Any]:
    """Entry point called by django-q2 with the job id (the message carries nothing else)."""
    _close_old_connections()
    try:
        return run_job(job_id)
    finally:
        _close_old_connections()


def _close_old_connections() -> None:
    # As Django does around a request; never inside an open transaction (sync mode, tests).
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def run_job(job_id: int, *, using: str | None = None) -> dict[str, Any]:
    attempt = phases.claim(job_id, using=using)
    if attempt is None:
        return _not_claimed(job_id, using)
    outcome = phases.run_claimed(attempt)
    if outcome.status in Job.TERMINAL:
        wake_next(attempt.job.lane, using)
    return {**outcome.as_dict(), "claimed": True}


def _not_claimed(job_id: int, using: str | None) -> dict[str, Any]:
    job = Job.objects.using(using).filter(pk=job_id).first()
    if job is None:
        return {"job": job_id, "status": "missing", "reason": "", "claimed": False}
    if job.status in Job.CLAIMABLE:
        _expire_if_old(job)
    return {"job": job_id, "status": str(job.status), "reason": str(job.reason), "claimed": False}


def _expire_if_old(job: Job) -> None:
    too_old = Q(created_at__lt=Now() - Value(tombstone_settings.JOB_MAX_AGE))
    if ledger.transition(
        job,
        Job.Status.EXPIRED,
        Job.Reason.QUEUE_EXPIRED,
        from_status=tuple(Job.CLAIMABLE),
        extra_filter=too_old,
    ):
        wake_next(job.lane, job._state.db)


def wake_next(lane: str, using: str | None) -> None:
    """Wake the new head of a lane whose earlier message was consumed while it waited."""
    head = (
        Job.objects.using(using)
        .filter(lane=lane, status__in=Job.UNFINISHED)
        .order_by("id")
        .values_list("id", "status")
        .first()
    )
    if head is not None and head[1] == Job.Status.QUEUED:
        wake(head[0])


def mark_q_task(sender: Any, task: dict[str, Any], **kwargs: Any) -> None:
    """django-q2 ``post_execute_in_worker`` receiver: store a non-success job as a failed task."""
    func = task.get("func")
    if func != "tombstones.worker.run" and func is not run:
        return
    result = task.get("result")
    if task.get("success") and isinstance(result, dict) and result.get("status") not in Q_SUCCESS:
        task["success"] = False
