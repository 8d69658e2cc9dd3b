"""The one road (tombstones.runner): claims of many lane heads keep every guarantee of one job."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Value
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import events, make_due, run_together, succeeded, temp_handler
from tombstones import worker
from tombstones.jobs import ledger
from tombstones.jobs.engine import runner
from tombstones.jobs.engine.sweep import sweep
from tombstones.models import Job

pytestmark = pytest.mark.django_db

Status, Reason = Job.Status, Job.Reason


def _touch(ctx: Any) -> None:
    ctx.update(phone=f"+{ctx.job.pk}")


@pytest.fixture
def queued(settings: Any) -> Any:
    """Jobs enqueued without running (the ORM broker holds their message; no worker runs)."""
    settings.TOMBSTONES_Q_OPTIONS = {}

    def make(count: int, handler: str = "t.touch", **kwargs: Any) -> list[Job]:
        return [tombstones.enqueue(handler, CustomerFactory(), **kwargs) for _ in range(count)]

    with temp_handler("t.touch", _touch):
        yield make


def _statuses(jobs: list[Job]) -> list[str]:
    found = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    return [str(found[j.pk]) for j in jobs]


def _pump() -> list[ledger.Outcome]:
    return runner.pump()


# --- the happy path, in few statements --------------------------------------------------------


def test_runner__one_wake_runs_every_due_job_in_few_statements(queued: Any) -> None:
    jobs = queued(40)
    with CaptureQueriesContext(connection) as queries:
        result = worker.run(jobs[0].pk)
    assert len(result["carried"]) == 40
    assert set(_statuses(jobs)) == {Status.SUCCEEDED}
    assert Customer.objects.filter(version=2).count() == 40
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    # Transaction control apart (as bench/ counts it): each job's savepoint and its release.
    control = [q for q in queries if q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
    per_job = (len(queries) - len(control)) / 40
    print(f"one road: {per_job:.2f} statements per job, {len(control) / 40:.2f} savepoint ones")
    # One write per job, the outcomes' UPDATE per group, and a few statements per claim (the
    # hinted lanes, their jobs, the UPDATE that takes them; on PostgreSQL the lanes' and jobs'
    # locks), the hints the finished jobs left cleared by the next claim in one statement.
    assert per_job <= 1.65, f"{per_job:.2f} statements per job"
    # One per job (kept to the commit, never released), and the few of the claims' and groups'
    # own transactions (savepoints here, in the test's transaction: each claim statement, the
    # last one that finds nothing included, gets one).
    assert len(control) / 40 <= 1.4, f"{len(control)} savepoint statements for 40 jobs"
    assert events(jobs[5]) == ["enqueued", "claimed", "checked", "succeeded"]


def test_runner__a_claim_by_default_fills_one_group(
    queued: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default batch is a group's worth of quick jobs (issue 34): a claim's fixed statements
    (the look, the lanes, the lock, the take, the check's read, the outcomes) are shared by as
    many jobs as one transaction may hold, not by 20 of them."""
    from tombstones.conf import tombstone_settings
    from tombstones.jobs.engine import group

    assert tombstone_settings.BATCH_SIZE == group.GROUP_JOBS
    # The worker's last claim ran quickly: it takes all it sees (up to the batch), not a share.
    runner.current().quick = True
    jobs = queued(group.GROUP_JOBS + 5)
    sizes: list[int] = []
    claim = ledger.claim

    def counted(*args: Any, **kwargs: Any) -> ledger.Claim | None:
        taken = claim(*args, **kwargs)
        sizes.append(len(taken.jobs) if taken is not None else 0)
        return taken

    monkeypatch.setattr(ledger, "claim", counted)
    assert len(_pump()) == len(jobs)
    assert sizes == [group.GROUP_JOBS, 5, 0]
    assert set(_statuses(jobs)) == {Status.SUCCEEDED}


def test_runner__lanes_run_in_order_one_job_per_lane_per_claim(queued: Any) -> None:
    one, two = CustomerFactory(), CustomerFactory()
    lane_one = [tombstones.enqueue("t.touch", one) for _ in range(12)]
    lane_two = [tombstones.enqueue("t.touch", two) for _ in range(4)]
    ran = [o.job_id for o in _pump()]
    for lane in (lane_one, lane_two):
        assert [pk for pk in ran if pk in {j.pk for j in lane}] == [j.pk for j in lane]
    one.refresh_from_db()
    two.refresh_from_db()
    assert (one.version, two.version) == (13, 5)
    # Each job found the version its predecessor in the lane left.
    found = list(
        Job.objects.filter(pk__in=[j.pk for j in lane_one])
        .order_by("id")
        .values_list("found_version", flat=True)
    )
    assert found == list(range(2, 14))


