"""The internal road: a claim's internal jobs act in *groups* of one transaction.

Each job runs in a savepoint of its own (:mod:`.savepoints`), on the record as the jobs before it
left it (their updates carried forward, what only the database knows read back; read again after
a write of the record's own table), so a failure, a lost fence or a crash rolls back that job
alone and never another's finished work. The check holds nothing: the fence is the write
(``ctx.update`` is the conditional UPDATE; ``ctx.write`` holds the source row from its write to
the commit), so a delete or an edit landing while a handler runs is never kept waiting by it; the
write then matches 0 rows and the job is rejected or re-reads. The group's outcomes are recorded
with one UPDATE before it commits.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from django.db import DatabaseError, connections, transaction

from ...conf import tombstone_settings
from ...exceptions import LeaseLost
from ...logfields import jobs_fields
from ...records.fencing import Observation, State
from ...signals import job_checked, send_hook
from .. import ledger
from ..context import HandlerContext
from ..ledger import Claim, Outcome
from ..models import Job
from ..registry import Handler
from . import check
from .alarms import Alarms
from .attempt import (
    Attempt,
    Event,
    Reason,
    Status,
    Step,
    error_class,
    give_back,
    ring_after_commit,
)
from .check import against, check_all, record_key, unreadable
from .failures import after_error, broke_transaction, rejection, retry
from .savepoints import Savepoint, StatementErrors, aborted, own_savepoint

logger = logging.getLogger("tombstones")

# A group's transaction closes once its handlers ran this long: on SQLite it holds the
# database's write lock, and whatever a handler wrote stays locked until the commit.
GROUP_SECONDS = 0.2
# Jobs per group at most: each runs in a savepoint, and PostgreSQL keeps the first 64
# subtransactions of a transaction in shared memory (past that, every snapshot slows down).
GROUP_JOBS = 50


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


@dataclass(frozen=True)
class Crashed:
    """A handler raised a BaseException (SystemExit, KeyboardInterrupt): its savepoint rolled
    back; the group records what it decided, then the exception goes on."""

    exc: BaseException


@dataclass
class Group:
    """One act transaction."""

    times: HandlerTimes
    started: float = field(default_factory=time.monotonic)
    # The records as the group's jobs left them (their update()s carried forward), and those
    # to read again (a job wrote the record's table otherwise, or they are unknown here).
    carried: dict[tuple[int | None, str], Any] = field(default_factory=dict)
    reread: set[tuple[int | None, str]] = field(default_factory=set)
    wrote: bool = False  # a job wrote: its rows stay locked until the commit

    def carry(self, attempt: Attempt, ctx: HandlerContext) -> None:
        """After a job's success: the record as it left it, for the next job of the record."""
        key = record_key(attempt.job)
        self.wrote = self.wrote or ctx.writes > 0
        if attempt.job.is_plain:
            return  # no record to carry
        if ctx.moved_record:
            self.reread.add(key)
            self.carried.pop(key, None)
            return
        record = copy.copy(attempt.record)  # as the job started: none of its own scribbles
        for name, value in ctx.applied:
            setattr(record, name, value)
        record.version = ctx.record.version
        self.carried[key] = record
        self.reread.discard(key)

    def closes_before(self, attempt: Attempt, decided: int) -> bool:
        if not decided:
            return False
        if decided >= GROUP_JOBS or time.monotonic() - self.started > GROUP_SECONDS:
            return True
        # What the jobs before wrote must not wait for a handler known to be slow.
        return self.wrote and self.times.slow(attempt.job.handler)


@dataclass
class Decided:
    """What a group's jobs came to before its commit."""

    outcomes: list[tuple[Attempt, Outcome]] = field(default_factory=list)
    rest: list[Attempt] = field(default_factory=list)  # not started: the runner gives them back
    crash: BaseException | None = None


