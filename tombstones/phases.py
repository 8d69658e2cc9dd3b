"""The worker's phases for claimed jobs: claim → check → act-and-record.

Internal jobs act in groups: ONE transaction reads their records under a row lock (PostgreSQL
``FOR NO KEY UPDATE``; SQLite's write lock), checks each job against its record, runs the
handlers' fenced writes and records every outcome with one UPDATE. A delete or re-create of a
record waits for that commit, or lands before the read and rejects the job. When a handler
raises or loses its fence, the group rolls back and each of its jobs takes the same road alone.

The worker (:mod:`tombstones.runner`) runs these functions; the race fixture
(:mod:`tombstones.testing`) drives the very same ones one step at a time.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Exists, Q

from . import alarms, fencing, ledger
from .conf import tombstone_settings
from .context import HandlerContext
from .exceptions import LeaseLost, TransientError, UnknownHandler
from .fencing import State
from .ledger import Claim, Outcome
from .models import Job, JobEvent
from .registry import Handler, get_handler
from .signals import job_checked

logger = logging.getLogger("tombstones")

Status = Job.Status
Reason = Job.Reason
Event = JobEvent.Event

# Exceptions that mean "temporary, nothing was written or sent": retried with backoff.
TRANSIENT = (TransientError, TimeoutError, ConnectionError)
# A group's transaction closes once its handlers ran this long: on SQLite it holds the
# database's write lock, and the jobs not started yet may go to another worker.
GROUP_SECONDS = 0.2


@dataclass(eq=False)
class Attempt:
    """A claimed job on its way through the phases."""

    claim: Claim
    job: Job
    handler: Handler | None = None
    record: Any = None  # the record as last read
    outcome: Outcome | None = None
    lost: bool = False  # the lease was taken over: nothing more is written for it
    busy: bool = False  # its check or handler is running (a crash now is its own)
    checked: bool = False
    # Checked on its own (the race fixture's "start"): the next act writes against that read,
    # so that a change landing in between is caught by the fenced write itself.
    prechecked: bool = False
    events: list[JobEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.events.append(ledger.event_row(self.job, Event.CLAIMED, worker=self.claim.worker))

    @property
    def follower(self) -> bool:
        """Reserved behind its lane's head in the same claim (it stays ``queued`` until it ends)."""
        return self.job.status == Status.QUEUED

    @property
    def done(self) -> bool:
        return self.outcome is not None or self.lost

    def end(self, status: str, reason: str = Reason.NONE, **kwargs: Any) -> Outcome:
        """This attempt's outcome (not yet recorded), carrying its pending events."""
        events, self.events = self.events, []
        return Outcome(self.job, status, reason, events=events, **kwargs)


def claim(job_id: int, *, using: str | None = None) -> Attempt | None:
    """Phase 1 for one given job (the race fixture): take its lease, if it is claimable now."""
    taken = ledger.claim(1, ids=[job_id], using=using)
    if taken is None or not taken.jobs:
        return None
    return Attempt(taken, taken.jobs[0])


# --- check -----------------------------------------------------------------------------------

Records = dict[tuple[int, str], Any]


def read_records(jobs: Sequence[Job], *, lock: bool, using: str) -> Records:
    """One read per model of the jobs' records, tombstones included.

    ``lock``: inside the act transaction, rows locked in pk order (PostgreSQL ``FOR NO KEY
    UPDATE``: a concurrent delete or re-create waits for the commit; SQLite's transaction holds
    the write lock already).
    """
    wanted: dict[Any, set[str]] = defaultdict(set)
    for job in jobs:
        wanted[job.content_type].add(job.object_id)
    found: Records = {}
    for content_type, pks in wanted.items():
        model = content_type.model_class()
        if model is None or not hasattr(model, "all_objects"):
            continue
        rows = model.all_objects.using(using).filter(pk__in=pks)
        if lock and connections[using].features.has_select_for_update:
            rows = rows.select_for_update(no_key=True).order_by("pk")
        for record in rows:
            found[(content_type.pk, str(record.pk))] = record
    return found