def test_runner__off_the_happy_path_each_job_gets_its_own_outcome(queued: Any) -> None:
    good = queued(3)
    deleted = queued(1)[0]
    Customer.objects.filter(pk=deleted.object_id).delete()

    def broken(ctx: Any) -> None:
        ctx.update(phone="+1")
        raise ValueError("boom")

    with temp_handler("t.broken", broken):
        failing = queued(1, handler="t.broken")[0]
        outcomes = _pump()
    by_job = {o.job_id: (o.status, o.reason) for o in outcomes}
    assert by_job[deleted.pk] == (Status.REJECTED, Reason.SOURCE_DELETED)
    assert by_job[failing.pk] == (Status.FAILED, Reason.HANDLER_ERROR)
    assert all(by_job[j.pk] == (Status.SUCCEEDED, "") for j in good)
    assert Customer.objects.get(pk=failing.object_id).version == 1  # its write rolled back
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}


def test_runner__a_lost_fence_rolls_back_that_job_alone_and_it_reads_again(queued: Any) -> None:
    """The first job's handler moves the second job's record (an unfenced write, inside the
    group): the second job's fenced write loses, its savepoint alone rolls back, and it decides
    again on the record as the first left it. The first job's work stays; nothing runs twice."""
    jobs = queued(3)
    victim = Customer.objects.get(pk=jobs[1].object_id)
    calls: list[int] = []

    def racing(ctx: Any) -> None:
        calls.append(ctx.job.pk)
        if len(calls) == 1:
            Customer.objects.filter(pk=victim.pk).update()  # another write, inside the group
        ctx.update(phone="+5")

    with temp_handler("t.racing", racing):
        Job.objects.update(handler="t.racing")
        outcomes = _pump()
    assert {o.status for o in outcomes} == {Status.SUCCEEDED}
    assert calls == [jobs[0].pk, jobs[1].pk, jobs[1].pk, jobs[2].pk]
    victim.refresh_from_db()
    assert (victim.version, victim.phone) == (3, "+5")  # the first job's bump kept; written once
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert Job.objects.get(pk=jobs[1].pk).rereads == 1
    assert events(jobs[1]) == ["enqueued", "claimed", "checked", "reread", "succeeded"]
    assert all(events(j).count("claimed") == 1 for j in jobs)


def test_runner__a_zombie_claim_writes_nothing(queued: Any) -> None:
    jobs = queued(3)
    zombie = ledger.claim(10)
    assert zombie is not None
    assert len(zombie.jobs) == 3
    # The worker stalls; its leases run out and the jobs are handed to someone else.
    Job.objects.update(lease_expires_at=Now() - Value(timedelta(seconds=1)))
    assert sweep(dispatch=False)["requeued"] == 3
    rescuer = ledger.claim(10)
    assert rescuer is not None
    assert len(rescuer.jobs) == 1  # the requeued jobs are suspects: each is claimed alone
    ran, _ = runner.run_claim(zombie)  # the zombie wakes up
    assert ran == []
    assert Customer.objects.filter(version=1).count() == 3
    runner.run_claim(rescuer)
    _pump()
    assert Customer.objects.filter(version=2).count() == 3
    assert set(_statuses(jobs)) == {Status.SUCCEEDED}
    assert all(events(j).count("succeeded") == 1 for j in jobs)


