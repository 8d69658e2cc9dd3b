"""The worker's phases for claimed jobs: claim → check → act-and-record.

- **Check**: one plain read per model of the jobs' records (no lock, outside the act's
  transaction) and the stop conditions: a job that must not act gets its outcome here.
- **Act and record**: internal jobs act in *groups* of ONE transaction. Each job runs in a
  savepoint of its own, on the record as the jobs before it left it (their updates carried
  forward, what only the database knows read back; read again after a write of the record's own
  table), so a failure, a lost fence or a crash rolls back that job alone and never another's
  finished work. The check holds nothing: the fence is the write (``ctx.update`` is the
  conditional UPDATE; ``ctx.write`` holds the source row from its write to the commit), so a
  delete or an edit landing while a handler runs is never kept waiting by it; the write then
  matches 0 rows and the job is rejected or re-reads. The group's outcomes are recorded with one
  UPDATE before it commits.

The worker (:mod:`tombstones.runner`) runs these functions; the race fixture
(:mod:`tombstones.testing`) drives the very same ones one step at a time: its "start" is the claim
and the check, its "write" the act.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Exists, Q
from django.db.transaction import TransactionManagementError

from ...conf import tombstone_settings
from ...exceptions import LeaseLost, TransientError, UnknownHandler
from ...records import fencing, rows
from ...records.fencing import State
from ...signals import job_checked, send_hook
from .. import ledger
from ..context import HandlerContext
from ..ledger import Claim, Outcome
from ..models import Job, JobEvent
from ..registry import Handler, get_handler, registered
from . import alarms

logger = logging.getLogger("tombstones")

Status = Job.Status
Reason = Job.Reason
Event = JobEvent.Event

# Exceptions that mean "temporary, nothing was written or sent": retried with backoff.
TRANSIENT = (TransientError, TimeoutError, ConnectionError)
# A group's transaction closes once its handlers ran this long: on SQLite it holds the
# database's write lock, and whatever a handler wrote stays locked until the commit.
GROUP_SECONDS = 0.2
# Jobs per group at most: each runs in a savepoint, and PostgreSQL keeps the first 64
# subtransactions of a transaction in shared memory (past that, every snapshot slows down).
GROUP_JOBS = 50


@dataclass(eq=False)
class Attempt:
    """A claimed job on its way through the phases."""

    claim: Claim
    job: Job
    handler: Handler | None = None
    record: Any = None  # the record as checked (or as the jobs before it in its group left it)
    stop: Outcome | None = None  # decided at the check: the job does not act
    outcome: Outcome | None = None  # recorded
    lost: bool = False  # no longer this claim's (taken over, or given back): nothing is written
    busy: bool = False  # its check or handler is running (a crash now is its own)
    checked: bool = False
    events: list[JobEvent] = field(default_factory=list)  # written with its outcome

    def __post_init__(self) -> None:
        row = ledger.event_row(self.job, Event.CLAIMED, worker=self.claim.worker)
        row.created_at = self.claim.claimed_at  # stamped at the claim, not at the outcome
        self.events.append(row)

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

    def event(
        self, event: str, reason: str = Reason.NONE, found: ledger.Found = (None, None)
    ) -> None:
        """A pending event, stamped now (the database's clock, as the claim read it)."""
        at = self.claim.db_now()
        self.events.append(ledger.event_row(self.job, event, reason, found, self.claim.worker, at))


def claim(job_id: int, *, using: str | None = None) -> Attempt | None:
    """Phase 1 for one given job (the race fixture): take its lease, if it is claimable now."""
    taken = ledger.claim(1, ids=[job_id], using=using)
    if taken is None or not taken.jobs:
        return None
    return Attempt(taken, taken.jobs[0])


# --- check -----------------------------------------------------------------------------------

Records = dict[tuple[int, str], Any]
# What read_records() finds for a job whose object_id is no value of its model's pk.
NOT_A_PK: Any = object()


def read_records(jobs: Sequence[Job], *, using: str) -> Records:
    """One plain read per model of the jobs' records, tombstones included (no lock).

    An object_id the model's pk cannot hold (a row written by hand) is left out of the read, so
    that its job alone fails (``NOT_A_PK``) and the others of the read run."""
    wanted: dict[Any, set[str]] = defaultdict(set)
    for job in jobs:
        wanted[job.content_type].add(job.object_id)
    found: Records = {}
    for content_type, pks in wanted.items():
        model = content_type.model_class()
        if model is None or not hasattr(model, "all_objects"):
            continue
        valid = {pk for pk in pks if rows.is_pk(model, pk, using)}
        found.update({(content_type.pk, pk): NOT_A_PK for pk in pks - valid})
        if valid:
            for record in model.all_objects.using(using).filter(pk__in=valid):
                found[(content_type.pk, str(record.pk))] = record
    return found


def check_all(attempts: Sequence[Attempt]) -> None:
    """Phase 2: read the records of the attempts not checked yet, and apply the stop conditions.

    A job that must not act gets ``attempt.stop`` (recorded with its group); the others get the
    record to act on and their ``checked`` event.
    """
    todo = [a for a in attempts if not a.checked and not a.done]
    if not todo:
        return
    # ``busy`` names the job a crash in here is charged to (the read: only when it is alone).
    for attempt in todo:
        attempt.checked = attempt.busy = True
        attempt.stop = _before_reading(attempt)
        attempt.busy = False
    readable = [a for a in todo if a.stop is None]
    if not readable:
        return
    readable[0].busy = len(readable) == 1  # stays set if the read raises anything else
    try:
        records = read_records([a.job for a in readable], using=todo[0].claim.using)
    except DatabaseError as exc:
        readable[0].busy = False
        for attempt in readable:
            attempt.stop = _unreadable(attempt, exc)
        return
    readable[0].busy = False
    for attempt in readable:
        record: Any = records.get(_key(attempt.job))
        attempt.stop = against(attempt, record)
        if attempt.stop is None:
            attempt.record = record  # against() let it through: the record exists
            attempt.event(Event.CHECKED, found=(record.generation, record.version))


def check(attempt: Attempt) -> Outcome | None:
    """Phase 2 on its own (the race fixture's "start"): the check; a stop is recorded at once."""
    check_all([attempt])
    if attempt.stop is not None:
        return _record_alone(attempt, attempt.stop)
    return None


def _before_reading(attempt: Attempt) -> Outcome | None:
    """The stop conditions that need no read of the record."""
    job = attempt.job
    if not job.is_fenced:
        return attempt.end(Status.ESCALATED, Reason.MISSING_FENCE, erase_params=True)
    too_old = bool(getattr(job, "too_old", False))
    try:
        attempt.handler = get_handler(job.handler)
    except UnknownHandler:
        if too_old:
            # No worker knew it for TOMBSTONES_JOB_MAX_AGE: not a deploy any more.
            return attempt.end(Status.ESCALATED, Reason.HANDLER_UNKNOWN, erase_params=True)
        return _park(attempt)
    if too_old:
        return attempt.end(Status.EXPIRED, Reason.QUEUE_EXPIRED, erase_params=True)
    return None


def _park(attempt: Attempt) -> Outcome:
    """A handler this worker does not know: a deploy in progress, most likely (new code on the
    web, old code here). The job waits, uncharged and holding its lane, for a worker that knows
    it; longer the longer nobody does."""
    job = attempt.job
    delay = tombstone_settings.unknown_handler_wait(job_age(attempt))
    logger.warning(
        "job %s: this worker has no handler %r; it waits %ss for a worker that has one. A deploy "
        "in progress needs nothing; otherwise register the handler (it is escalated after "
        "TOMBSTONES_JOB_MAX_AGE).",
        job.pk,
        job.handler,
        int(delay.total_seconds()),
        extra={"tombstones": {"job_id": job.pk, "handler": job.handler, "known": _known()}},
    )
    return attempt.end(Status.RETRY_WAIT, Reason.HANDLER_UNKNOWN, retry_in=delay, refund=True)


def _known() -> int:
    return len(registered())


def job_age(attempt: Attempt) -> float:
    """Seconds since the job was enqueued (the database's clock)."""
    created = attempt.job.created_at
    if created is None:
        return 0.0
    return max((attempt.claim.db_now() - created).total_seconds(), 0.0)


def against(attempt: Attempt, record: Any | None) -> Outcome | None:
    """The job against its record as read: None when it may act on it."""
    job = attempt.job
    if record is None:
        return attempt.end(Status.ESCALATED, Reason.RECORD_MISSING, erase_params=True)
    if record is NOT_A_PK:
        return attempt.end(Status.ESCALATED, Reason.OBJECT_ID_INVALID, erase_params=True)
    found = (record.generation, record.version)
    if record.generation != job.generation:
        return attempt.end(
            Status.REJECTED, Reason.GENERATION_CHANGED, found=found, erase_params=True
        )
    handler = cast(Handler, attempt.handler)
    if record.deleted_at is not None and not handler.accepts_tombstones:
        return attempt.end(Status.REJECTED, Reason.SOURCE_DELETED, found=found, erase_params=True)
    return None


def _unreadable(attempt: Attempt, exc: BaseException) -> Outcome:
    """The record could not be read: state unknown, never assumed live. Paused (resumed by the
    sweep), and like any other claim it counts against TOMBSTONES_MAX_ATTEMPTS."""
    if attempt.job.attempts >= tombstone_settings.MAX_ATTEMPTS:
        return attempt.end(
            Status.FAILED, Reason.RETRIES_EXHAUSTED, error_class=_cls(exc), erase_params=True
        )
    return attempt.end(Status.PAUSED, Reason.TOMBSTONE_UNREADABLE, error_class=_cls(exc))


def _key(job: Job) -> tuple[int, str]:
    return (job.content_type_id, job.object_id)


# --- act -------------------------------------------------------------------------------------


class _FenceLost(Exception):
    """A fenced write matched 0 rows: the job's savepoint rolls back."""


class _Broken(Exception):
    """The handler went on after a database error: its transaction can no longer commit."""

    def __init__(self, first: BaseException | None) -> None:
        self.first = first


class _Crash(Exception):
    """A handler raised a BaseException (SystemExit, KeyboardInterrupt): its savepoint rolled
    back; the group records what it decided, then the exception goes on."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


@dataclass
class _Group:
    """One act transaction."""

    started: float = field(default_factory=time.monotonic)
    # The records as the group's jobs left them (their update()s carried forward), and those
    # to read again (a job wrote the record's table otherwise, or they are unknown here).
    left: dict[tuple[int, str], Any] = field(default_factory=dict)
    unsure: set[tuple[int, str]] = field(default_factory=set)
    wrote: bool = False  # a job wrote: its rows stay locked until the commit

    def carry(self, attempt: Attempt, ctx: HandlerContext) -> None:
        """After a job's success: the record as it left it, for the next job of the record."""
        key = _key(attempt.job)
        if ctx.moved_record:
            self.unsure.add(key)
            self.left.pop(key, None)
            return
        record = copy.copy(attempt.record)  # as the job started: none of its own scribbles
        for name, value in ctx.applied:
            setattr(record, name, value)
        record.version = ctx.record.version
        self.left[key] = record
        self.unsure.discard(key)

    def closes_before(self, attempt: Attempt, decided: int) -> bool:
        if not decided:
            return False
        if decided >= GROUP_JOBS or time.monotonic() - self.started > GROUP_SECONDS:
            return True
        # What the jobs before wrote must not wait for a handler known to be slow.
        return self.wrote and handler_times.slow(attempt.job.handler)


class HandlerTimes:
    """How long each handler last ran in this process: a slow one runs in a group of its own."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def note(self, name: str, seconds: float) -> None:
        self._last[name] = seconds

    def slow(self, name: str) -> bool:
        return self._last.get(name, 0.0) > GROUP_SECONDS / 2

    def clear(self) -> None:
        self._last.clear()


handler_times = HandlerTimes()


def act(attempt: Attempt) -> Outcome | None:
    """Phase 3 for one job: the road a group of one takes (the race fixture's "write")."""
    if attempt.job.external:
        return act_external(attempt)
    act_group([attempt])
    return attempt.outcome


def act_group(attempts: Sequence[Attempt]) -> list[Attempt]:
    """Check (if not done yet) and act on internal jobs in one transaction.

    Returns the attempts not started (the group was closed, or their lane's job before them did
    not finish). Outcomes land on ``attempt.outcome`` once committed.
    """
    check_all(attempts)
    claim = attempts[0].claim
    db = claim.using
    group = _Group()
    decided: list[tuple[Attempt, Outcome]] = []
    rest: list[Attempt] = []
    crash: _Crash | None = None
    try:
        with transaction.atomic(using=db):
            held: set[str] = set()  # lanes whose job before stays unfinished: followers wait
            for index, attempt in enumerate(attempts):
                if attempt.done:
                    continue
                if attempt.follower and attempt.job.lane in held:
                    rest.append(attempt)  # its turn does not come: given back by the runner
                    continue
                if group.closes_before(attempt, len(decided)):
                    rest += [a for a in attempts[index:] if not a.done]
                    break
                if not claim.begin(attempt.job.pk):
                    attempt.lost = True  # given back while a slow job ran: another worker's now
                    continue
                try:
                    outcome = attempt.stop or _run(attempt, group)
                except _Crash as caught:
                    crash = caught
                    rest += [a for a in attempts[index + 1 :] if not a.done]
                    break
                decided.append((attempt, outcome))
                if outcome.status not in Job.TERMINAL:
                    held.add(attempt.job.lane)
            ledger.record(claim, [outcome for _, outcome in decided])
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
    except DatabaseError as exc:
        # The outcomes could not be written (the database went away, or the commit failed):
        # all of it rolled back. The jobs go back; a job alone in its group is charged.
        _give_back_group(claim, [a for a in attempts if not a.done], exc)
        return []
    for attempt, outcome in decided:
        attempt.outcome = outcome
        if outcome.retry_in is not None:
            _ring_after_commit(outcome)
    if crash is not None:
        raise crash.exc
    return rest


def _give_back_group(claim: Claim, attempts: list[Attempt], exc: DatabaseError) -> None:
    alone = attempts[0] if len(attempts) == 1 else None
    logger.error(
        "could not record the outcomes of job(s) %s (%s); they are given back",
        [a.job.pk for a in attempts],
        _cls(exc),
        extra={"tombstones": {"job_ids": [a.job.pk for a in attempts], "error_class": _cls(exc)}},
    )
    try:
        ledger.release(
            claim,
            [a.job for a in attempts],
            culprit=alone.job if alone else None,
            suspects=alone is None,
            error_class=_cls(exc),
        )
    except DatabaseError:
        logger.warning("could not give back %s job(s); their leases will lapse", len(attempts))
    for attempt in attempts:
        attempt.lost = True


def _run(attempt: Attempt, group: _Group) -> Outcome:
    """One job of a group, in savepoints of its own: the handler, and its re-reads."""
    attempt.busy = True
    db = attempt.claim.using
    key = _key(attempt.job)
    fresh = key in group.unsure  # a job before it wrote the record's table: read it again
    if key in group.left:
        attempt.record = group.left[key]  # as the job before it left it
    for _ in range(tombstone_settings.STALE_REREADS + 2):  # bounded by the re-reads
        errors = _StatementErrors()
        ctx: HandlerContext | None = None
        started = time.monotonic()
        try:
            with own_savepoint(db), connections[db].execute_wrapper(errors):
                if fresh:
                    stop = _read_again(attempt)
                    fresh = False
                    if stop is not None:
                        attempt.busy = False
                        return stop
                send_hook(job_checked, attempt.job)
                ctx = HandlerContext(attempt.claim, attempt.job, copy.copy(attempt.record))
                cast(Handler, attempt.handler).func(ctx)
                if _aborted(db) or transaction.get_rollback(using=db):
                    raise _Broken(errors.first)
                if ctx.fence_lost is not None:
                    raise _FenceLost
        except _FenceLost:
            outcome = _after_lost_fence(attempt, cast(HandlerContext, ctx).fence_lost)
            if outcome is None:
                fresh = True  # decide again on the record as it is now
                continue
        except _Broken as broken:
            outcome = _broke_transaction(attempt, broken.first)
        except _Unreadable as unreadable:
            outcome = _unreadable(attempt, unreadable.error)
        except Exception as exc:  # noqa: BLE001 - classified here, after its savepoint rolled back
            outcome = _after_error(attempt, exc, errors.first)
        except BaseException as exc:
            raise _Crash(exc) from exc  # still busy: the crash is this job's
        else:
            ctx = cast(HandlerContext, ctx)
            handler_times.note(attempt.job.handler, time.monotonic() - started)
            group.carry(attempt, ctx)
            group.wrote = group.wrote or ctx.writes > 0
            outcome = _succeeded(attempt, ctx)
        attempt.busy = False
        return outcome
    attempt.busy = False
    return _retry(attempt, Reason.STALE_VERSION)  # cannot happen: the re-reads are bounded


@contextlib.contextmanager
def own_savepoint(db: str) -> Iterator[None]:
    """A job's savepoint inside its group's transaction, kept until the commit (no RELEASE: one
    statement less per job). What fails inside rolls back to it, with the ``on_commit``
    callbacks registered meanwhile (Django ties them to the savepoints in ``savepoint_ids``)."""
    conn = connections[db]
    sid = conn.savepoint()
    if sid is None:  # outside a transaction (autocommit): nothing to roll back to
        raise TransactionManagementError("A job's savepoint needs its group's transaction.")
    conn.savepoint_ids.append(sid)
    try:
        yield
    except BaseException:
        conn.savepoint_ids.remove(sid)
        # As Django's atomic() does: back before whatever the handler broke (an error inside
        # its ORM calls marks the transaction for rollback), or the group's if that fails.
        conn.needs_rollback = False
        try:
            conn.savepoint_rollback(sid)
        except DatabaseError:
            conn.needs_rollback = True
        raise
    conn.savepoint_ids.remove(sid)


class _Unreadable(Exception):
    def __init__(self, error: DatabaseError) -> None:
        self.error = error


def _read_again(attempt: Attempt) -> Outcome | None:
    """Inside the job's savepoint: the record as the jobs before it (or the world) left it."""
    try:
        records = read_records([attempt.job], using=attempt.claim.using)
    except DatabaseError as exc:
        raise _Unreadable(exc) from exc
    record = records.get(_key(attempt.job))
    stop = against(attempt, record)
    if stop is None:
        attempt.record = record
    return stop


def _succeeded(attempt: Attempt, ctx: HandlerContext) -> Outcome:
    record = ctx.record
    return attempt.end(
        Status.SUCCEEDED,
        found=(record.generation, record.version),
        writes=ctx.writes,
        erase_params=record.deleted_at is not None,
    )


def _after_lost_fence(attempt: Attempt, seen: fencing.Observation | None) -> Outcome | None:
    """A fenced write matched 0 rows (its savepoint rolled back): what the record became.

    A newer version of the live record (or, for a handler that accepts tombstones, the tombstone
    of its generation) is not a deletion: None, decide again on a fresh read, a bounded number of
    times, then back off. A tombstone or another generation rejects the job.
    """
    handler = cast(Handler, attempt.handler)
    state = seen.state if seen is not None else State.STALE
    newer = state in (State.LIVE, State.STALE) or (
        state == State.TOMBSTONE and handler.accepts_tombstones
    )
    if not newer:
        return _rejection(attempt, cast(fencing.Observation, seen))
    job = attempt.job
    if job.rereads >= tombstone_settings.STALE_REREADS:
        return _retry(attempt, Reason.STALE_VERSION)
    job.rereads += 1
    found = (seen.generation, seen.version) if seen is not None else (None, None)
    attempt.event(Event.REREAD, Reason.STALE_VERSION, found)
    return None


def _after_error(attempt: Attempt, exc: Exception, first: BaseException | None) -> Outcome:
    """What the handler's error means for its job (its writes rolled back)."""
    if _in_failed_transaction(exc):
        # A statement refused because of an earlier database error the handler swallowed.
        return _broke_transaction(attempt, first if first is not exc else None)
    if isinstance(exc, TRANSIENT):
        _log_failure(attempt, exc, "retried")
        return _retry(attempt, Reason.TRANSIENT, _cls(exc))
    if isinstance(exc, IntegrityError):
        # A constraint the handler broke will break again: not temporary.
        return _failed(attempt, exc)
    if isinstance(exc, DatabaseError):
        # Deadlock, lock timeout, serialization failure: rolled back, retried.
        _log_failure(attempt, exc, "retried")
        return _retry(attempt, Reason.TRANSIENT, _cls(exc))
    return _failed(attempt, exc)


def _broke_transaction(attempt: Attempt, first: BaseException | None) -> Outcome:
    """The handler caught a database error and went on: on PostgreSQL its transaction is then
    unusable and nothing it wrote can commit. Its own failure, never a pause or a retry."""
    if first is not None:
        _log_failure(attempt, first, "failed")
    return attempt.end(
        Status.FAILED,
        Reason.TRANSACTION_BROKEN,
        error_class=_cls(first) if first is not None else "",
        erase_params=True,
    )


def _failed(attempt: Attempt, exc: BaseException) -> Outcome:
    _log_failure(attempt, exc, "failed")
    return attempt.end(
        Status.FAILED, Reason.HANDLER_ERROR, error_class=_cls(exc), erase_params=True
    )


def _retry(attempt: Attempt, reason: str, error_class: str = "") -> Outcome:
    job = attempt.job
    if job.attempts >= tombstone_settings.MAX_ATTEMPTS:
        return attempt.end(
            Status.FAILED, Reason.RETRIES_EXHAUSTED, error_class=error_class, erase_params=True
        )
    delay = tombstone_settings.backoff(job.attempts)
    return attempt.end(Status.RETRY_WAIT, reason, error_class=error_class, retry_in=delay)


def _log_failure(attempt: Attempt, exc: BaseException, then: str) -> None:
    """The handler's error for a developer: class and traceback frames (file, line, function).

    The message and the frames' locals may carry personal data: only with
    ``TOMBSTONES_LOG_ERROR_DETAILS`` (default: ``DEBUG``).
    """
    frames = traceback.extract_tb(exc.__traceback__)
    where = [f"{f.filename}:{f.lineno} in {f.name}" for f in frames]
    details = tombstone_settings.LOG_ERROR_DETAILS
    if details is None:
        details = bool(settings.DEBUG)
    extra: dict[str, Any] = {
        "job_id": attempt.job.pk,
        "handler": attempt.job.handler,
        "error_class": _cls(exc),
        "frames": where,
    }
    text = f"job {attempt.job.pk} handler {attempt.job.handler} raised {_cls(exc)} ({then})"
    if details:
        extra["error_message"] = str(exc)
        extra["locals"] = _locals(exc)
        text += f": {exc}"
    lines = "\n".join(f"  {w}" for w in where)
    level = logging.WARNING if then == "retried" else logging.ERROR
    logger.log(level, "%s\n%s", text, lines, extra={"tombstones": extra})


def _locals(exc: BaseException) -> list[dict[str, str]]:
    found = []
    tb = exc.__traceback__
    while tb is not None:
        found.append({name: _short(value) for name, value in tb.tb_frame.f_locals.items()})
        tb = tb.tb_next
    return found


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that raises must not hide the handler's error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 200 else text[:197] + "..."


class _StatementErrors:
    """An execute wrapper around a handler: the first database error any statement raised."""

    def __init__(self) -> None:
        self.first: BaseException | None = None

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        try:
            return execute(sql, params, many, context)
        except DatabaseError as exc:
            if self.first is None:
                self.first = exc
            raise


def _in_failed_transaction(exc: BaseException) -> bool:
    """PostgreSQL's "current transaction is aborted" (SQLSTATE 25P02), or Django's refusal to
    run a query after an error inside an ``atomic(savepoint=False)`` block."""
    if isinstance(exc, TransactionManagementError):
        return True
    return isinstance(exc, DatabaseError) and getattr(exc.__cause__, "sqlstate", None) == "25P02"


def _aborted(db: str) -> bool:
    """True when the connection's transaction is in PostgreSQL's failed state."""
    conn = connections[db]
    raw = conn.connection
    if conn.vendor != "postgresql" or raw is None:
        return False
    info = getattr(raw, "info", None)  # psycopg 3
    if info is not None:
        from psycopg import pq

        return bool(info.transaction_status == pq.TransactionStatus.INERROR)
    status = getattr(raw, "get_transaction_status", None)  # psycopg2
    return status is not None and status() == 3  # TRANSACTION_STATUS_INERROR


def _record_alone(attempt: Attempt, outcome: Outcome) -> Outcome:
    """Record one outcome in a transaction of its own (the check's stop, an external job)."""
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


def _cls(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


# --- external calls --------------------------------------------------------------------------


def act_external(attempt: Attempt) -> Outcome | None:
    """check → sending (committed) → call → sent → check again. Uncertain is never repeated."""
    claim, job = attempt.claim, attempt.job
    if not claim.begin(job.pk):
        attempt.lost = True  # given back while a slow job ran: another worker's now
        return None
    attempt.busy = True
    if not attempt.checked:
        check_all([attempt])
    if attempt.stop is not None:
        attempt.busy = False
        return _record_alone(attempt, attempt.stop)
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
        send_hook(job_checked, job)
        handler.func(ctx)
    except TransientError as exc:
        # The handler states nothing was delivered (e.g. connection refused): safe to retry.
        ledger.clear_sending(claim, job)
        _log_failure(attempt, exc, "retried")
        return _record_alone(attempt, _retry(attempt, Reason.TRANSIENT, _cls(exc)))
    except Exception as exc:  # noqa: BLE001 - after sending, any error leaves the outcome unknown
        _log_failure(attempt, exc, "uncertain")
        return _record_alone(
            attempt,
            attempt.end(
                Status.UNCERTAIN,
                Reason.OUTCOME_UNKNOWN,
                error_class=_cls(exc),
                erase_params=record.deleted_at is not None,
            ),
        )
    ledger.mark_sent(claim, job)
    seen = fencing.observe(model, record.pk, job.generation, None, using=claim.using)
    fine = (State.LIVE, State.TOMBSTONE) if handler.accepts_tombstones else (State.LIVE,)
    found = (seen.generation, seen.version)
    if seen.state not in fine:
        # Deleted or re-created during the call: what landed is unknown. Never repeated; staff
        # decide, unless a later job of the lane will send the record's newer state anyway.
        status = Status.SUPERSEDED if _overtaken(job, seen) else Status.UNCERTAIN
        outcome = attempt.end(status, Reason.DELETED_DURING_SEND, found=found, erase_params=True)
    else:
        outcome = attempt.end(
            Status.SUCCEEDED, found=found, erase_params=seen.state == State.TOMBSTONE
        )
    attempt.busy = False
    return _record_alone(attempt, outcome)


def _overtaken(job: Job, seen: fencing.Observation) -> bool:
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


def _rejection(attempt: Attempt, seen: fencing.Observation) -> Outcome:
    found = (seen.generation, seen.version)
    if seen.state == State.TOMBSTONE:
        reason = Reason.SOURCE_DELETED
    elif seen.state == State.GENERATION_CHANGED:
        reason = Reason.GENERATION_CHANGED
    else:
        return attempt.end(Status.ESCALATED, Reason.RECORD_MISSING, found=found, erase_params=True)
    return attempt.end(Status.REJECTED, reason, found=found, erase_params=True)