def classify(attempt: Attempt, records: Records) -> Outcome | None:
    """Phase 2: the stop conditions, then the job against its record as read.

    Returns the outcome when the job must not act, None when it may (``attempt.record`` is then
    the record to act on). A record read at a newer version than the previous read is a re-read.
    """
    job = attempt.job
    if not job.is_fenced:
        return attempt.end(Status.ESCALATED, Reason.MISSING_FENCE)
    if getattr(job, "too_old", False):
        return attempt.end(Status.EXPIRED, Reason.QUEUE_EXPIRED)
    try:
        attempt.handler = get_handler(job.handler)
    except UnknownHandler:
        return attempt.end(Status.ESCALATED, Reason.HANDLER_UNKNOWN)
    record = records.get((job.content_type_id, job.object_id))
    if record is None:
        return attempt.end(Status.ESCALATED, Reason.RECORD_MISSING, erase_params=True)
    found = (record.generation, record.version)
    if record.generation != job.generation:
        return attempt.end(
            Status.REJECTED, Reason.GENERATION_CHANGED, found=found, erase_params=True
        )
    if record.deleted_at is not None and not attempt.handler.accepts_tombstones:
        return attempt.end(Status.REJECTED, Reason.SOURCE_DELETED, found=found, erase_params=True)
    previous, attempt.record = attempt.record, record
    if not attempt.checked:
        attempt.checked = True
        attempt.events.append(_event(attempt, Event.CHECKED, found=found))
    elif previous is not None and previous.version != record.version:
        return _reread(attempt, found)
    return None


def _reread(attempt: Attempt, found: ledger.Found) -> Outcome | None:
    """The record moved on (same generation, newer version): decide again, a bounded number of
    times, then back off."""
    job = attempt.job
    if job.rereads >= tombstone_settings.STALE_REREADS:
        return _retry(attempt, Reason.STALE_VERSION)
    job.rereads += 1
    attempt.events.append(_event(attempt, Event.REREAD, Reason.STALE_VERSION, found))
    return None


def check(attempt: Attempt) -> Outcome | None:
    """Phase 2 on its own (the race fixture's "start"): one read, no lock; a stop is recorded."""
    try:
        records = read_records([attempt.job], lock=False, using=attempt.claim.using)
    except DatabaseError:
        return _record_alone(attempt, attempt.end(Status.PAUSED, Reason.TOMBSTONE_UNREADABLE))
    stop = classify(attempt, records)
    if stop is not None:
        return _record_alone(attempt, stop)
    attempt.prechecked = True
    return None


# --- act -------------------------------------------------------------------------------------


class _Trouble(Exception):
    """A handler raised or lost its fence: its group rolls back."""

    def __init__(self, attempt: Attempt, error: Exception | None, seen: Any = None) -> None:
        self.attempt, self.error, self.seen = attempt, error, seen


def act(attempt: Attempt) -> Outcome | None:
    """Phase 3 for one job: the road a group of one takes (the race fixture's "write")."""
    if attempt.job.external:
        return act_external(attempt)
    act_group([attempt])
    return attempt.outcome


def act_group(attempts: Sequence[Attempt]) -> list[Attempt]:
    """Act on internal jobs in one transaction; returns those not started (the group was cut).

    Outcomes land on ``attempt.outcome``. A handler that raises or loses its fence rolls the
    group back: alone, its job is classified (retry, failure, re-read, rejection); with others,
    each job of the group takes this road alone.
    """
    try:
        return _act_once(attempts)
    except _Trouble as trouble:
        if len(attempts) > 1:
            held: set[str] = set()
            left: list[Attempt] = []
            for attempt in attempts:
                if attempt.follower and attempt.job.lane in held:
                    left.append(attempt)
                    continue
                if not attempt.done:
                    _act_alone(attempt)
                if attempt.outcome is None or attempt.outcome.status not in Job.TERMINAL:
                    held.add(attempt.job.lane)
            return left
        _after_trouble(trouble)
        if not attempts[0].done:  # a re-read: decide again on the fresh record
            _act_alone(attempts[0])
        return []
    except DatabaseError:
        # The records could not be read (or the outcome not written): state unknown, never
        # assumed live. The transaction rolled back; each job is paused on its own.
        for attempt in attempts:
            if not attempt.done:
                _record_alone(attempt, attempt.end(Status.PAUSED, Reason.TOMBSTONE_UNREADABLE))
        return []


def _act_alone(attempt: Attempt) -> None:
    for _ in range(tombstone_settings.STALE_REREADS + 2):
        try:
            _act_once([attempt])
        except _Trouble as trouble:
            _after_trouble(trouble)
        except DatabaseError:
            _record_alone(attempt, attempt.end(Status.PAUSED, Reason.TOMBSTONE_UNREADABLE))
        if attempt.done:
            return
    _record_alone(attempt, _retry(attempt, Reason.STALE_VERSION))  # cannot happen: bounded