def test_runner__a_claim_reads_its_lanes_and_takes_them_in_few_statements(queued: Any) -> None:
    """No count before the claim: the hinted lanes, their first jobs, the UPDATE that takes
    them (PostgreSQL adds the lock of the jobs taken)."""
    jobs = queued(3)
    with CaptureQueriesContext(connection) as captured:
        taken = ledger.claim(10, whole=True)
    assert taken is not None
    assert [j.pk for j in taken.jobs] == [j.pk for j in jobs]
    data = [q["sql"] for q in captured if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    data = [sql for sql in data if sql not in ("BEGIN", "COMMIT")]
    assert len(data) == (4 if connection.vendor == "postgresql" else 3), data
    assert data[-1].startswith("UPDATE"), data
    assert " RETURNING " in data[-1], data
    assert _statuses(jobs) == [Status.RUNNING] * 3
    assert all(j.claim_token == taken.token and j.attempts == 1 for j in taken.jobs)
    # Every column as stored, the datetimes aware (PostgreSQL returns them in UTC, no zone).
    times = ("created_at", "run_after", "queued_at", "started_at", "lease_expires_at")
    for job in taken.jobs:
        stored = Job.objects.get(pk=job.pk)
        assert [getattr(job, f.attname) for f in Job._meta.concrete_fields] == [
            getattr(stored, f.attname) for f in Job._meta.concrete_fields
        ]
        assert all(getattr(job, name).utcoffset() == timedelta(0) for name in times)
    assert taken.clock is not None
    assert taken.clock[0] == Job.objects.get(pk=jobs[0].pk).started_at
    assert ledger.claim(10) is None  # nothing left: a statement that takes nothing


# --- django-q2's task table ----------------------------------------------------------------


def _q_task(result: dict[str, Any]) -> dict[str, Any]:
    """A successful django-q2 task of the worker, after mark_q_task saw it."""
    task = {"func": "tombstones.worker.run", "success": True, "result": result}
    worker.mark_q_task(None, task)
    return task


def test_q_task__stored_only_when_every_carried_job_succeeded() -> None:
    assert "save" not in _q_task({"job": 1, "carried": [[1, "succeeded", ""]]})
    for other in ("rejected", "failed", "retry_wait", "uncertain"):
        task = _q_task({"job": 1, "carried": [[1, "succeeded", ""], [2, other, "x"]]})
        assert (task["success"], task["save"]) == (True, False)
    assert _q_task({"job": 1, "carried": []})["save"] is False
    worker_error = {"func": "tombstones.worker.run", "success": False, "result": "Traceback"}
    worker.mark_q_task(None, worker_error)
    assert "save" not in worker_error  # a worker error stays django-q2's to show


# --- lanes with delays and retries ------------------------------------------------------------


def test_lanes__a_delayed_job_does_not_hold_back_a_later_immediate_one(queued: Any) -> None:
    customer = CustomerFactory()
    later = timezone_now() + timedelta(hours=1)
    delayed = tombstones.enqueue("t.touch", customer, run_after=later)
    immediate = tombstones.enqueue("t.touch", customer)
    assert [o.job_id for o in _pump()] == [immediate.pk]
    # Now due (its hint comes due with it).
    Job.objects.filter(pk=delayed.pk).update(run_after=Now(), queued_at=Now(), ready_at=Now())
    assert [o.job_id for o in _pump()] == [delayed.pk]
    delayed.refresh_from_db()
    assert delayed.found_version == 3  # it ran on what the immediate job left: fenced, in order


def test_lanes__a_retry_keeps_its_place_and_holds_its_lane(queued: Any, settings: Any) -> None:
    settings.TOMBSTONES_RETRY_BACKOFF = timedelta(seconds=30)
    customer = CustomerFactory()
    tries: list[int] = []

    def once_flaky(ctx: Any) -> None:
        tries.append(ctx.job.pk)
        if len(tries) == 1:
            raise tombstones.TransientError("upstream busy")
        ctx.update(phone="+7")

    with temp_handler("t.once_flaky", once_flaky):
        first = tombstones.enqueue("t.once_flaky", customer)
        assert [o.status for o in _pump()] == [Status.RETRY_WAIT]
        second = tombstones.enqueue("t.once_flaky", customer)
        assert _pump() == []  # the retry holds the lane
        make_due(first)
        assert [o.job_id for o in _pump()] == [first.pk, second.pk]
    assert tries == [first.pk, first.pk, second.pk]


def test_lanes__a_run_after_in_the_past_does_not_overtake(queued: Any) -> None:
    customer = CustomerFactory()
    first = tombstones.enqueue("t.touch", customer)
    second = tombstones.enqueue("t.touch", customer, run_after=timezone_now() - timedelta(days=1))
    assert [o.job_id for o in _pump()] == [first.pk, second.pk]


def timezone_now() -> Any:
    from django.utils import timezone

    return timezone.now()


# --- poison jobs: a claim without an outcome counts, and is capped ---------------------------


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
def test_poison__a_handler_that_exits_ends_failed_crashed_after_max_attempts(
    queued: Any, settings: Any, error: type[BaseException]
) -> None:
    settings.TOMBSTONES_MAX_ATTEMPTS = 3
    customer = CustomerFactory()

    def exits(ctx: Any) -> None:
        ctx.update(phone="+9")
        raise error

    with temp_handler("t.exits", exits):
        poison = tombstones.enqueue("t.exits", customer)
        behind = tombstones.enqueue("t.touch", customer)
        others = queued(2)  # claimed with the poison job: innocent
        for attempt in range(1, 4):
            with pytest.raises(error):
                _pump()
            poison.refresh_from_db()
            assert poison.attempts == attempt
            assert Customer.objects.get(pk=customer.pk).version == 1  # rolled back each time
            make_due(poison)
        assert (poison.status, poison.reason) == (Status.FAILED, Reason.CRASHED)
        assert events(poison).count("claimed") == 3
        # The lane moves on; the jobs claimed with the poison one were given back, uncharged.
        assert sorted(o.job_id for o in _pump()) == sorted([behind.pk] + [o.pk for o in others])
    assert _statuses(others) == [Status.SUCCEEDED, Status.SUCCEEDED]
    innocent = Job.objects.filter(pk__in=[o.pk for o in others])
    assert set(innocent.values_list("attempts", flat=True)) == {1}


def test_poison__an_external_call_that_exits_the_worker_is_its_own_crash(queued: Any) -> None:
    """A handler that exits the worker while its external call goes out is the claim's culprit:
    the call may have landed, so the job ends ``uncertain`` and is never sent again by itself.
    (The check that ran just before the call used to leave it marked idle: it was given back as
    an innocent job, ``queued`` again with its call already out.)"""
    customer = CustomerFactory()
    calls: list[int] = []

    def exits(ctx: Any) -> None:
        calls.append(ctx.job.pk)
        raise SystemExit

    with temp_handler("t.call_exits", exits, external=True):
        job = tombstones.enqueue("t.call_exits", customer)
        with pytest.raises(SystemExit):
            _pump()
        job.refresh_from_db()
        assert (job.status, job.reason) == (Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN)
        assert job.attempts == 1
        make_due(job)
        _pump()
    assert calls == [job.pk]  # sent once, never again by itself


def test_poison__a_crash_in_the_check_is_capped_and_the_pump_goes_on(
    queued: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.TOMBSTONES_MAX_ATTEMPTS = 2
    customer = CustomerFactory()
    from tombstones.jobs.engine import check

    real = check.get_handler

    def broken_lookup(name: str) -> Any:
        if name == "t.touch_broken":
            raise RuntimeError("a handlers module that fails to import")
        return real(name)

    monkeypatch.setattr(check, "get_handler", broken_lookup)
    with temp_handler("t.touch_broken", _touch):
        poison = tombstones.enqueue("t.touch_broken", customer)
        behind = tombstones.enqueue("t.touch", customer)
        _pump()  # logged, not raised: the pump goes on with the other jobs
        poison.refresh_from_db()
        assert (poison.status, poison.reason, poison.attempts) == (
            Status.RETRY_WAIT,
            Reason.CRASHED,
            1,
        )
        assert poison.error_class == "builtins.RuntimeError"
        make_due(poison)
        _pump()
    poison.refresh_from_db()
    assert (poison.status, poison.reason, poison.attempts) == (Status.FAILED, Reason.CRASHED, 2)
    behind.refresh_from_db()
    assert behind.status == Status.SUCCEEDED


def test_poison__a_batch_that_lapses_is_given_back_and_its_jobs_claimed_alone(
    queued: Any, settings: Any
) -> None:
    settings.TOMBSTONES_MAX_ATTEMPTS = 2
    jobs = queued(3)
    dead = ledger.claim(10)  # a worker took them together, then was killed
    assert dead is not None
    assert len(dead.jobs) == 3
    Job.objects.update(lease_expires_at=Now() - Value(timedelta(seconds=1)))
    assert ledger.take_back_lapsed()["requeued"] == 3
    rows = Job.objects.filter(pk__in=[j.pk for j in jobs])
    # Which one killed the worker is unknown: none of them is charged for it.
    assert set(rows.values_list("attempts", "reason")) == {(0, Reason.LEASE_EXPIRED)}
    alone = ledger.claim(10)
    assert alone is not None
    assert len(alone.jobs) == 1
    # Killed again, alone: that claim counts; at the cap it ends failed/crashed.
    Job.objects.filter(pk=alone.jobs[0].pk).update(
        attempts=2, lease_expires_at=Now() - Value(timedelta(seconds=1))
    )
    assert ledger.take_back_lapsed()["crashed"] == 1
    assert Job.objects.get(pk=alone.jobs[0].pk).reason == Reason.CRASHED


# --- leases: the keeper, heartbeats -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_keeper__a_claim_held_longer_than_its_lease_is_never_taken_back(
    postgres_only: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four slow handlers in one claim of a lone worker, lease 0.6 s, sweeps every 50 ms: the
    worker keeps the leases while it holds the jobs (no heartbeat in the handler), so each runs
    once.

    PostgreSQL only: on SQLite a sweep that finds a lapsed lease waits for the handlers' write
    lock like the keeper's renewal does, and starves behind the next group's, so it could not
    take anything back while the claim runs (and a lease cannot lapse there in production
    either: django-q2's timeout, below the lease by tombstones.E023, ends the claim first)."""
    settings.TOMBSTONES_Q_OPTIONS = {}
    monkeypatch.setattr(runner, "cluster_workers", lambda: 1)  # nobody to hand jobs back to
    settings.TOMBSTONES_LEASE = timedelta(seconds=0.6)
    slept: list[int] = []

    def slow(ctx: Any) -> None:
        slept.append(ctx.job.pk)
        threading.Event().wait(0.5)
        ctx.update(phone="+8")

    done = threading.Event()
    swept: list[tuple[float, float, dict[str, int]]] = []  # start, end (monotonic), what it did

    def sweeper() -> None:
        try:
            while not done.wait(0.05):
                began = time.monotonic()
                did = sweep(dispatch=False)
                swept.append((began, time.monotonic(), did))
        finally:
            connection.close()

    with temp_handler("t.slow", slow):
        jobs = [tombstones.enqueue("t.slow", CustomerFactory()) for _ in range(4)]
        thread = threading.Thread(target=sweeper)
        thread.start()
        try:
            claimed = time.monotonic()
            ran = _pump()
            ended = time.monotonic()
        finally:
            done.set()
            thread.join(30)
    # The sweeps that could have taken a lease back: after it would have lapsed unrenewed, while
    # the claim still ran (about 24 on a quiet machine, 9 in a CI cell of 4 processes on 2 cores).
    lapsed = claimed + settings.TOMBSTONES_LEASE.total_seconds()
    assert sum(lapsed < began and end < ended for began, end, _ in swept) >= 5
    assert sum(did["requeued"] for _, _, did in swept) == 0
    assert sorted(o.job_id for o in ran) == sorted(j.pk for j in jobs)
    assert sorted(slept) == sorted(j.pk for j in jobs)
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_heartbeat__inside_the_act_transaction_commits_at_once(
    postgres_only: None, settings: Any
) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}
    seen: list[Any] = []

    def read_lease(pk: int) -> Any:
        try:
            return Job.objects.filter(pk=pk).values_list("lease_expires_at", flat=True).get()
        finally:
            connection.close()

    def beating(ctx: Any) -> None:
        pk = ctx.job.pk
        before = succeeded(run_together(lambda: read_lease(pk)))[0]
        assert ctx.heartbeat() is True
        after = succeeded(run_together(lambda: read_lease(pk)))[0]  # another connection sees it
        seen.extend([before, after])
        ctx.update(phone="+6")

    with temp_handler("t.beating", beating):
        job = tombstones.enqueue("t.beating", CustomerFactory())
        ran = _pump()
    assert [o.status for o in ran] == [Status.SUCCEEDED]
    assert seen[1] > seen[0]
    assert Job.objects.get(pk=job.pk).attempts == 1


# --- concurrency: real connections ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_claims__two_workers_take_disjoint_sets(postgres_only: None, settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}
    with temp_handler("t.touch", _touch):
        customers = [CustomerFactory() for _ in range(6)]
        for _round in range(50):
            Job.objects.all().delete()
            for customer in customers:  # two jobs per lane
                tombstones.enqueue("t.touch", customer)
                tombstones.enqueue("t.touch", customer)
            claims = succeeded(run_together(*[lambda: ledger.claim(4, workers=2)] * 2))
            taken = [[j.pk for j in c.jobs] if c else [] for c in claims]
            assert not set(taken[0]) & set(taken[1])
            running = list(Job.objects.filter(status=Status.RUNNING).values_list("lane", flat=True))
            assert len(running) == len(set(running))  # never two running in one lane
            assert len(running) == len(taken[0]) + len(taken[1])


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_claims__four_workers_take_disjoint_sets_of_one_job_lanes(
    postgres_only: None, settings: Any
) -> None:
    """Four claims at once over one-job lanes: disjoint, and together they take every head
    (SKIP LOCKED: a claim does not wait for, nor fail on, the heads another one is taking)."""
    settings.TOMBSTONES_Q_OPTIONS = {}
    with temp_handler("t.touch", _touch):
        customers = [CustomerFactory() for _ in range(16)]
        for _round in range(40):
            Job.objects.all().delete()
            for customer in customers:
                tombstones.enqueue("t.touch", customer)
            # workers=4, as the pump passes its cluster's: the lanes a claim looks into cover
            # every worker claiming at once.
            claims = succeeded(run_together(*[lambda: ledger.claim(4, workers=4, whole=True)] * 4))
            taken = [j.pk for c in claims if c for j in c.jobs]
            assert len(taken) == len(set(taken)) == 16, claims


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_claims__a_head_another_transaction_holds_is_skipped_not_waited_for(
    postgres_only: None, settings: Any
) -> None:
    """A head locked by another connection (a worker claiming it right now, staff cancelling
    it) is skipped: the claim takes the others at once (lock_timeout makes a wait fail)."""
    settings.TOMBSTONES_Q_OPTIONS = {}
    with temp_handler("t.touch", _touch):
        jobs = [tombstones.enqueue("t.touch", CustomerFactory()) for _ in range(3)]
        locked, release = threading.Event(), threading.Event()

        def hold_first() -> None:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=jobs[0].pk)
                locked.set()
                release.wait(30)
            connection.close()

        holder = threading.Thread(target=hold_first)
        holder.start()
        try:
            assert locked.wait(30)
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '2s'")
            taken = ledger.claim(10, whole=True)
        finally:
            release.set()
            holder.join(30)
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")
        assert taken is not None
        assert sorted(j.pk for j in taken.jobs) == [jobs[1].pk, jobs[2].pk]
        assert _statuses(jobs) == [Status.QUEUED, Status.RUNNING, Status.RUNNING]


def _versions() -> dict[int, int]:
    return dict(Customer.all_objects.values_list("pk", "version"))


@pytest.mark.django_db(transaction=True)
def test_pumps__two_workers_at_once_run_each_job_once(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}
    with temp_handler("t.touch", _touch):
        customers = [CustomerFactory() for _ in range(4)]
        for _round in range(30):
            Job.objects.all().delete()
            before = _versions()
            jobs = [tombstones.enqueue("t.touch", c) for c in customers for _ in range(3)]
            results = succeeded(run_together(_pump, _pump))
            ran = [o.job_id for outcomes in results for o in outcomes]
            assert len(ran) == len(set(ran)), "a job ran in both workers"
            _pump()  # whatever was left to the other
            assert set(_statuses(jobs)) == {Status.SUCCEEDED}
            assert set(Job.objects.values_list("attempts", flat=True)) == {1}
            after = _versions()
            assert all(after[c.pk] == before[c.pk] + 3 for c in customers), (before, after)


# --- the fence holds the source row: write-only handlers (PostgreSQL) -------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_fence__a_delete_waits_for_a_job_that_only_writes_another_table(
    postgres_only: None, settings: Any
) -> None:
    """A handler that writes only through ctx.write holds its record: a delete from another
    connection waits for the job's commit, so no write commits after the record died."""
    from project.customers.models import SheetRow
    from tests.factories import SheetRowFactory

    settings.TOMBSTONES_Q_OPTIONS = {}
    row = SheetRowFactory()
    customer = row.customer
    wrote, go = threading.Event(), threading.Event()
    delete_pid: list[int] = []

    def write_only(ctx: Any) -> None:
        ctx.write(SheetRow.objects.filter(customer_id=ctx.record.pk), synced_version=99)
        wrote.set()
        assert go.wait(30)

    def delete() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                delete_pid.append(cursor.fetchone()[0])
            Customer.objects.get(pk=customer.pk).delete()
        finally:
            connection.close()

    with temp_handler("t.write_only", write_only):
        job = tombstones.enqueue("t.write_only", customer)
        pump = threading.Thread(target=lambda: (_pump(), connection.close()))
        pump.start()
        assert wrote.wait(30)
        deleter = threading.Thread(target=delete)
        deleter.start()
        _wait_until_blocked(delete_pid)  # the delete waits for the job's row lock
        assert deleter.is_alive()
        go.set()
        pump.join(30)
        deleter.join(30)
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED
    assert Customer.all_objects.get(pk=customer.pk).deleted_at is not None
    assert SheetRow.objects.get(pk=row.pk).synced_version == 99


