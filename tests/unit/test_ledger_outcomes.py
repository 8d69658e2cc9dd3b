"""What a claim that ended without an outcome becomes (tombstones.jobs.ledger.outcomes):
retried with backoff, back to its lane place when it was a follower, failed once capped."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from tombstones.jobs.ledger.outcomes import crash_outcome
from tombstones.jobs.models import Job

Status = Job.Status
Reason = Job.Reason


@pytest.fixture(autouse=True)
def _limits(settings: Any) -> None:
    settings.TOMBSTONES_MAX_ATTEMPTS = 5
    settings.TOMBSTONES_RETRY_BACKOFF = timedelta(seconds=2)
    settings.TOMBSTONES_RETRY_BACKOFF_MAX = timedelta(seconds=10)


def _job(attempts: int, status: str = Status.RUNNING) -> Job:
    return Job(pk=7, status=status, attempts=attempts, generation=1, version=1)


def test_crash_outcome__a_running_head_retries_after_the_capped_backoff() -> None:
    # base * 2**(attempts - 1): 2, 4, 8, then 16 capped at 10.
    expected = {1: 2, 2: 4, 3: 8, 4: 10}
    for attempts, seconds in expected.items():
        outcome = crash_outcome(_job(attempts), "SystemExit")
        assert (outcome.status, outcome.reason, outcome.error_class) == (
            Status.RETRY_WAIT,
            Reason.CRASHED,
            "SystemExit",
        )
        assert outcome.retry_in == timedelta(seconds=seconds), attempts
        assert not outcome.erase_params  # it runs again, with its params
        assert not outcome.refund  # the crash counts: it may be what killed the worker


def test_crash_outcome__a_lane_follower_goes_back_to_its_place() -> None:
    outcome = crash_outcome(_job(2, Status.QUEUED))
    assert (outcome.status, outcome.reason, outcome.retry_in) == (
        Status.QUEUED,
        Reason.CRASHED,
        None,
    )
    assert outcome.error_class == ""
    assert not outcome.erase_params


def test_crash_outcome__fails_at_the_attempt_cap_and_erases_the_params() -> None:
    for status in (Status.RUNNING, Status.QUEUED):  # a follower too: the cap comes first
        for attempts in (5, 6):
            outcome = crash_outcome(_job(attempts, status), "MemoryError")
            assert (outcome.status, outcome.reason, outcome.error_class) == (
                Status.FAILED,
                Reason.CRASHED,
                "MemoryError",
            )
            assert outcome.erase_params
            assert outcome.retry_in is None


def test_crash_outcome__one_below_the_cap_still_retries(settings: Any) -> None:
    settings.TOMBSTONES_MAX_ATTEMPTS = 1
    assert crash_outcome(_job(0)).status == Status.RETRY_WAIT
    assert crash_outcome(_job(1)).status == Status.FAILED


def test_crash_outcome__a_malformed_cap_names_the_setting(settings: Any) -> None:
    settings.TOMBSTONES_MAX_ATTEMPTS = 0
    with pytest.raises(ImproperlyConfigured, match="TOMBSTONES_MAX_ATTEMPTS must be an integer"):
        crash_outcome(_job(1))