def _act_once(attempts: Sequence[Attempt]) -> list[Attempt]:
    claim = attempts[0].claim
    db = claim.using
    outcomes: list[Outcome] = []
    decided: list[Attempt] = []
    rest: list[Attempt] = []
    started = time.monotonic()
    try:
        with transaction.atomic(using=db):
            for attempt in attempts:
                attempt.busy = len(attempts) == 1
            records = read_records([a.job for a in attempts], lock=True, using=db)
            held: set[str] = set()  # lanes whose job before stays unfinished: followers wait
            for index, attempt in enumerate(attempts):
                if attempt.follower and attempt.job.lane in held:
                    rest.append(attempt)  # its turn does not come: given back by the runner
                    continue
                attempt.busy = True
                stop = None if attempt.prechecked else classify(attempt, records)
                attempt.prechecked = False
                outcome = stop or _run_handler(attempt)
                attempt.busy = False
                outcomes.append(outcome)
                decided.append(attempt)
                if outcome.status not in Job.TERMINAL:
                    held.add(attempt.job.lane)
                if time.monotonic() - started > GROUP_SECONDS:
                    rest += attempts[index + 1 :]
                    break
            ledger.record(claim, outcomes)
    except LeaseLost:
        # Taken over while we held it (a zombie): our writes rolled back, nothing is ours.
        ids = [a.job.pk for a in attempts]
        logger.warning(
            "lease lost for job(s) %s: their writes were rolled back",
            ids,
            extra={"tombstones": {"job_ids": ids}},
        )
        for attempt in attempts:
            attempt.lost = True
        return []
    except _Trouble:
        # Rolled back: the decided jobs' events wait for their outcome again, and a record a
        # handler changed in memory is read afresh (not counted as a re-read).
        for attempt in decided:
            attempt.events = [e for o in outcomes if o.job is attempt.job for e in o.events]
        if len(attempts) > 1:
            for attempt in attempts:
                attempt.record = None
        raise
    for attempt, outcome in zip(decided, outcomes, strict=True):
        attempt.outcome = outcome
        if outcome.retry_in is not None:
            _ring_after_commit(outcome)
    return rest


def _run_handler(attempt: Attempt) -> Outcome:
    """Call the handler on the checked record; its writes are fenced on (generation, version)."""
    job_checked.send(sender=Job, job=attempt.job)
    ctx = HandlerContext(attempt.claim, attempt.job, attempt.record)
    try:
        attempt.handler.func(ctx)  # type: ignore[union-attr]
    except Exception as exc:  # classified by _after_trouble, outside the rollback
        raise _Trouble(attempt, exc) from exc
    if ctx.fence_lost is not None:
        raise _Trouble(attempt, None, ctx.fence_lost)
    record = attempt.record
    return attempt.end(
        Status.SUCCEEDED,
        found=(record.generation, record.version),
        writes=ctx.writes,
        erase_params=record.deleted_at is not None,
    )


def _after_trouble(trouble: _Trouble) -> None:
    """Alone, after the rollback: what the handler's error or lost fence means for its job."""
    attempt, exc = trouble.attempt, trouble.error
    if exc is None:
        _after_lost_fence(attempt)
    elif isinstance(exc, TRANSIENT):
        _record_alone(attempt, _retry(attempt, Reason.TRANSIENT, _cls(exc)))
    elif isinstance(exc, IntegrityError):
        # A constraint the handler broke will break again: not temporary.
        _record_alone(attempt, _failed(attempt, exc))
    elif isinstance(exc, DatabaseError):
        # Connection lost, lock timeout, serialization failure: rolled back, retried.
        _record_alone(attempt, _retry(attempt, Reason.TRANSIENT, _cls(exc)))
    else:
        _record_alone(attempt, _failed(attempt, exc))


def _after_lost_fence(attempt: Attempt) -> None:
    """A fenced write matched 0 rows: read again (no lock) and classify."""
    try:
        records = read_records([attempt.job], lock=False, using=attempt.claim.using)
    except DatabaseError:
        _record_alone(attempt, attempt.end(Status.PAUSED, Reason.TOMBSTONE_UNREADABLE))
        return
    previous = attempt.record
    stop = classify(attempt, records)
    same = attempt.record is not None and previous is not None
    if stop is None and same and attempt.record.version == previous.version:
        # The handler moved the record itself outside the context: treat as stale.
        stop = _reread(attempt, (previous.generation, previous.version))
    if stop is not None:
        _record_alone(attempt, stop)


def _failed(attempt: Attempt, exc: BaseException) -> Outcome:
    return attempt.end(Status.FAILED, Reason.HANDLER_ERROR, error_class=_cls(exc))


def _retry(attempt: Attempt, reason: str, error_class: str = "") -> Outcome:
    job = attempt.job
    if job.attempts >= tombstone_settings.MAX_ATTEMPTS:
        return attempt.end(Status.FAILED, Reason.RETRIES_EXHAUSTED, error_class=error_class)
    delay = tombstone_settings.backoff(job.attempts)
    return attempt.end(Status.RETRY_WAIT, reason, error_class=error_class, retry_in=delay)


