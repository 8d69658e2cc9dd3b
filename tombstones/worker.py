"""The django-q2 task: run one job through its phases, then wake the next job of its lane.

Thin on purpose: the phases live in :mod:`tombstones.phases`.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import Q, Value
from django.db.models.functions import Now

from . import batch, ledger, phases
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
        if not tombstone_settings.COALESCE_WAKES:
            # Every job has its message: the named job runs through the classic phases (and its
            # lane's next jobs), leaving other lanes' heads to their messages, in parallel.
            return run_job(job_id)
        # Coalesced: one message serves many internal jobs, claimed in batches (the fast path),
        # the named one among them when it is a due internal lane head; otherwise (external, not
        # due, another worker's) it takes the classic path after the batches.
        carried = batch.pump()
        mine = next((o for o in carried if o.job_id == job_id), None)
        if mine is not None:
            result: dict[str, Any] = {**mine.as_dict(), "claimed": True, "drained": 0}
        else:
            result = run_job(job_id)
        others = [o for o in carried if o is not mine]
        if others:
            result["carried"] = [[o.job_id, str(o.status), str(o.reason)] for o in others]
        return result
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
    drained = 0
    if outcome.status in Job.TERMINAL:
        drained = _drain(attempt.job.lane, using)
    return {**outcome.as_dict(), "claimed": True, "drained": drained}


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
        if phases.run_claimed(attempt).status not in Job.TERMINAL:
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


def carried_statuses(result: Any) -> list[tuple[Any, str]]:
    """(job id, status) of every job a worker task ran: the named one and those it carried."""
    if not isinstance(result, dict):
        return []
    found = []
    if result.get("claimed"):
        found.append((result.get("job"), str(result.get("status"))))
    found += [(row[0], str(row[1])) for row in result.get("carried", ()) if len(row) >= 2]
    return found


def mark_q_task(sender: Any, task: dict[str, Any], **kwargs: Any) -> None:
    """django-q2 ``post_execute_in_worker`` receiver: keep its task table honest.

    A task that carried any job not ending in success is stored as a failure; a wake-up that ran
    nothing (a duplicate or blocked-lane message) is not stored at all.
    """
    func = task.get("func")
    if func != "tombstones.worker.run" and func is not run:
        return
    if not task.get("success"):
        return
    statuses = carried_statuses(task.get("result"))
    if not statuses:
        task["save"] = False
    elif any(status not in Q_SUCCESS for _, status in statuses):
        task["success"] = False