def act_group(attempts: Sequence[Attempt], *, times: HandlerTimes, alarms: Alarms) -> list[Attempt]:
    """Check (if not done yet) and act on internal jobs in one transaction.

    Returns the attempts not started (the group was closed, or their lane's job before them did
    not finish). Outcomes land on ``attempt.outcome`` once committed.
    """
    check_all(attempts)
    claim = attempts[0].claim
    try:
        with transaction.atomic(using=claim.using):
            decided = _decide(attempts, Group(times))
            ledger.write_outcomes(claim, [outcome for _, outcome in decided.outcomes])
    except LeaseLost:
        # Taken over while we held it (a zombie): our writes rolled back, nothing is ours.
        ids = [a.job.pk for a in attempts]
        logger.warning(
            "lease lost for job(s) %s: their writes were rolled back",
            ids,
            extra=jobs_fields(ids),
        )
        for attempt in attempts:
            attempt.lose()
        return []
    except DatabaseError as exc:
        # The outcomes could not be written (the database went away, or the commit failed):
        # all of it rolled back. The jobs go back; a job alone in its group is charged.
        _give_back_group(claim, [a for a in attempts if not a.done], exc)
        return []
    for attempt, outcome in decided.outcomes:
        attempt.recorded(outcome)
        ring_after_commit(outcome, alarms)
    if decided.crash is not None:
        raise decided.crash
    return decided.rest


def _decide(attempts: Sequence[Attempt], group: Group) -> Decided:
    """Inside the group's transaction: each job's outcome, in claim order, until one crashes."""
    claim = attempts[0].claim
    decided = Decided()
    waiting: set[str] = set()  # lanes whose job before stays unfinished: followers wait
    for index, attempt in enumerate(attempts):
        if attempt.done:
            continue
        if attempt.follower and attempt.job.lane in waiting:
            decided.rest.append(attempt)  # its turn does not come: given back by the runner
            continue
        if group.closes_before(attempt, len(decided.outcomes)):
            decided.rest += [a for a in attempts[index:] if not a.done]
            break
        if not claim.begin(attempt.job.pk):
            attempt.lose()  # given back while a slow job ran: another worker's now
            continue
        ran = attempt.stop or _run(attempt, group)
        if isinstance(ran, Crashed):
            decided.crash = ran.exc  # the attempt stays RUNNING: the crash is its own
            decided.rest += [a for a in attempts[index + 1 :] if not a.done]
            break
        attempt.step = Step.DECIDED
        decided.outcomes.append((attempt, ran))
        if ran.status not in Job.TERMINAL:
            waiting.add(attempt.job.lane)
    return decided


def _give_back_group(claim: Claim, attempts: list[Attempt], exc: DatabaseError) -> None:
    alone = attempts[0] if len(attempts) == 1 else None
    logger.error(
        "could not record the outcomes of job(s) %s (%s); they are given back",
        [a.job.pk for a in attempts],
        error_class(exc),
        extra=jobs_fields([a.job.pk for a in attempts], error_class=error_class(exc)),
    )
    try:
        give_back(
            claim,
            attempts,
            culprit=alone.job if alone else None,
            suspects=alone is None,
            error_class=error_class(exc),
        )
    except DatabaseError:
        logger.warning(
            "could not give back %s job(s); their leases will lapse",
            len(attempts),
            extra=jobs_fields([a.job.pk for a in attempts]),
        )
        for attempt in attempts:
            attempt.lose()


def _run(attempt: Attempt, group: Group) -> Outcome | Crashed:
    """One job of a group, in savepoints of its own: the handler, and its re-reads."""
    attempt.step = Step.RUNNING
    key = record_key(attempt.job)
    fresh = key in group.reread  # a job before it wrote the record's table: read it again
    if key in group.carried:
        attempt.record = group.carried[key]  # as the job before it left it
    for _ in range(tombstone_settings.STALE_REREADS + 2):  # bounded by the re-reads
        turn = _turn(attempt, fresh, group.times)
        if turn is None:
            fresh = True  # decide again on the record as it is now
            continue
        if isinstance(turn, HandlerContext):
            group.carry(attempt, turn)
            return _succeeded(attempt, turn)
        return turn
    return retry(attempt, Reason.STALE_VERSION)  # cannot happen: the re-reads are bounded