def _wait_until_blocked(pids: list[int]) -> None:
    """Until the other connection waits on a row lock (pg_stat_activity), bounded."""
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pids:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pids[0]]
                )
                row = cursor.fetchone()
            if row and row[0] == "Lock":
                return
        time.sleep(0.01)
    raise AssertionError("the delete never waited for the job's lock")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", ["delete", "recreate"])
def test_fence__a_record_changed_before_the_act_rejects_a_write_only_job(
    settings: Any, change: str
) -> None:
    from project.customers.models import SheetRow
    from tests.factories import SheetRowFactory

    settings.TOMBSTONES_Q_OPTIONS = {}
    row = SheetRowFactory()
    customer = row.customer

    def write_only(ctx: Any) -> None:
        ctx.write(SheetRow.objects.filter(customer_id=ctx.record.pk), synced_version=99)

    with temp_handler("t.write_only", write_only):
        job = tombstones.enqueue("t.write_only", customer)
        Customer.objects.get(pk=customer.pk).delete()
        if change == "recreate":
            Customer.all_objects.recreate(reference=customer.reference, name="Again")
        with transaction.atomic():
            pass
        _pump()
    job.refresh_from_db()
    expected = Reason.SOURCE_DELETED if change == "delete" else Reason.GENERATION_CHANGED
    assert (job.status, job.reason) == (Status.REJECTED, expected)
    assert SheetRow.objects.get(pk=row.pk).synced_version != 99


