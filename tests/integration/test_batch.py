"""The fast path: batched claims, writes and outcomes keep every guarantee of the classic path."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Value
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import run_together, succeeded, temp_handler
from tombstones import batch, ledger, worker
from tombstones.models import Job

pytestmark = pytest.mark.django_db

Status = Job.Status


def _touch(ctx: Any) -> None:
    ctx.update(phone=f"+{ctx.job.pk}")


@pytest.fixture
def queued(settings: Any) -> Any:
    """Jobs enqueued without running (the ORM broker holds their messages; no worker runs)."""
    settings.TOMBSTONES_Q_OPTIONS = {}

    def make(count: int, handler: str = "t.touch", **kwargs: Any) -> list[Job]:
        return [tombstones.enqueue(handler, CustomerFactory(), **kwargs) for _ in range(count)]

    with temp_handler("t.touch", _touch):
        yield make


def test_batch__one_wake_runs_every_due_job_in_few_statements(queued: Any, settings: Any) -> None:
    settings.TOMBSTONES_BATCH_SIZE = 20
    settings.TOMBSTONES_COALESCE_WAKES = True  # the mode in which one message serves many jobs
    jobs = queued(40)
    with CaptureQueriesContext(connection) as queries:
        worker.run(jobs[0].pk)
    assert set(Job.objects.values_list("status", flat=True)) == {Status.SUCCEEDED}
    assert Customer.objects.filter(version=2).count() == 40
    per_job = len(queries) / 40
    print(f"fast path: {per_job:.2f} statements per job")
    assert per_job <= 4, f"{per_job:.2f} statements per job"
    assert [ev.event for ev in jobs[5].history()] == [
        "enqueued",
        "claimed",
        "checked",
        "succeeded",
    ]


def test_batch__off_the_happy_path_jobs_take_the_classic_path(queued: Any) -> None:
    good = queued(3)
    deleted = queued(1)[0]
    Customer.objects.filter(pk=deleted.object_id).delete()

    def broken(ctx: Any) -> None:
        ctx.update(phone="+1")
        raise ValueError("boom")

    with temp_handler("t.broken_batch", broken):
        failing = queued(1, handler="t.broken_batch")[0]
        outcomes = batch.run_batch(ledger.claim_share(10)[0])
    by_job = {o.job_id: (o.status, o.reason) for o in outcomes}
    assert by_job[deleted.pk] == (Status.REJECTED, "source_deleted")
    assert by_job[failing.pk] == (Status.FAILED, "handler_error")
    assert all(by_job[j.pk] == (Status.SUCCEEDED, "") for j in good)
    assert Customer.objects.get(pk=failing.object_id).version == 1  # its write rolled back


def test_batch__a_lost_fence_rolls_back_the_batch_and_rereads(queued: Any) -> None:
    jobs = queued(3)
    victim = Customer.objects.get(pk=jobs[1].object_id)
    seen: list[int] = []

    def racing(ctx: Any) -> None:
        seen.append(ctx.job.pk)
        if ctx.job.pk == jobs[0].pk and len(seen) == 1:
            # Another writer bumps a record the batch is about to write.
            Customer.objects.filter(pk=victim.pk).update()
        ctx.update(phone="+5")

    with temp_handler("t.racing", racing):
        Job.objects.update(handler="t.racing")
        outcomes = batch.run_batch(ledger.claim_share(10)[0])
    assert {o.status for o in outcomes} == {Status.SUCCEEDED}
    victim.refresh_from_db()
    # The bump was rolled back with the batch; the classic pass then wrote it once.
    assert victim.version == 2
    assert victim.phone == "+5"


def test_batch__claims_only_lane_heads_and_keeps_order(queued: Any) -> None:
    customer = CustomerFactory()
    first = tombstones.enqueue("t.touch", customer)
    second = tombstones.enqueue("t.touch", customer)
    claims = ledger.claim_share(10)[0]
    assert [c.job.pk for c in claims] == [first.pk]
    batch.run_batch(claims)
    claims = ledger.claim_share(10)[0]
    assert [c.job.pk for c in claims] == [second.pk]
    batch.run_batch(claims)
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.finished_at <= second.started_at


def test_batch__a_zombie_batch_writes_nothing(queued: Any) -> None:
    jobs = queued(3)
    claims = ledger.claim_share(10)[0]
    # The worker stalls; its lease runs out and the sweep hands the jobs to someone else.
    Job.objects.update(lease_expires_at=Now() - Value(timedelta(seconds=1)))
    from tombstones.sweep import sweep

    assert sweep(dispatch=False)["requeued"] == 3
    again = ledger.claim_share(10)[0]
    assert len(again) == 3
    outcomes = batch.run_batch(claims)  # the zombie wakes up
    assert {(o.status, o.reason) for o in outcomes} == {(Status.RUNNING, "lease_expired")}
    assert Customer.objects.filter(version=1).count() == 3
    batch.run_batch(again)
    assert Customer.objects.filter(version=2).count() == 3
    assert set(Job.objects.values_list("status", flat=True)) == {Status.SUCCEEDED}
    assert all(j.events.filter(event="succeeded").count() == 1 for j in jobs)


def _q_task(result: dict[str, Any]) -> dict[str, Any]:
    """A successful django-q2 task of the worker, after mark_q_task saw it."""
    task = {"func": "tombstones.worker.run", "success": True, "result": result}
    worker.mark_q_task(None, task)
    return task


def test_q_task__carried_failures_fail_the_task_and_idle_wakes_are_not_stored() -> None:
    ran = {"job": 1, "status": "succeeded", "claimed": True}
    assert _q_task({**ran, "carried": [[2, "succeeded", ""]]})["success"] is True
    assert _q_task({**ran, "carried": [[2, "rejected", "x"]]})["success"] is False
    idle = _q_task({"job": 3, "status": "rejected", "claimed": False})
    assert idle["save"] is False


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_batch_claims__two_workers_take_disjoint_sets(postgres_only: None, settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}
    with temp_handler("t.touch", _touch):
        customers = [CustomerFactory() for _ in range(6)]
        for _round in range(50):
            Job.objects.all().delete()
            for customer in customers:  # two jobs per lane
                tombstones.enqueue("t.touch", customer)
                tombstones.enqueue("t.touch", customer)
            taken = [
                [c.job.pk for c in claims]
                for claims, _ in succeeded(run_together(*[lambda: ledger.claim_share(4)] * 2))
            ]
            assert not set(taken[0]) & set(taken[1])
            running = list(Job.objects.filter(status=Status.RUNNING).values_list("lane", flat=True))
            assert len(running) == len(set(running))  # never two running in one lane
            assert len(running) == len(taken[0]) + len(taken[1])


@pytest.mark.django_db(transaction=True)
def test_coalesced_wakes__one_waiting_message_serves_every_internal_job(settings: Any) -> None:
    from django_q.models import OrmQ

    settings.TOMBSTONES_Q_OPTIONS = {}  # the ORM broker; no cluster takes the messages
    settings.TOMBSTONES_COALESCE_WAKES = True
    with temp_handler("t.touch", _touch):
        jobs = [tombstones.enqueue("t.touch", CustomerFactory()) for _ in range(3)]
        external = tombstones.enqueue("customers.send_welcome", CustomerFactory())
        messages = [row.task["args"][0] for row in OrmQ.objects.order_by("id")]
        assert messages == [jobs[0].pk, external.pk]  # the external job keeps its own message
        worker.run(messages[0])
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)
    ) == {Status.SUCCEEDED}


@pytest.mark.django_db(transaction=True)
def test_coalesced_wakes__off_by_default(settings: Any) -> None:
    """Without it every job keeps its own message (and a message runs its own job only)."""
    from django_q.models import OrmQ

    settings.TOMBSTONES_Q_OPTIONS = {}
    with temp_handler("t.touch", _touch):
        for _ in range(3):
            tombstones.enqueue("t.touch", CustomerFactory())
    assert OrmQ.objects.count() == 3


# --- lane followers: a lane's queued jobs drained in the batch's transaction ------------------


def _lane(customer: Customer, handlers: list[str]) -> list[Job]:
    return [tombstones.enqueue(h, customer) for h in handlers]


def _refresh(jobs: list[Job]) -> list[str]:
    return [str(Job.objects.get(pk=j.pk).status) for j in jobs]


def test_followers__drain_lanes_in_order_in_few_statements(queued: Any) -> None:
    one, two = CustomerFactory(), CustomerFactory()
    lane_one = _lane(one, ["t.touch"] * 12)
    lane_two = _lane(two, ["t.touch"] * 4)
    with CaptureQueriesContext(connection) as queries:
        outcomes = batch.run_due(20, budget=40)[0]
    ran = [o.job_id for o in outcomes]
    assert ran[:2] == [lane_one[0].pk, lane_two[0].pk]  # the heads, then their lanes in order
    for lane in (lane_one, lane_two):
        assert [pk for pk in ran if pk in {j.pk for j in lane}] == [j.pk for j in lane]
    assert set(_refresh(lane_one + lane_two)) == {Status.SUCCEEDED}
    one.refresh_from_db()
    two.refresh_from_db()
    assert (one.version, two.version) == (13, 5)  # every job wrote once, each on the last version
    # Each job records what it found: the version its predecessor in the lane left.
    found = list(
        Job.objects.filter(pk__in=[j.pk for j in lane_one])
        .order_by("id")
        .values_list("found_version", flat=True)
    )
    assert found == list(range(2, 14))
    assert [ev.event for ev in lane_one[5].history()] == [
        "enqueued",
        "claimed",
        "checked",
        "succeeded",
    ]
    per_job = len(queries) / 16
    print(f"lane followers: {per_job:.2f} statements per job")
    assert per_job <= 3, f"{per_job:.2f} statements per job"


def test_followers__a_lane_stops_at_a_job_the_fast_path_may_not_run(queued: Any) -> None:
    customer = CustomerFactory()

    def noop(ctx: Any) -> None:
        return None

    with temp_handler("t.send", noop, external=True):
        jobs = _lane(customer, ["t.touch", "t.touch", "t.send", "t.touch"])
        batch.run_due(10, budget=30)
    assert _refresh(jobs) == [Status.SUCCEEDED, Status.SUCCEEDED, Status.QUEUED, Status.QUEUED]


def test_followers__a_failing_follower_rolls_back_the_followers_only(queued: Any) -> None:
    customer = CustomerFactory()

    def flaky(ctx: Any) -> None:
        ctx.update(phone="+9")
        if ctx.job.pk == jobs[2].pk:
            raise ValueError("boom")

    with temp_handler("t.flaky", flaky):
        jobs = _lane(customer, ["t.flaky"] * 4)
        outcomes = batch.run_due(10, budget=30)[0]
    assert [o.job_id for o in outcomes] == [jobs[0].pk]
    assert _refresh(jobs) == [Status.SUCCEEDED] + [Status.QUEUED] * 3
    customer.refresh_from_db()
    assert customer.version == 2  # the followers' writes rolled back with them
    assert not Job.objects.filter(pk__in=[j.pk for j in jobs[1:]], attempts__gt=0).exists()


def test_followers__a_deleted_record_stops_its_lane(queued: Any) -> None:
    customer = CustomerFactory()
    jobs = _lane(customer, ["t.touch", "t.touch"])
    Customer.objects.filter(pk=customer.pk).delete()  # after the enqueue, before the batch runs
    outcomes = batch.run_due(10, budget=30)[0]
    assert [(o.job_id, o.reason) for o in outcomes] == [(jobs[0].pk, "source_deleted")]
    assert _refresh(jobs) == [Status.REJECTED, Status.QUEUED]


def test_followers__a_cancelled_job_releases_its_lane_to_the_next(queued: Any) -> None:
    customer = CustomerFactory()
    jobs = _lane(customer, ["t.touch", "t.touch", "t.touch"])
    Job.objects.filter(pk=jobs[1].pk).update(status=Status.CANCELLED)  # staff, meanwhile
    outcomes = batch.run_due(10, budget=30)[0]
    assert [o.job_id for o in outcomes] == [jobs[0].pk, jobs[2].pk]
    assert _refresh(jobs) == [Status.SUCCEEDED, Status.CANCELLED, Status.SUCCEEDED]


def test_followers__one_no_longer_claimable_when_recorded_rolls_the_followers_back(
    queued: Any,
) -> None:
    customer = CustomerFactory()

    def postpone_second(ctx: Any) -> None:
        ctx.update(phone="+2")
        if ctx.job.pk == jobs[1].pk:
            # As if it changed after the followers were read: not due any more.
            Job.objects.filter(pk=ctx.job.pk).update(run_after=Now() + Value(timedelta(hours=1)))

    with temp_handler("t.postpone", postpone_second):
        jobs = _lane(customer, ["t.postpone"] * 3)
        outcomes = batch.run_due(10, budget=30)[0]
    assert [o.job_id for o in outcomes] == [jobs[0].pk]
    assert _refresh(jobs) == [Status.SUCCEEDED, Status.QUEUED, Status.QUEUED]
    customer.refresh_from_db()
    assert customer.version == 2


# --- run_due: fast handlers, claimed in the transaction that runs them ------------------------


def _versions() -> dict[int, int]:
    return dict(Customer.all_objects.values_list("pk", "version"))


def test_run_due__heads_and_followers_in_one_transaction_in_few_statements(queued: Any) -> None:
    one, two = CustomerFactory(), CustomerFactory()
    lanes = [_lane(one, ["t.touch"] * 8), _lane(two, ["t.touch"] * 8)]
    singles = queued(4)
    jobs = lanes[0] + lanes[1] + singles
    with CaptureQueriesContext(connection) as queries:
        outcomes, left = batch.run_due(20, budget=100)
    assert left == []
    ran = [o.job_id for o in outcomes]
    assert sorted(ran) == sorted(j.pk for j in jobs)
    for lane in lanes:
        assert [pk for pk in ran if pk in {j.pk for j in lane}] == [j.pk for j in lane]
    assert set(_refresh(jobs)) == {Status.SUCCEEDED}
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    one.refresh_from_db()
    assert one.version == 9
    assert [ev.event for ev in lanes[0][0].history()] == [
        "enqueued",
        "claimed",
        "checked",
        "succeeded",
    ]
    # Never seen running: the only statements that change a job are the two that record the
    # successes (the heads', then the followers').
    job_writes = [q for q in queries if q["sql"].startswith('UPDATE "tombstones_job"')]
    assert len(job_writes) == 2
    per_job = len(queries) / len(jobs)
    print(f"run_due: {per_job:.2f} statements per job")
    assert per_job <= 1.8, f"{per_job:.2f} statements per job"


def test_run_due__a_head_run_by_another_worker_after_the_look_is_not_run_again(
    queued: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look is no claim; the batch's transaction decides (lock, then a conditional UPDATE)."""
    jobs = queued(3)
    looked = ledger.due_heads(10)
    worker.run_job(jobs[0].pk)  # another worker, between this one's look and its transaction
    versions = _versions()
    monkeypatch.setattr(ledger, "due_heads", lambda limit, using=None: looked)
    outcomes, _ = batch.run_due(10, budget=10)
    assert sorted(o.job_id for o in outcomes) == [jobs[1].pk, jobs[2].pk]
    after = _versions()
    assert after[int(jobs[0].object_id)] == versions[int(jobs[0].object_id)]  # not written again
    assert [after[int(j.object_id)] for j in jobs[1:]] == [2, 2]
    assert set(_refresh(jobs)) == {Status.SUCCEEDED}
    assert jobs[0].events.filter(event="succeeded").count() == 1