def _turn(
    attempt: Attempt, fresh: bool, times: HandlerTimes
) -> Outcome | HandlerContext | Crashed | None:
    """One go at the job in its own savepoint: an outcome, the context of a handler that ran
    to its end, a crash, or None to decide again on a fresh read (a newer version)."""
    db = attempt.claim.using
    errors = StatementErrors()
    started = time.monotonic()
    try:
        with own_savepoint(db) as savepoint, connections[db].execute_wrapper(errors):
            ran = _handle(attempt, fresh, errors, savepoint)
    except Exception as exc:  # noqa: BLE001 - classified here, after its savepoint rolled back
        return after_error(attempt, exc, errors.first)
    except BaseException as exc:  # noqa: BLE001 - returned, re-raised once the group is recorded
        return Crashed(exc)
    if isinstance(ran, HandlerContext):
        if ran.fence_lost is not None:
            return _after_lost_fence(attempt, ran.fence_lost)
        times.note(attempt.job.handler, time.monotonic() - started)
    return ran


def _handle(
    attempt: Attempt, fresh: bool, errors: StatementErrors, savepoint: Savepoint
) -> Outcome | HandlerContext:
    """Inside the job's savepoint: the record read again if it must be, then the handler."""
    db = attempt.claim.using
    if fresh:
        stop = _read_again(attempt, savepoint)
        if stop is not None:
            return stop
    send_hook(job_checked, attempt.job)
    ctx = attempt.context(copy.copy(attempt.record))
    cast(Handler, attempt.handler).func(ctx)
    if aborted(db) or transaction.get_rollback(using=db):
        savepoint.discard()
        return broke_transaction(attempt, errors.first)
    if ctx.fence_lost is not None:
        savepoint.discard()
    return ctx


def _read_again(attempt: Attempt, savepoint: Savepoint) -> Outcome | None:
    """Inside the job's savepoint: the record as the jobs before it (or the world) left it."""
    try:
        records = check.read_records([attempt.job], using=attempt.claim.using)
    except DatabaseError as exc:
        savepoint.discard()
        return unreadable(attempt, exc)
    record = records.get(record_key(attempt.job))
    stop = against(attempt, record)
    if stop is None:
        attempt.record = record
    return stop


def _succeeded(attempt: Attempt, ctx: HandlerContext) -> Outcome:
    record = ctx.record
    if record is None:  # a plain job: its params stay until retention removes the job
        return attempt.end(Status.SUCCEEDED, writes=ctx.writes)
    return attempt.end(
        Status.SUCCEEDED,
        found=(record.generation, record.version),
        writes=ctx.writes,
        erase_params=record.deleted_at is not None,
    )


def _after_lost_fence(attempt: Attempt, seen: Observation) -> Outcome | None:
    """A fenced write matched 0 rows (its savepoint rolled back): what the record became.

    A newer version of the live record (or, for a handler that accepts tombstones, the tombstone
    of its generation) is not a deletion: None, decide again on a fresh read, a bounded number of
    times, then back off. A tombstone or another generation rejects the job.
    """
    handler = cast(Handler, attempt.handler)
    newer = seen.state in (State.LIVE, State.STALE) or (
        seen.state == State.TOMBSTONE and handler.accepts_tombstones
    )
    if not newer:
        return rejection(attempt, seen)
    job = attempt.job
    if job.rereads >= tombstone_settings.STALE_REREADS:
        return retry(attempt, Reason.STALE_VERSION)
    job.rereads += 1
    attempt.event(Event.REREAD, Reason.STALE_VERSION, (seen.generation, seen.version))
    return None
