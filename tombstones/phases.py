"""The worker's phases for one job: claim → check → act-and-record.

The django-q2 task (:mod:`tombstones.worker`) runs them back to back; the race fixture
(:mod:`tombstones.testing`) drives the very same functions one step at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Exists
from django.db.models.functions import Now

from . import alarms, fencing, ledger
from .conf import tombstone_settings
from .context import HandlerContext
from .exceptions import TransientError, UnknownHandler
from .fencing import State
from .models import Job
from .registry import Handler, get_handler
from .signals import job_checked, job_claimed

Status = Job.Status
Reason = Job.Reason

# Exceptions that mean "temporary, nothing was written or sent": retried with backoff.
TRANSIENT = (TransientError, TimeoutError, ConnectionError)


@dataclass
class Outcome:
    job_id: int
    status: str
    reason: str = ""
    rereads: int = 0
    writes: int = 0

    def as_dict(self) -> dict[str, Any]:
        # Plain strings: this is what django-q2 stores in its task table.
        return {"job": self.job_id, "status": str(self.status), "reason": str(self.reason)}


@dataclass
class Attempt:
    """A claimed job on its way through the phases."""

    claim: ledger.Claim
    handler: Handler | None = None
    record: Any = None
    outcome: Outcome | None = None
    events: list[str] = field(default_factory=list)

    @property
    def job(self) -> Job:
        return self.claim.job


def claim(job_id: int, *, using: str | None = None) -> Attempt | None:
    """Phase 1: take the lease (conditional UPDATE in database time)."""
    taken = ledger.claim(job_id, using=using)
    return Attempt(claim=taken) if taken else None


def _end(
    attempt: Attempt,
    status: str,
    reason: str = Reason.NONE,
    *,
    seen: fencing.Observation | None = None,
    **kwargs: Any,
) -> Outcome:
    found = (seen.generation, seen.version) if seen else (None, None)
    ledger.finish(attempt.claim, status, reason, found=found, **kwargs)
    attempt.outcome = Outcome(attempt.job.pk, status, reason, attempt.job.rereads)
    return attempt.outcome


def _reject_for(attempt: Attempt, seen: fencing.Observation) -> Outcome:
    """The outcome for a record that is not live at the job's generation."""
    if seen.state == State.TOMBSTONE:
        return _end(attempt, Status.REJECTED, Reason.SOURCE_DELETED, seen=seen)
    if seen.state == State.GENERATION_CHANGED:
        return _end(attempt, Status.REJECTED, Reason.GENERATION_CHANGED, seen=seen)
    return _end(attempt, Status.ESCALATED, Reason.RECORD_MISSING, seen=seen)


def _retry(attempt: Attempt, reason: str, error_class: str = "") -> Outcome:
    job = attempt.job
    if job.attempts >= tombstone_settings.MAX_ATTEMPTS:
        return _end(attempt, Status.FAILED, Reason.RETRIES_EXHAUSTED, error_class=error_class)
    delay = tombstone_settings.backoff(job.attempts)
    outcome = _end(
        attempt,
        Status.RETRY_WAIT,
        reason,
        run_after=Now() + _interval(delay),
        error_class=error_class,
    )
    job_id = job.pk
    # No message waits for a retry: this worker rings for it when the backoff ends.
    transaction.on_commit(lambda: alarms.wake_when_due(job_id, delay), using=job._state.db)
    return outcome


def _interval(delay: Any) -> Any:
    from django.db.models import Value

    return Value(delay)


def check(attempt: Attempt) -> Outcome | None:
    """Phase 2: stop conditions, then ONE read of the record through all rows.

    Returns the outcome when the job must not act, None when it may.
    """
    job = attempt.job
    if not job.is_fenced:
        return _end(attempt, Status.ESCALATED, Reason.MISSING_FENCE)
    try:
        attempt.handler = get_handler(job.handler)
    except UnknownHandler:
        return _end(attempt, Status.ESCALATED, Reason.HANDLER_UNKNOWN)
    model = job.content_type.model_class()
    if model is None:
        return _end(attempt, Status.ESCALATED, Reason.RECORD_MISSING)
    try:
        record = model.all_objects.using(job._state.db).filter(pk=job.object_id).first()  # type: ignore[attr-defined]
    except DatabaseError:
        # Unknown state is never assumed live.
        return _end(attempt, Status.PAUSED, Reason.TOMBSTONE_UNREADABLE)
    if record is None:
        return _end(attempt, Status.ESCALATED, Reason.RECORD_MISSING)
    seen = fencing.Observation(State.LIVE, record.generation, record.version)
    if record.generation != job.generation:
        return _reject_for(attempt, fencing.Observation(State.GENERATION_CHANGED, *_gv(record)))
    if record.deleted_at is not None and not attempt.handler.accepts_tombstones:
        return _reject_for(attempt, fencing.Observation(State.TOMBSTONE, *_gv(record)))
    attempt.record = record
    ledger.add_event(
        job, "checked", found=(seen.generation, seen.version), worker=attempt.claim.worker
    )
    return None


def _gv(record: Any) -> tuple[int, int]:
    return record.generation, record.version


