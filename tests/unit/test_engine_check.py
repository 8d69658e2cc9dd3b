"""The check's stop conditions (tombstones.jobs.engine.check; the issue's ``classify``): what a
claimed job becomes when it must not act, decided before and after its record is read.

No database: the jobs are unsaved, the claim carries its own clock, and the records are stand-ins
with the three fence attributes the check reads.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tombstones.jobs import registry
from tombstones.jobs.engine import check
from tombstones.jobs.engine.attempt import Attempt
from tombstones.jobs.ledger import Claim, Outcome
from tombstones.jobs.models import Job, JobEvent

Status = Job.Status
Reason = Job.Reason

KNOWN = "tests.check_stops.known"
ACCEPTS = "tests.check_stops.accepts_tombstones"
UNKNOWN = "tests.check_stops.nobody_has_it"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _handle(ctx: Any) -> None:
    return None


def _handle_tombstones(ctx: Any) -> None:
    return None


@pytest.fixture(autouse=True)
def _handlers(settings: Any) -> Iterator[None]:
    settings.TOMBSTONES_RETRY_BACKOFF = timedelta(seconds=2)
    settings.TOMBSTONES_RETRY_BACKOFF_MAX = timedelta(minutes=10)
    registry.handler(KNOWN)(_handle)
    registry.handler(ACCEPTS, accepts_tombstones=True)(_handle_tombstones)
    yield
    registry.unregister(KNOWN)
    registry.unregister(ACCEPTS)


@dataclass
class Row:
    """A record as the check reads it: its fence only."""

    generation: int
    version: int
    deleted_at: datetime | None = None


def _attempt(
    handler: str = KNOWN,
    *,
    generation: int | None = 2,
    version: int | None = 5,
    age: timedelta = timedelta(seconds=30),
    too_old: bool = False,
) -> Attempt:
    job = Job(
        pk=7,
        handler=handler,
        content_type_id=1,
        object_id="3",
        generation=generation,
        version=version,
        status=Status.RUNNING,
        attempts=1,
        created_at=NOW - age,
    )
    if too_old:
        job.too_old = True  # type: ignore[attr-defined]  # annotated by the claim's query
    claim = Claim(token="t", worker="w", using="default", jobs=[job], clock=(NOW, time.monotonic()))
    return Attempt(claim, job)


def _stop(attempt: Attempt) -> Outcome:
    check.check_all([attempt])
    assert attempt.checked
    assert not attempt.busy
    assert attempt.stop is not None
    return attempt.stop


def test_check__an_unfenced_job_is_escalated_before_anything_else() -> None:
    for attempt in (
        _attempt(generation=None),
        _attempt(version=None),
        _attempt(UNKNOWN, version=None, too_old=True),  # the fence comes first
    ):
        stop = _stop(attempt)
        assert (stop.status, stop.reason, stop.erase_params) == (
            Status.ESCALATED,
            Reason.MISSING_FENCE,
            True,
        )


def test_check__an_unknown_handler_waits_a_tenth_of_the_jobs_age_uncharged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = _stop(_attempt(UNKNOWN, age=timedelta(seconds=300)))
    assert (stop.status, stop.reason) == (Status.RETRY_WAIT, Reason.HANDLER_UNKNOWN)
    assert stop.retry_in is not None
    # The claim's clock runs on while the test does: 300 s and a few microseconds old.
    assert timedelta(seconds=30) <= stop.retry_in < timedelta(seconds=30.1)
    assert stop.refund
    assert not stop.erase_params  # it is still to run, with its params
    (line,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert line.job_id == 7  # type: ignore[attr-defined]
    assert line.job_handler == UNKNOWN  # type: ignore[attr-defined]
    assert (line.job_status, line.job_reason) == (Status.RETRY_WAIT, Reason.HANDLER_UNKNOWN)  # type: ignore[attr-defined]


def test_check__an_unknown_handlers_wait_stays_between_the_backoffs_base_and_cap() -> None:
    assert _stop(_attempt(UNKNOWN, age=timedelta(seconds=5))).retry_in == timedelta(seconds=2)
    # A clock that reads the enqueue as later than the claim: the base, not a negative wait.
    assert _stop(_attempt(UNKNOWN, age=-timedelta(hours=1))).retry_in == timedelta(seconds=2)
    assert _stop(_attempt(UNKNOWN, age=timedelta(days=6))).retry_in == timedelta(minutes=10)


def test_check__an_unknown_handler_is_escalated_once_the_job_is_too_old() -> None:
    stop = _stop(_attempt(UNKNOWN, too_old=True))
    assert (stop.status, stop.reason, stop.erase_params) == (
        Status.ESCALATED,
        Reason.HANDLER_UNKNOWN,
        True,
    )


def test_check__a_too_old_job_with_a_known_handler_expires() -> None:
    stop = _stop(_attempt(too_old=True))
    assert (stop.status, stop.reason, stop.erase_params) == (
        Status.EXPIRED,
        Reason.QUEUE_EXPIRED,
        True,
    )


def test_check__a_stop_carries_the_claimed_event_with_it() -> None:
    attempt = _attempt(too_old=True)
    stop = _stop(attempt)
    assert [ev.event for ev in stop.events] == [JobEvent.Event.CLAIMED]
    assert stop.events[0].created_at == NOW  # stamped at the claim
    assert attempt.events == []


def test_against__a_missing_record_escalates() -> None:
    attempt = _attempt()
    assert check.before_reading(attempt) is None
    assert attempt.handler is not None
    assert attempt.handler.name == KNOWN
    stop = check.against(attempt, None)
    assert stop is not None
    assert (stop.status, stop.reason, stop.found, stop.erase_params) == (
        Status.ESCALATED,
        Reason.RECORD_MISSING,
        (None, None),
        True,
    )


def test_against__another_generation_rejects_even_a_handler_of_tombstones() -> None:
    for handler, row in (
        (KNOWN, Row(generation=3, version=1)),
        (KNOWN, Row(generation=1, version=9)),
        (ACCEPTS, Row(generation=3, version=1, deleted_at=NOW)),
    ):
        attempt = _attempt(handler)
        assert check.before_reading(attempt) is None
        stop = check.against(attempt, row)
        assert stop is not None
        assert (stop.status, stop.reason, stop.found, stop.erase_params) == (
            Status.REJECTED,
            Reason.GENERATION_CHANGED,
            (row.generation, row.version),
            True,
        )


def test_against__a_tombstone_of_its_generation_rejects_unless_the_handler_accepts_it() -> None:
    attempt = _attempt(KNOWN)
    check.before_reading(attempt)
    stop = check.against(attempt, Row(generation=2, version=6, deleted_at=NOW))
    assert stop is not None
    assert (stop.status, stop.reason, stop.found) == (
        Status.REJECTED,
        Reason.SOURCE_DELETED,
        (2, 6),
    )
    accepting = _attempt(ACCEPTS)
    check.before_reading(accepting)
    assert check.against(accepting, Row(generation=2, version=6, deleted_at=NOW)) is None


def test_against__a_live_record_of_its_generation_acts_whatever_its_version() -> None:
    """A newer version is no stop: the fence at the write decides (it re-reads)."""
    for version in (5, 6, 40):
        attempt = _attempt()
        check.before_reading(attempt)
        assert check.against(attempt, Row(generation=2, version=version)) is None
