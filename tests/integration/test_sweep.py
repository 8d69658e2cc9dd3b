"""The periodic sweep: lease rescue, uncertain after sending, expiry, resume, re-dispatch; its
django-q2 schedule; two sweeps at once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Q
from django.db.models.functions import Now
from django.test.utils import override_settings
from django_q.models import Schedule

from project.stress.models import StressEntity
from tests.jobkit import run_together, succeeded
from tombstones import ledger
from tombstones import sweep as sweep_module
from tombstones.dispatch import enqueue
from tombstones.models import Job, JobEvent
from tombstones.sweep import install_schedule, sweep

Status = Job.Status
Reason = Job.Reason


@pytest.fixture
def woken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Jobs the sweep re-dispatched (the message itself is not sent)."""
    calls: list[int] = []
    monkeypatch.setattr(sweep_module, "wake", calls.append)
    return calls


@pytest.fixture
def record(db: None) -> StressEntity:
    return StressEntity.all_objects.recreate(key="S1", payload="p")


@pytest.fixture(autouse=True)
def _no_wake_on_enqueue(monkeypatch: pytest.MonkeyPatch) -> None:
    # Enqueued jobs stay queued: these tests drive the sweep, not a worker.
    monkeypatch.setattr("tombstones.dispatch.wake", lambda job_id: None)


def _claimed(record: StressEntity, handler: str = "stress.apply") -> ledger.Claim:
    job = enqueue(handler, record)
    claim = ledger.claim(job.pk)
    assert claim is not None
    return claim


def _expire(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(lease_expires_at=Now() - timedelta(seconds=1))


def test_sweep__expired_lease_returns_the_job_to_the_queue(
    record: StressEntity, woken: list[int]
) -> None:
    claim = _claimed(record)
    assert sweep()["requeued"] == 0  # lease still valid
    _expire(claim.job)
    counts = sweep(dispatch=False)
    assert counts["requeued"] == 1
    job = Job.objects.get(pk=claim.job.pk)
    assert (job.status, job.reason, job.claim_token, job.lease_expires_at) == (
        Status.QUEUED,
        Reason.LEASE_EXPIRED,
        "",
        None,
    )
    assert JobEvent.objects.filter(job=job, event=JobEvent.Event.REQUEUED).count() == 1
    with pytest.raises(ledger.LeaseLost):
        ledger.finish(claim, Status.SUCCEEDED)


def test_sweep__expired_lease_after_sending_is_uncertain(record: StressEntity) -> None:
    claim = _claimed(record, "stress.upsert")
    assert ledger.mark_sending(claim, Q())
    _expire(claim.job)
    assert sweep(dispatch=False)["uncertain"] == 1
    job = Job.objects.get(pk=claim.job.pk)
    assert (job.status, job.reason) == (Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN)
    assert job.finished_at is not None


def test_sweep__old_jobs_expire_and_release_their_lane(record: StressEntity) -> None:
    old, young = enqueue("stress.apply", record), enqueue("stress.apply", record)
    Job.objects.filter(pk=old.pk).update(created_at=Now() - timedelta(days=8))
    assert sweep(dispatch=False)["expired"] == 1
    assert Job.objects.get(pk=old.pk).status == Status.EXPIRED
    assert ledger.claim(young.pk) is not None


def test_sweep__paused_jobs_are_resumed(record: StressEntity) -> None:
    claim = _claimed(record)
    ledger.finish(claim, Status.PAUSED, Reason.TOMBSTONE_UNREADABLE)
    assert sweep(dispatch=False)["resumed"] == 1
    job = Job.objects.get(pk=claim.job.pk)
    assert (job.status, job.reason) == (Status.QUEUED, Reason.NONE)
    assert JobEvent.objects.filter(job=job, event=JobEvent.Event.RESUMED).count() == 1


def test_sweep__redispatches_lane_heads_whose_message_was_lost(
    record: StressEntity, woken: list[int]
) -> None:
    head, behind = enqueue("stress.apply", record), enqueue("stress.apply", record)
    fresh = enqueue("stress.apply", StressEntity.all_objects.recreate(key="S2", payload="p"))
    Job.objects.filter(pk__in=[head.pk, behind.pk]).update(run_after=Now() - timedelta(hours=1))
    assert sweep()["dispatched"] == 1
    # Only the head of a lane, and not a job whose message may still be on its way.
    assert woken == [head.pk]
    assert fresh.pk not in woken


def test_sweep__redispatches_retries_as_soon_as_they_are_due(
    record: StressEntity, woken: list[int]
) -> None:
    claim = _claimed(record)
    ledger.finish(claim, Status.RETRY_WAIT, Reason.TRANSIENT, run_after=Now())
    assert sweep()["dispatched"] == 1
    assert woken == [claim.job.pk]


def test_sweep__retry_not_yet_due_is_left_alone(record: StressEntity, woken: list[int]) -> None:
    claim = _claimed(record)
    ledger.finish(
        claim, Status.RETRY_WAIT, Reason.TRANSIENT, run_after=Now() + timedelta(minutes=5)
    )
    assert sweep()["dispatched"] == 0


@pytest.fixture
def settled(transactional_db: None) -> Iterator[None]:
    yield
    connection.close()


def test_sweep__two_sweeps_at_once_are_harmless(settled: None, woken: list[int]) -> None:
    records = [StressEntity.all_objects.recreate(key=f"T{i}", payload="p") for i in range(6)]
    claims = [_claimed(r) for r in records]
    sending = [_claimed(StressEntity.all_objects.recreate(key="TX", payload="p"), "stress.upsert")]
    for c in sending:
        ledger.mark_sending(c, Q())
    for c in claims + sending:
        _expire(c.job)
    results = succeeded(run_together(sweep, sweep))
    assert sum(r["requeued"] for r in results) == len(claims)
    assert sum(r["uncertain"] for r in results) == 1
    for c in claims:
        assert JobEvent.objects.filter(job_id=c.job.pk, event="requeued").count() == 1
    assert Job.objects.filter(status=Status.UNCERTAIN).count() == 1
    # A duplicate re-dispatch is only a duplicate message: the claim runs the job once.


def test_sweep__installs_a_django_q_schedule_with_the_configured_interval(db: None) -> None:
    install_schedule()
    schedule = Schedule.objects.get(name="tombstones.sweep")
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == (
        "tombstones.sweep.run_sweep",
        Schedule.MINUTES,
        -1,
    )
    assert schedule.minutes == 1
    with override_settings(TOMBSTONES_SWEEP_MINUTES=5):
        install_schedule()
    assert Schedule.objects.get(name="tombstones.sweep").minutes == 5
    assert Schedule.objects.filter(name="tombstones.sweep").count() == 1