# --- lane followers: a claim takes its lanes' next jobs -------------------------------------


def _lane_of(count: int, handler: str = "t.touch") -> list[Job]:
    customer = CustomerFactory()
    return [tombstones.enqueue(handler, customer) for _ in range(count)]


def test_followers__one_claim_runs_a_lane_in_order_each_job_claimed_once(queued: Any) -> None:
    lane = _lane_of(5)
    taken = ledger.claim(20, whole=True)
    assert taken is not None
    assert [j.pk for j in taken.jobs] == [j.pk for j in lane]
    # One running job per lane: the head; its followers stay queued, reserved by the claim.
    rows = dict(Job.objects.values_list("pk", "status"))
    assert [rows[j.pk] for j in lane] == [Status.RUNNING] + [Status.QUEUED] * 4
    assert set(Job.objects.values_list("claim_token", flat=True)) == {taken.token}
    assert ledger.claim(20, whole=True) is None  # nobody else can take them meanwhile
    with CaptureQueriesContext(connection) as queries:
        ran, _ = runner.run_claim(taken)
    assert [o.job_id for o in ran] == [j.pk for j in lane]
    assert set(_statuses(lane)) == {Status.SUCCEEDED}
    assert set(Job.objects.values_list("attempts", "claim_token")) == {(1, "")}
    found = list(
        Job.objects.filter(pk__in=[j.pk for j in lane])
        .order_by("id")
        .values_list("found_version", flat=True)
    )
    assert found == [2, 3, 4, 5, 6]  # each on the record as the one before left it
    job_writes = [q for q in queries if q["sql"].startswith('UPDATE "tombstones_job"')]
    assert len(job_writes) == 1  # every outcome of the group in one statement


