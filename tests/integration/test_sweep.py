"""The periodic sweep (the fallback): lease rescue, uncertain after sending, expiry, resume, a
wake-up when anything is due; its django-q2 schedule; two sweeps at once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Q
from django.db.models.functions import Now
from django.test.utils import override_settings
from django.utils import timezone
from django_q.models import Schedule

from project.stress.models import StressEntity
from tests.jobkit import claim, record, run_together, succeeded
from tombstones.exceptions import LeaseLost
from tombstones.jobs import ledger
from tombstones.jobs.engine import sweep as sweep_module
from tombstones.jobs.engine.sweep import install_schedule, sweep
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job, JobEvent

Status = Job.Status
Reason = Job.Reason


@pytest.fixture
def woken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wake-ups the sweep sent (the message itself is not sent)."""
    calls: list[int] = []
    monkeypatch.setattr(sweep_module, "wake_soon", lambda job_id, **options: calls.append(job_id))
    return calls


@pytest.fixture
def entity(db: None) -> StressEntity:
    return StressEntity.all_objects.recreate(key="S1", payload="p")


@pytest.fixture(autouse=True)
def _no_wake_on_enqueue(monkeypatch: pytest.MonkeyPatch) -> None:
    # Enqueued jobs stay queued: these tests drive the sweep, not a worker.
    monkeypatch.setattr("tombstones.jobs.enqueue.wake_soon", lambda job_id, **options: None)


def _claimed(entity: StressEntity, handler: str = "stress.apply") -> ledger.Claim:
    return claim(enqueue(handler, entity))


