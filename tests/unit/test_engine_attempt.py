"""An attempt's steps (tombstones.jobs.engine.attempt): one ``step`` says whether a crash is its
own (``busy``), whether it is finished, and whether it is checked; the check moves it.

No database: the job is unsaved, the claim carries its own clock, the read is a stand-in.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tombstones.jobs import registry
from tombstones.jobs.engine import check
from tombstones.jobs.engine.attempt import Attempt, Step
from tombstones.jobs.ledger import Claim, Outcome
from tombstones.jobs.models import Job

KNOWN = "tests.engine_attempt.known"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _handler() -> Iterator[None]:
    registry.handler(KNOWN)(lambda ctx: None)
    yield
    registry.unregister(KNOWN)


def _attempts(count: int) -> list[Attempt]:
    jobs = [
        Job(
            pk=pk,
            handler=KNOWN,
            content_type_id=1,
            object_id=str(pk),
            generation=1,
            version=1,
            status=Job.Status.RUNNING,
            attempts=1,
            created_at=NOW,
        )
        for pk in range(1, count + 1)
    ]
    claim = Claim(token="t", worker="w", using="default", jobs=jobs, clock=(NOW, time.monotonic()))
    return [Attempt(claim, job) for job in jobs]


@pytest.mark.parametrize(
    ("step", "busy", "done", "checked"),
    [
        (Step.CLAIMED, False, False, False),
        (Step.CHECKING, True, False, True),
        (Step.READING, False, False, True),
        (Step.CHECKED, False, False, True),
        (Step.STOPPED, False, False, True),
        (Step.RUNNING, True, False, True),
        (Step.DECIDED, False, False, True),
        (Step.DONE, False, True, True),
        (Step.LOST, False, True, True),
    ],
)
def test_attempt__its_step_says_busy_done_and_checked(
    step: Step, busy: bool, done: bool, checked: bool
) -> None:
    attempt = _attempts(1)[0]
    attempt.step = step
    assert (attempt.busy, attempt.done, attempt.checked) == (busy, done, checked)


def test_attempt__recorded_and_lost_are_final() -> None:
    recorded, lost = _attempts(2)
    outcome = Outcome(recorded.job, Job.Status.SUCCEEDED)
    recorded.recorded(outcome)
    lost.lose()
    assert (recorded.step, recorded.outcome) == (Step.DONE, outcome)
    assert (lost.step, lost.outcome) == (Step.LOST, None)
    check.check_all([recorded, lost])  # a finished attempt is never checked again
    assert (recorded.step, lost.step) == (Step.DONE, Step.LOST)


class Interrupted(BaseException):
    """What kills a worker in the middle of a read (SystemExit, KeyboardInterrupt)."""


@pytest.mark.parametrize(("count", "culprits"), [(1, 1), (3, 0)])
def test_check__a_crash_in_the_read_is_a_jobs_own_only_when_it_is_read_alone(
    monkeypatch: pytest.MonkeyPatch, count: int, culprits: int
) -> None:
    def crashes(*args: Any, **kwargs: Any) -> Any:
        raise Interrupted

    monkeypatch.setattr(check, "read_records", crashes)
    attempts = _attempts(count)
    with pytest.raises(Interrupted):
        check.check_all(attempts)
    assert sum(a.busy for a in attempts) == culprits
    assert all(a.checked and not a.done for a in attempts)


def test_check__a_record_read_moves_the_attempt_to_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    record = type("Row", (), {"generation": 1, "version": 3, "deleted_at": None})()
    monkeypatch.setattr(check, "read_records", lambda jobs, using: {(1, "1"): record})
    attempt = _attempts(1)[0]
    check.check_all([attempt])
    assert (attempt.step, attempt.record, attempt.stop) == (Step.CHECKED, record, None)
    assert [e.event for e in attempt.events][-1] == "checked"