def test_followers__a_claim_takes_no_more_than_its_size_heads_and_followers_in_all(
    queued: Any,
) -> None:
    lane = _lane_of(25)
    taken = ledger.claim(20, whole=True)
    assert taken is not None
    assert [j.pk for j in taken.jobs] == [j.pk for j in lane[:20]]
    ran, _ = runner.run_claim(taken)
    assert len(ran) == 20
    assert _statuses(lane) == [Status.SUCCEEDED] * 20 + [Status.QUEUED] * 5
    # None was reserved and given back unstarted: the five behind were never the claim's.
    behind = Job.objects.filter(pk__in=[j.pk for j in lane[20:]])
    assert set(behind.values_list("attempts", "claim_token")) == {(0, "")}
    assert all(events(job) == ["enqueued"] for job in lane[20:])


def test_followers__a_lanes_jobs_finished_together_leave_one_hint_the_last_ones(
    queued: Any,
) -> None:
    first, second = _lane_of(5), _lane_of(3)
    taken = ledger.claim(20, whole=True)
    assert taken is not None
    assert len(taken.jobs) == 8
    runner.run_claim(taken)
    assert set(_statuses(first + second)) == {Status.SUCCEEDED}
    # Each lane is looked at again (its next enqueue may be behind it), once: its last job.
    hinted = Job.objects.filter(ready_at__isnull=False).values_list("pk", flat=True)
    assert set(hinted) == {first[-1].pk, second[-1].pk}
    late = tombstones.enqueue("t.touch", Customer.objects.get(pk=first[0].object_id))
    assert [o.job_id for o in runner.pump()] == [late.pk]