def _expire(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(lease_expires_at=Now() - timedelta(seconds=1))


def test_sweep__expired_lease_returns_the_job_to_the_queue(
    entity: StressEntity, woken: list[int]
) -> None:
    taken = _claimed(entity)
    assert sweep()["requeued"] == 0  # lease still valid
    _expire(taken.jobs[0])
    counts = sweep(dispatch=False)
    assert counts["requeued"] == 1
    job = Job.objects.get(pk=taken.jobs[0].pk)
    assert (job.status, job.reason, job.claim_token, job.lease_expires_at) == (
        Status.QUEUED,
        Reason.LEASE_EXPIRED,
        "",
        None,
    )
    assert job.attempts == 1  # claimed alone: the claim without an outcome counts
    assert JobEvent.objects.filter(job=job, event=JobEvent.Event.REQUEUED).count() == 1
    with pytest.raises(LeaseLost):
        record(taken, Status.SUCCEEDED)


def test_sweep__expired_lease_after_sending_is_uncertain(entity: StressEntity) -> None:
    taken = _claimed(entity, "stress.upsert")
    assert ledger.mark_sending(taken, taken.jobs[0], Q())
    _expire(taken.jobs[0])
    assert sweep(dispatch=False)["uncertain"] == 1
    job = Job.objects.get(pk=taken.jobs[0].pk)
    assert (job.status, job.reason) == (Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN)
    assert job.finished_at is not None


def test_sweep__old_jobs_expire_and_release_their_lane(entity: StressEntity) -> None:
    old, young = enqueue("stress.apply", entity), enqueue("stress.apply", entity)
    Job.objects.filter(pk=old.pk).update(created_at=Now() - timedelta(days=8))
    assert sweep(dispatch=False)["expired"] == 1
    assert Job.objects.get(pk=old.pk).status == Status.EXPIRED
    assert claim(young) is not None


def test_sweep__paused_jobs_are_resumed_in_their_place(entity: StressEntity) -> None:
    taken = _claimed(entity)
    behind = enqueue("stress.apply", entity)
    record(taken, Status.PAUSED, Reason.TOMBSTONE_UNREADABLE)
    assert not Job.objects.claimable().filter(pk=behind.pk).exists()  # a paused job holds
    assert sweep(dispatch=False)["resumed"] == 1
    job = Job.objects.get(pk=taken.jobs[0].pk)
    assert (job.status, job.reason) == (Status.QUEUED, Reason.NONE)
    assert JobEvent.objects.filter(job=job, event=JobEvent.Event.RESUMED).count() == 1
    assert list(Job.objects.claimable().values_list("id", flat=True)) == [job.pk]


def test_sweep__wakes_a_worker_when_a_lane_head_is_due(
    entity: StressEntity, woken: list[int]
) -> None:
    head, _behind = enqueue("stress.apply", entity), enqueue("stress.apply", entity)
    assert sweep()["dispatched"] == 1
    assert woken == [head.pk]  # one wake-up: its pump runs every due lane head


def test_sweep__retry_not_yet_due_is_left_alone(entity: StressEntity, woken: list[int]) -> None:
    taken = _claimed(entity)
    record(taken, Status.RETRY_WAIT, Reason.TRANSIENT, retry_in=timedelta(minutes=5))
    assert sweep()["dispatched"] == 0
    assert woken == []


@pytest.fixture
def settled(transactional_db: None) -> Iterator[None]:
    yield
    connection.close()


def test_sweep__two_sweeps_at_once_are_harmless(settled: None, woken: list[int]) -> None:
    entities = [StressEntity.all_objects.recreate(key=f"T{i}", payload="p") for i in range(6)]
    claims = [_claimed(e) for e in entities]
    sending = [_claimed(StressEntity.all_objects.recreate(key="TX", payload="p"), "stress.upsert")]
    for c in sending:
        ledger.mark_sending(c, c.jobs[0], Q())
    for c in claims + sending:
        _expire(c.jobs[0])
    results = succeeded(run_together(sweep, sweep))
    assert sum(r["requeued"] for r in results) == len(claims)
    assert sum(r["uncertain"] for r in results) == 1
    for c in claims:
        assert JobEvent.objects.filter(job_id=c.jobs[0].pk, event="requeued").count() == 1
    assert Job.objects.filter(status=Status.UNCERTAIN).count() == 1


def test_sweep__installs_a_django_q_schedule_with_the_configured_interval(db: None) -> None:
    install_schedule()
    schedule = Schedule.objects.get(name="tombstones.sweep")
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == (
        "tombstones.worker.run_sweep",
        Schedule.MINUTES,
        -1,
    )
    assert schedule.minutes == 1
    with override_settings(TOMBSTONES_SWEEP_MINUTES=5):
        install_schedule()
    assert Schedule.objects.get(name="tombstones.sweep").minutes == 5
    assert Schedule.objects.filter(name="tombstones.sweep").count() == 1


@pytest.mark.parametrize("cluster", [None, "jobs"])
def test_sweep__its_schedule_fires_on_the_cluster_the_jobs_go_to(
    transactional_db: None, settings: Any, monkeypatch: pytest.MonkeyPatch, cluster: str | None
) -> None:
    """django-q2's own scheduler, run as the only cluster (named like the jobs' one), sends the
    sweep: a schedule without a cluster fires on a cluster of the default name only. (The
    scheduler closes old connections: a transactional test.)"""
    from django_q import scheduler as q_scheduler
    from django_q.brokers import get_broker
    from django_q.conf import Conf
    from django_q.signing import SignedPackage

    settings.TOMBSTONES_Q_OPTIONS = {"cluster": cluster} if cluster else {}
    name = cluster or Conf.PREFIX
    monkeypatch.setattr(Conf, "CLUSTER_NAME", name)
    install_schedule()
    Schedule.objects.filter(name="tombstones.sweep").update(
        next_run=timezone.now() - timedelta(seconds=1)
    )
    broker = get_broker(name)
    broker.purge_queue()
    q_scheduler.scheduler(broker=broker)
    sent = [SignedPackage.loads(payload).get("func") for _, payload in broker.dequeue() or []]
    assert sent == ["tombstones.worker.run_sweep"]
