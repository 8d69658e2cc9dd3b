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
from .signals import job_checked, job_claimed

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
    outcome = _run_claimed(attempt)
    drained = 0
    if outcome.status in Job.TERMINAL:
        drained = _drain(attempt.job.lane, using)
    return {**outcome.as_dict(), "claimed": True, "drained": drained}


def _run_claimed(attempt: phases.Attempt) -> phases.Outcome:
    """check then act (as phases.run_claimed), with the worker's hook signals in between."""
    job_claimed.send(sender=Job, job=attempt.job)
    stopped = phases.check(attempt)
    if stopped is not None:
        return stopped
    job_checked.send(sender=Job, job=attempt.job)
    return phases.act(attempt)


def _drain(lane: str, using: str | None) -> int:
    """Run the lane's next heads in this task (up to TOMBSTONES_LANE_DRAIN jobs in all).

    Saves a broker round trip per job of a busy lane. Stops when the lane is empty, when its head
    is not ours to claim (another worker has it, or it is not due), or when a job holds the lane
    (retry_wait, paused); a lane handed back with a queued head gets a fresh message.
    """
    ran = 0
    for _ in range(tombstone_settings.LANE_DRAIN - 1):
        head = _queued_head(lane, using)
        if head is None:
            return ran
        attempt = phases.claim(head, using=using)
        if attempt is None:
            break
        ran += 1
        if _run_claimed(attempt).status not in Job.TERMINAL:
            return ran
    wake_next(lane, using)
    return ran


def _queued_head(lane: str, using: str | None) -> int | None:
    head = (
        Job.objects.using(using)
        .filter(lane=lane, status__in=Job.UNFINISHED)
        .order_by("id")
        .values_list("id", "status")
        .first()
    )
    if head is not None and head[1] == Job.Status.QUEUED:
        return int(head[0])
    return None


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
    head = _queued_head(lane, using)
    if head is not None:
        wake(head)


def mark_q_task(sender: Any, task: dict[str, Any], **kwargs: Any) -> None:
    """django-q2 ``post_execute_in_worker`` receiver: store a non-success job as a failed task."""
    func = task.get("func")
    if func != "tombstones.worker.run" and func is not run:
        return
    result = task.get("result")
    if task.get("success") and isinstance(result, dict) and result.get("status") not in Q_SUCCESS:
        task["success"] = False