def test_followers__wait_behind_a_head_that_holds_its_lane_and_go_back_uncharged(
    queued: Any,
) -> None:
    calls: list[int] = []

    def flaky_first(ctx: Any) -> None:
        calls.append(ctx.job.pk)
        if ctx.job.pk == lane[0].pk:
            raise tombstones.TransientError("busy")
        ctx.update(phone="+1")

    with temp_handler("t.flaky_first", flaky_first):
        lane = _lane_of(3, "t.flaky_first")
        taken = ledger.claim(20, whole=True)
        assert taken is not None
        assert len(taken.jobs) == 3
        ran, _ = runner.run_claim(taken)
    assert [(o.job_id, o.status) for o in ran] == [(lane[0].pk, Status.RETRY_WAIT)]
    # The group rolled back and the head ran alone; its followers never ran behind the retry.
    assert set(calls) == {lane[0].pk}
    rows = Job.objects.filter(pk__in=[j.pk for j in lane[1:]])
    assert set(rows.values_list("status", "attempts", "claim_token")) == {(Status.QUEUED, 0, "")}


def test_followers__a_follower_that_exits_is_charged_its_head_is_not(
    queued: Any, settings: Any
) -> None:
    customer = CustomerFactory()

    def exits(ctx: Any) -> None:
        raise SystemExit

    with temp_handler("t.exits", exits):
        head = tombstones.enqueue("t.touch", customer)
        poison = tombstones.enqueue("t.exits", customer)
        taken = ledger.claim(20, whole=True)
        assert taken is not None
        assert [j.pk for j in taken.jobs] == [head.pk, poison.pk]
        with pytest.raises(SystemExit):
            runner.run_claim(taken)
        head.refresh_from_db()
        poison.refresh_from_db()
        snapshot = (head.status, head.attempts, poison.status, poison.reason, poison.attempts)
        with pytest.raises(SystemExit):
            runner.pump()  # the poison job again, alone
    # The follower's savepoint alone rolled back: its head's success was recorded before the exit
    # went on; the follower kept its attempt and went back to its place, to be claimed alone.
    assert snapshot == (Status.SUCCEEDED, 1, Status.QUEUED, Reason.CRASHED, 1)
    head.refresh_from_db()
    poison.refresh_from_db()
    assert (head.status, head.attempts) == (Status.SUCCEEDED, 1)
    assert (poison.status, poison.reason, poison.attempts) == (
        Status.RETRY_WAIT,
        Reason.CRASHED,
        2,
    )
    assert Customer.objects.get(pk=customer.pk).version == 2