def _record_alone(attempt: Attempt, outcome: Outcome) -> Outcome:
    """Record one outcome in a transaction of its own (after a rollback, or at the check)."""
    try:
        with transaction.atomic(using=attempt.claim.using):
            ledger.record(attempt.claim, [outcome])
    except LeaseLost:
        attempt.lost = True
        return outcome
    attempt.outcome = outcome
    if outcome.retry_in is not None:
        _ring_after_commit(outcome)
    return outcome


def _ring_after_commit(outcome: Outcome) -> None:
    # No message waits for a retry: this worker rings for it when the backoff ends.
    delay = outcome.retry_in
    if delay is not None:
        transaction.on_commit(lambda: alarms.ring_in(delay), using=outcome.job._state.db)


def _event(
    attempt: Attempt, event: str, reason: str = Reason.NONE, found: ledger.Found = (None, None)
) -> JobEvent:
    return ledger.event_row(attempt.job, event, reason, found, attempt.claim.worker)


def _cls(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


# --- external calls --------------------------------------------------------------------------


def act_external(attempt: Attempt) -> Outcome | None:
    """check → sending (committed) → call → sent → check again. Uncertain is never repeated."""
    claim, job = attempt.claim, attempt.job
    attempt.busy = True
    if attempt.record is None or not attempt.checked:
        stop = check(attempt)
        if stop is not None or attempt.done:
            attempt.busy = False
            return attempt.outcome
    handler, record = cast(Handler, attempt.handler), attempt.record
    model = type(record)
    same = model.all_objects.using(claim.using).filter(pk=record.pk, generation=job.generation)
    if not handler.accepts_tombstones:
        same = same.filter(deleted_at__isnull=True)
    if not ledger.mark_sending(claim, job, Exists(same), attempt.events):
        seen = fencing.observe(model, record.pk, job.generation, None, using=claim.using)
        if seen.state in (State.LIVE, State.STALE):
            attempt.lost = True  # the lease is no longer ours
            return None
        return _record_alone(attempt, _rejection(attempt, seen))
    attempt.events = []
    ctx = HandlerContext(claim, job, record)
    try:
        handler.func(ctx)
    except TransientError as exc:
        # The handler states nothing was delivered (e.g. connection refused): safe to retry.
        ledger.clear_sending(claim, job)
        return _record_alone(attempt, _retry(attempt, Reason.TRANSIENT, _cls(exc)))
    except Exception as exc:  # noqa: BLE001 - after sending, any error leaves the outcome unknown
        return _record_alone(
            attempt, attempt.end(Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN, error_class=_cls(exc))
        )
    ledger.mark_sent(claim, job)
    seen = fencing.observe(model, record.pk, job.generation, None, using=claim.using)
    fine = (State.LIVE, State.TOMBSTONE) if handler.accepts_tombstones else (State.LIVE,)
    found = (seen.generation, seen.version)
    if seen.state not in fine:
        # Deleted or re-created during the call: what landed is unknown. Never repeated; staff
        # decide, unless a later job of the lane will send the record's newer state anyway.
        status = Status.SUPERSEDED if _overtaken(job, seen) else Status.UNCERTAIN
        outcome = attempt.end(status, Reason.DELETED_DURING_SEND, found=found)
    else:
        outcome = attempt.end(
            Status.SUCCEEDED, found=found, erase_params=seen.state == State.TOMBSTONE
        )
    attempt.busy = False
    return _record_alone(attempt, outcome)


def _overtaken(job: Job, seen: fencing.Observation) -> bool:
    """A later unfinished external job of the lane, for this record, carries its newer state."""
    newer = Q(generation__gt=job.generation) | Q(generation=job.generation, version__gt=job.version)
    if seen.generation is not None:
        newer &= Q(generation__gte=seen.generation)
    later = Q(queued_at__gt=job.queued_at) | Q(queued_at=job.queued_at, id__gt=job.pk)
    return (
        Job.objects.using(job._state.db)
        .unfinished()
        .filter(later, newer, lane=job.lane, external=True)
        .for_record(job.content_type_id, job.object_id)
        .exists()
    )


def _rejection(attempt: Attempt, seen: fencing.Observation) -> Outcome:
    found = (seen.generation, seen.version)
    if seen.state == State.TOMBSTONE:
        reason = Reason.SOURCE_DELETED
    elif seen.state == State.GENERATION_CHANGED:
        reason = Reason.GENERATION_CHANGED
    else:
        return attempt.end(Status.ESCALATED, Reason.RECORD_MISSING, found=found, erase_params=True)
    return attempt.end(Status.REJECTED, reason, found=found, erase_params=True)