def act(attempt: Attempt) -> Outcome:
    """Phase 3: run the handler; its fenced writes and the outcome commit in ONE transaction."""
    if attempt.handler is None or attempt.record is None:
        raise RuntimeError("act() runs only after check() let the job through.")
    if attempt.handler.external:
        return _act_external(attempt)
    job = attempt.job
    db = job._state.db
    while True:
        ctx = HandlerContext(attempt.claim, attempt.record, job.rereads)
        try:
            with transaction.atomic(using=db):
                attempt.handler.func(ctx)
                if ctx.fence_lost is None:
                    outcome = _end(attempt, Status.SUCCEEDED, seen=_observed(attempt.record))
                    outcome.writes = ctx.writes
                    return outcome
                raise _FenceLost(ctx.fence_lost)
        except _FenceLost:
            pass  # rolled back: classify on a fresh read below
        except ledger.LeaseLost:
            return Outcome(job.pk, Status.RUNNING, Reason.LEASE_EXPIRED)
        except TRANSIENT as exc:
            return _retry(attempt, Reason.TRANSIENT, _cls(exc))
        except IntegrityError as exc:
            # A constraint the handler broke will break again: not temporary.
            return _end(attempt, Status.FAILED, Reason.HANDLER_ERROR, error_class=_cls(exc))
        except DatabaseError as exc:
            # Connection lost, lock timeout, serialization failure: rolled back, retried.
            return _retry(attempt, Reason.TRANSIENT, _cls(exc))
        except Exception as exc:  # noqa: BLE001 - any handler error fails the job, by class name
            return _end(attempt, Status.FAILED, Reason.HANDLER_ERROR, error_class=_cls(exc))
        decided = _after_conflict(attempt)
        if decided is not None:
            return decided


class _FenceLost(Exception):
    def __init__(self, seen: fencing.Observation) -> None:
        self.seen = seen


def _observed(record: Any) -> fencing.Observation:
    return fencing.Observation(State.LIVE, record.generation, record.version)


def _cls(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _after_conflict(attempt: Attempt) -> Outcome | None:
    """A fence failed: re-read and classify. None means 're-read and decide again'."""
    job = attempt.job
    try:
        seen = _reread(attempt)
    except DatabaseError:
        return _end(attempt, Status.PAUSED, Reason.TOMBSTONE_UNREADABLE)
    if seen.state not in (State.STALE, State.LIVE):
        return _reject_for(attempt, seen)
    if job.rereads >= tombstone_settings.STALE_REREADS:
        return _retry(attempt, Reason.STALE_VERSION)
    if not ledger.extend_lease(attempt.claim):
        # Taken over while we were rolled back: a zombie appends nothing, not even a re-read.
        return Outcome(job.pk, Status.RUNNING, Reason.LEASE_EXPIRED)
    job.rereads += 1
    ledger.add_event(
        job,
        "reread",
        Reason.STALE_VERSION,
        found=(seen.generation, seen.version),
        worker=attempt.claim.worker,
    )
    return None


def _reread(attempt: Attempt) -> fencing.Observation:
    job = attempt.job
    record = type(attempt.record).all_objects.using(job._state.db).filter(pk=job.object_id).first()
    if record is None:
        return fencing.Observation(State.MISSING)
    if record.generation != job.generation:
        return fencing.Observation(State.GENERATION_CHANGED, *_gv(record))
    if record.deleted_at is not None and not attempt.handler.accepts_tombstones:  # type: ignore[union-attr]
        return fencing.Observation(State.TOMBSTONE, *_gv(record))
    attempt.record = record
    return fencing.Observation(State.STALE, *_gv(record))


def _act_external(attempt: Attempt) -> Outcome:
    """sending (committed) → call → sent → check again. Uncertain is never repeated by itself."""
    job, record = attempt.job, attempt.record
    model = type(record)
    same = model.all_objects.using(job._state.db).filter(pk=record.pk, generation=job.generation)
    if not attempt.handler.accepts_tombstones:  # type: ignore[union-attr]
        same = same.filter(deleted_at__isnull=True)
    live = Exists(same)
    if not ledger.mark_sending(attempt.claim, live):
        seen = _reread(attempt)
        if seen.state in (State.STALE, State.LIVE):
            return Outcome(job.pk, Status.RUNNING, Reason.LEASE_EXPIRED)
        return _reject_for(attempt, seen)
    ledger.add_event(job, "sending", worker=attempt.claim.worker)
    ctx = HandlerContext(attempt.claim, record, job.rereads)
    try:
        attempt.handler.func(ctx)  # type: ignore[union-attr]
    except TransientError as exc:
        # The handler states nothing was delivered (e.g. connection refused): safe to retry.
        _clear_sending(attempt)
        return _retry(attempt, Reason.TRANSIENT, _cls(exc))
    except Exception as exc:  # noqa: BLE001 - after sending, any error leaves the outcome unknown
        return _end(attempt, Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN, error_class=_cls(exc))
    ledger.mark_sent(attempt.claim)
    ledger.add_event(job, "sent", worker=attempt.claim.worker)
    seen = fencing.observe(model, record.pk, job.generation, None, using=job._state.db)
    fine = (State.LIVE, State.TOMBSTONE) if attempt.handler.accepts_tombstones else (State.LIVE,)  # type: ignore[union-attr]
    if seen.state not in fine:
        return _end(attempt, Status.UNCERTAIN, Reason.DELETED_DURING_SEND, seen=seen)
    return _end(attempt, Status.SUCCEEDED, seen=seen)


def _clear_sending(attempt: Attempt) -> None:
    ledger._mine(attempt.claim).update(sending_at=None)


def run_claimed(attempt: Attempt) -> Outcome:
    """check then act, for a job already claimed, with the worker's hook signals in between."""
    try:
        job_claimed.send(sender=Job, job=attempt.job)
        stopped = check(attempt)
        if stopped is not None:
            return stopped
        job_checked.send(sender=Job, job=attempt.job)
        return act(attempt)
    except ledger.LeaseLost:
        # Taken over while we held it: write nothing more, report nothing as ours.
        return Outcome(attempt.job.pk, Status.RUNNING, Reason.LEASE_EXPIRED)