def test_followers__reserved_ones_are_never_taken_by_another_claim(queued: Any) -> None:
    """A follower stays its claim's until given back: another worker taking it as a head would
    charge it a second attempt (the defect a two-worker cluster showed: attempts 2, one run)."""
    lane = _lane_of(2)
    first = ledger.claim(20, whole=True)
    assert first is not None
    assert [j.pk for j in first.jobs] == [lane[0].pk, lane[1].pk]
    with transaction.atomic():
        ledger.write_outcomes(first, [ledger.Outcome(first.jobs[0], Status.SUCCEEDED)])
    # The head is done; its follower is still reserved by the first claim.
    assert ledger.claim(20, whole=True) is None
    assert ledger.claim(20) is None
    # Its worker dies before giving it back: the take-back returns it, uncharged.
    assert ledger.take_back_lapsed()["requeued"] == 1
    row = Job.objects.get(pk=lane[1].pk)
    assert (row.status, row.attempts, row.claim_token) == (Status.QUEUED, 0, "")
    second = ledger.claim(20, whole=True)
    assert second is not None
    assert [(j.pk, j.attempts) for j in second.jobs] == [(lane[1].pk, 1)]


def test_followers__of_a_dead_worker_are_given_back_with_its_head(queued: Any) -> None:
    lane = _lane_of(3)
    dead = ledger.claim(20, whole=True)
    assert dead is not None
    assert len(dead.jobs) == 3
    Job.objects.filter(status=Status.RUNNING).update(
        lease_expires_at=Now() - Value(timedelta(seconds=1))
    )
    assert ledger.take_back_lapsed()["requeued"] == 1
    rows = Job.objects.filter(pk__in=[j.pk for j in lane])
    # Which job killed the worker is unknown: none is charged, each is claimed alone next.
    assert set(rows.values_list("status", "attempts", "claim_token", "reason")) == {
        (Status.QUEUED, 0, "", Reason.LEASE_EXPIRED)
    }
    alone = ledger.claim(20, whole=True)
    assert alone is not None
    assert [j.pk for j in alone.jobs] == [lane[0].pk]


def test_oldest_hint_wait__of_the_hint_due_longest_ago(queued: Any) -> None:
    """What the keeper asks before calling a helper for a long claim."""
    assert Job.objects.oldest_hint_wait() is None
    lane = _lane_of(2)
    Job.objects.filter(pk=lane[0].pk).update(ready_at=Now() - Value(timedelta(seconds=5)))
    waited = Job.objects.oldest_hint_wait()
    assert waited is not None
    assert timedelta(seconds=5) <= waited < timedelta(seconds=60)
    taken = ledger.claim(20, whole=True)  # the head, its follower reserved: no hint left
    assert taken is not None
    assert Job.objects.oldest_hint_wait() is None


def test_claims__no_follower_is_reserved_behind_an_external_head(settings: Any) -> None:
    """Internal jobs of a claim run before its external ones: a follower reserved behind an
    external head would overtake it."""
    settings.TOMBSTONES_Q_OPTIONS = {}
    customer = CustomerFactory()
    with temp_handler("t.send", lambda ctx: None, external=True), temp_handler("t.touch", _touch):
        first = tombstones.enqueue("t.send", customer)
        second = tombstones.enqueue("t.touch", customer)
        taken = ledger.claim(10, whole=True)
    assert taken is not None
    assert [j.pk for j in taken.jobs] == [first.pk]
    second.refresh_from_db()
    assert (second.status, second.claim_token) == (Status.QUEUED, "")
