"""A claimed job on its way through the engine: one step at a time, and the one place its outcome
is saved alone or it goes back to the queue."""

from __future__ import annotations

import enum
import functools
import logging
import traceback
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from ...exceptions import LeaseLost
from .. import ledger
from ..context import HandlerContext
from ..ledger import Claim, Outcome
from ..models import Job, JobEvent
from ..registry import Handler
from . import keeper
from .alarms import Alarms

logger = logging.getLogger("tombstones")

Status = Job.Status
Reason = Job.Reason
Event = JobEvent.Event


class Step(enum.Enum):
    """Where an attempt stands. A crash while it is ``CHECKING`` or ``RUNNING`` is its own."""

    CLAIMED = "claimed"  # not checked yet
    CHECKING = "checking"  # its check runs (the stops, or the read of its record alone)
    READING = "reading"  # past the stops that need no read; its record is read with others
    CHECKED = "checked"  # may act on ``record``
    STOPPED = "stopped"  # must not act: ``stop`` waits to be recorded (with its group)
    RUNNING = "running"  # its handler runs
    DECIDED = "decided"  # its outcome waits for its group's commit
    DONE = "done"  # its outcome is recorded
    LOST = "lost"  # no longer this claim's (taken over, or given back): nothing is written


BUSY = frozenset({Step.CHECKING, Step.RUNNING})
FINISHED = frozenset({Step.DONE, Step.LOST})


@dataclass(eq=False)
class Attempt:
    """A claimed job on its way through the engine."""

    claim: Claim
    job: Job
    step: Step = Step.CLAIMED
    handler: Handler | None = None
    record: Any = None  # as checked (or as the jobs before it in its group left it)
    stop: Outcome | None = None  # decided at the check (``STOPPED``)
    outcome: Outcome | None = None  # recorded (``DONE``)
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
    def checked(self) -> bool:
        """Its check ran (or runs): it is not checked again."""
        return self.step != Step.CLAIMED

    @property
    def done(self) -> bool:
        return self.step in FINISHED

    @property
    def busy(self) -> bool:
        """Its check or handler runs: a crash now is its own."""
        return self.step in BUSY

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

    def context(self, record: Any) -> HandlerContext:
        """What its handler receives: ``record``, and a heartbeat for the claim's lease."""
        return HandlerContext(
            self.job, record, heartbeat=functools.partial(keeper.heartbeat, self.claim)
        )

    def recorded(self, outcome: Outcome) -> None:
        """Its outcome committed."""
        self.outcome, self.step = outcome, Step.DONE

    def lose(self) -> None:
        """No longer this claim's: whatever it decided is not written."""
        self.step = Step.LOST


def give_back(
    claim: Claim,
    attempts: list[Attempt],
    *,
    culprit: Job | None = None,
    suspects: bool = False,
    error_class: str = "",
) -> None:
    """Release these attempts' jobs to the queue (:func:`ledger.release`); they are lost to this
    claim. Raises what the release raises: each caller says what a failed release means."""
    ledger.release(
        claim,
        [a.job for a in attempts],
        culprit=culprit,
        suspects=suspects,
        error_class=error_class,
    )
    for attempt in attempts:
        attempt.lose()


def record_alone(attempt: Attempt, outcome: Outcome, alarms: Alarms) -> Outcome:
    """Record one outcome in a transaction of its own (the check's stop, an external job)."""
    try:
        with transaction.atomic(using=attempt.claim.using):
            ledger.write_outcomes(attempt.claim, [outcome])
    except LeaseLost:
        attempt.lose()
        return outcome
    attempt.recorded(outcome)
    ring_after_commit(outcome, alarms)
    return outcome


def ring_after_commit(outcome: Outcome, alarms: Alarms) -> None:
    # No message waits for a retry: this worker rings for it when the backoff ends.
    delay = outcome.retry_in
    if delay is not None:
        transaction.on_commit(lambda: alarms.ring_in(delay), using=outcome.job._state.db)


def error_class(exc: BaseException) -> str:
    """An exception's dotted class: what the ledger and the logs keep of it (never its text)."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


# The most of a failure's trace the ledger keeps (its last frames: where it was raised).
TRACE_MAX = 8000


def error_trace(exc: BaseException) -> str:
    """An exception's traceback as the ledger keeps it: each frame's file, line, function and
    source line, and its dotted class, never its message or a frame's local values (either may
    hold a record's personal data)."""
    frames = traceback.StackSummary.extract(traceback.walk_tb(exc.__traceback__))
    text = "".join(
        ["Traceback (most recent call last):\n", *frames.format(), error_class(exc), "\n"]
    )
    if len(text) > TRACE_MAX:
        text = "...\n" + text[-(TRACE_MAX - 4) :]
    return text
