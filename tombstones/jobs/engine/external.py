"""External calls: check → sending (committed) → call → sent → check again.

An external job runs alone, outside any group: its call cannot be rolled back, so the ledger
says "sending" (committed) before it, and an outcome the call leaves unknown is ``uncertain``,
never repeated by itself.
"""

from __future__ import annotations

from typing import cast

from django.db.models import Exists, Q

from ...exceptions import TransientError
from ...records import fencing
from ...records.fencing import Fence, Observation, State
from ...signals import job_checked, send_hook
from .. import ledger
from ..ledger import Outcome
from ..models import Job
from ..registry import Handler, registered
from .alarms import Alarms
from .attempt import Attempt, Reason, Status, Step, error_class, error_trace, record_alone
from .check import check_all
from .failures import log_failure, rejection, retry


def act_external(attempt: Attempt, *, alarms: Alarms) -> Outcome | None:
    """check → sending (committed) → call → sent → check again. Uncertain is never repeated."""
    claim, job = attempt.claim, attempt.job
    if not claim.begin(job.pk):
        attempt.lose()  # given back while a slow job ran: another worker's now
        return None
    check_all([attempt])
    if attempt.stop is not None:
        return record_alone(attempt, attempt.stop, alarms)
    attempt.step = Step.RUNNING  # from here a crash is its own (its call may have gone out)
    handler, record = cast(Handler, attempt.handler), attempt.record
    if record is None:  # a plain job: sending, the call, sent; no record to check again
        return _send_plain(attempt, handler, alarms)
    # Its generation, any version (the check refused a job without a fence).
    fence = Fence(type(record), record.pk, cast(int, job.generation))
    same = fence.rows(claim.using, live=not handler.accepts_tombstones)
    if not ledger.mark_sending(claim, job, Exists(same), attempt.events):
        seen = fencing.observe(fence, using=claim.using)
        if seen.state in (State.LIVE, State.STALE):
            attempt.lose()  # the lease is no longer ours
            return None
        return record_alone(attempt, rejection(attempt, seen), alarms)
    attempt.events = []
    failed = _call(attempt, handler, erase_params=record.deleted_at is not None)
    if failed is not None:
        return record_alone(attempt, failed, alarms)
    ledger.mark_sent(claim, job)
    return record_alone(attempt, _after_sending(attempt, handler, fence), alarms)


def _send_plain(attempt: Attempt, handler: Handler, alarms: Alarms) -> Outcome | None:
    """A plain job's call: sending (committed), the call, sent. Uncertain is never repeated."""
    claim, job = attempt.claim, attempt.job
    if not ledger.mark_sending(claim, job, Q(), attempt.events):
        attempt.lose()  # the lease is no longer ours
        return None
    attempt.events = []
    failed = _call(attempt, handler, erase_params=False)
    if failed is not None:
        return record_alone(attempt, failed, alarms)
    ledger.mark_sent(claim, job)
    return record_alone(attempt, attempt.end(Status.SUCCEEDED), alarms)


def _call(attempt: Attempt, handler: Handler, *, erase_params: bool) -> Outcome | None:
    """The handler's call once 'sending' committed: None when it returned, else the outcome
    (a transient error is retried; any other leaves the outcome unknown)."""
    claim, job = attempt.claim, attempt.job
    ctx = attempt.context(attempt.record)
    try:
        send_hook(job_checked, job)
        handler.func(ctx)
    except TransientError as exc:
        # The handler states nothing was delivered (e.g. connection refused): safe to retry.
        ledger.clear_sending(claim, job)
        log_failure(attempt, exc, "retried")
        return retry(attempt, Reason.TRANSIENT, error_class(exc), exc)
    except Exception as exc:  # noqa: BLE001 - after sending, any error leaves the outcome unknown
        log_failure(attempt, exc, "uncertain")
        return attempt.end(
            Status.UNCERTAIN,
            Reason.OUTCOME_UNKNOWN,
            error_class=error_class(exc),
            error_trace=error_trace(exc),
            erase_params=erase_params,
        )
    return None


def _after_sending(attempt: Attempt, handler: Handler, fence: Fence) -> Outcome:
    """The record read again once the call went out: was it still the job's?"""
    seen = fencing.observe(fence, using=attempt.claim.using)
    fine = (State.LIVE, State.TOMBSTONE) if handler.accepts_tombstones else (State.LIVE,)
    found = (seen.generation, seen.version)
    if seen.state not in fine:
        # Deleted or re-created during the call: what landed is unknown. Never repeated; staff
        # decide, unless a later job of the lane will send the record's newer state anyway.
        status = Status.SUPERSEDED if _overtaken(attempt.job, seen) else Status.UNCERTAIN
        return attempt.end(status, Reason.DELETED_DURING_SEND, found=found, erase_params=True)
    return attempt.end(Status.SUCCEEDED, found=found, erase_params=seen.state == State.TOMBSTONE)


def _overtaken(job: Job, seen: Observation) -> bool:
    """A later unfinished external job of the lane, for this record, will send what the record
    became: it carries the record's current generation, and, when the record is now a
    tombstone, its handler runs on tombstones (any other job would be rejected, sending
    nothing)."""
    if seen.state == State.MISSING or seen.generation is None:
        return False
    later = Q(queued_at__gt=job.queued_at) | Q(queued_at=job.queued_at, id__gt=job.pk)
    candidates = (
        Job.objects.using(job._state.db)
        .unfinished()
        .filter(later, lane=job.lane, external=True, generation=seen.generation)
        .for_record(job.content_type_id, job.object_id)
    )
    if seen.deleted:
        runs_on_tombstones = [n for n, h in registered().items() if h.accepts_tombstones]
        candidates = candidates.filter(handler__in=runs_on_tombstones)
    return candidates.exists()