def test_run_due__a_lost_fence_rolls_back_and_the_classic_path_claims_each(queued: Any) -> None:
    jobs = queued(3)
    victim = Customer.objects.get(pk=jobs[1].object_id)
    calls: list[int] = []

    def racing(ctx: Any) -> None:
        calls.append(ctx.job.pk)
        if len(calls) == 1:
            Customer.objects.filter(pk=victim.pk).update()  # another writer, inside the batch
        ctx.update(phone="+5")

    with temp_handler("t.racing", racing):
        Job.objects.update(handler="t.racing")
        outcomes, _ = batch.run_due(10, budget=10)
    assert {o.status for o in outcomes} == {Status.SUCCEEDED}
    victim.refresh_from_db()
    assert (victim.version, victim.phone) == (2, "+5")  # the bump rolled back; written once
    # The classic path claimed each job with a lease (a token), one claim per job.
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert all(j.events.filter(event="claimed").count() == 1 for j in jobs)


@pytest.mark.django_db(transaction=True)
def test_run_due__two_workers_at_once_run_each_job_once(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}
    with temp_handler("t.touch", _touch):
        customers = [CustomerFactory() for _ in range(4)]
        for _round in range(30):
            Job.objects.all().delete()
            before = _versions()
            jobs = [tombstones.enqueue("t.touch", c) for c in customers for _ in range(3)]
            results = succeeded(run_together(*[lambda: batch.run_due(20, budget=100)] * 2))
            ran = [o.job_id for outcomes, _ in results for o in outcomes]
            assert len(ran) == len(set(ran)), "a job ran in both workers"
            batch.run_due(20, budget=100)  # whatever a rolled-back batch left queued
            assert set(_refresh(jobs)) == {Status.SUCCEEDED}
            assert set(Job.objects.values_list("attempts", flat=True)) == {1}
            after = _versions()
            assert all(after[c.pk] == before[c.pk] + 3 for c in customers), (before, after)
