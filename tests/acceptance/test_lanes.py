"""Ordered lanes: only the head of a lane is claimable, at most one job per lane runs, enforced
by the database; leases in database time; claim races with real concurrent connections."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.models import DateTimeField, F
from django.db.models.functions import Now
from django.test.utils import override_settings

from tests.jobkit import record as finish
from tests.jobkit import temp_handler, try_claim
from tombstones import worker
from tombstones.exceptions import LeaseLost
from tombstones.jobs.engine import keeper
from tombstones.jobs.engine.sweep import sweep
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job, JobEvent

from .helpers_cluster import (
    Cluster,
    assert_lane_order,
    backdate_lease,
    entity,
    quiet_queue,
    wait_for,
)

Status = Job.Status
REPEATS = 200


@pytest.fixture
def queue(transactional_db: None) -> Iterator[str]:
    with quiet_queue() as name:
        yield name


def _status(job: Job) -> str:
    job.refresh_from_db()
    return str(job.status)


def test_lanes__default_ordering_key_is_the_record_and_can_be_overridden(queue: str) -> None:
    record = entity("L1")
    assert enqueue("stress.apply", record).lane == f"stress.stressentity:{record.pk}"
    assert enqueue("stress.apply", record, ordering_key="tenant-7").lane == "tenant-7"


def test_lanes__only_the_head_is_claimable_and_order_is_kept(queue: str) -> None:
    record = entity("L2")
    first, second, third = (enqueue("stress.apply", record) for _ in range(3))
    assert try_claim(second) is None
    assert try_claim(third) is None
    taken = try_claim(first)
    assert taken is not None
    assert try_claim(second) is None  # the head is running: the lane is held
    finish(taken, Status.SUCCEEDED)
    assert try_claim(third) is None  # still not the head
    assert try_claim(second) is not None


def test_lanes__different_lanes_run_in_parallel(queue: str) -> None:
    one, two = entity("L3a"), entity("L3b")
    a, b = enqueue("stress.apply", one), enqueue("stress.apply", two)
    assert try_claim(a) is not None
    assert try_claim(b) is not None
    assert Job.objects.filter(status=Status.RUNNING).count() == 2


@pytest.mark.parametrize("holding", [Status.RETRY_WAIT, Status.PAUSED])
def test_lanes__retry_wait_and_paused_hold_the_lane(queue: str, holding: str) -> None:
    record = entity("L4")
    first, second = enqueue("stress.apply", record), enqueue("stress.apply", record)
    taken = try_claim(first)
    assert taken is not None
    finish(taken, holding, Job.Reason.TRANSIENT, retry_in=timedelta(hours=1))
    assert try_claim(second) is None
    worker.run()  # a wake-up runs nothing: the lane is held
    assert _status(second) == Status.QUEUED


@pytest.mark.parametrize("terminal", sorted(Job.TERMINAL))
def test_lanes__every_terminal_outcome_releases_the_lane(queue: str, terminal: str) -> None:
    record = entity("L5")
    first, second = enqueue("stress.apply", record), enqueue("stress.apply", record)
    taken = try_claim(first)
    assert taken is not None
    finish(taken, terminal)
    assert try_claim(second) is not None


def test_lanes__the_database_refuses_a_second_running_job_in_a_lane(queue: str) -> None:
    record = entity("L6")
    first, second = enqueue("stress.apply", record), enqueue("stress.apply", record)
    Job.objects.filter(pk=first.pk).update(status=Status.RUNNING)
    # Bypassing the claim's head check entirely: the unique partial index still refuses.
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=second.pk).update(status=Status.RUNNING)


def test_lanes__lease_is_computed_with_the_database_clock(queue: str) -> None:
    record = entity("L7")
    job = enqueue("stress.apply", record)
    with override_settings(TOMBSTONES_LEASE=timedelta(seconds=600)):
        assert try_claim(job) is not None
    row = (
        Job.objects.filter(pk=job.pk)
        .annotate(db_now=Now(output_field=DateTimeField()))
        .values("lease_expires_at", "db_now", "started_at")
        .get()
    )
    assert row["lease_expires_at"] - row["started_at"] == timedelta(seconds=600)
    assert abs((row["lease_expires_at"] - row["db_now"]) - timedelta(seconds=600)) < timedelta(
        seconds=30
    )


def test_lanes__heartbeat_extends_the_lease_and_a_lost_lease_fences_everything(
    queue: str,
) -> None:
    record = entity("L8")
    job = enqueue("stress.apply", record)
    taken = try_claim(job)
    assert taken is not None
    backdate_lease(job.pk)
    assert keeper.heartbeat(taken)
    job.refresh_from_db()
    assert job.lease_expires_at is not None
    assert sweep(dispatch=False)["requeued"] == 0  # extended: not lapsed

    backdate_lease(job.pk)
    assert sweep(dispatch=False)["requeued"] == 1
    rescuer = try_claim(job)
    assert rescuer is not None
    # The first worker's claim is dead: no lease, no outcome.
    assert keeper.heartbeat(taken) is False
    with pytest.raises(LeaseLost):
        finish(taken, Status.SUCCEEDED)
    finish(rescuer, Status.SUCCEEDED)
    assert _status(job) == Status.SUCCEEDED


def test_lanes__long_handler_heartbeat_survives_concurrent_sweeps(
    postgres_only: None, queue: str
) -> None:
    """Lease 1s, a handler that heartbeats every 0.2 s, sweeps back to back beside it: never
    taken over.

    The handler runs until ten sweeps have started after its lease would have lapsed without
    its heartbeats (1.2 s after it began), not for a fixed time: a sweep took 190-300 ms with
    CI's four test processes on two cores, and a fixed 3 s saw only ten in all. PostgreSQL
    only: on SQLite the handler's transaction holds the one write lock, and no sweep runs
    beside it."""
    record = entity("L9")
    done, enough = threading.Event(), threading.Event()
    began: list[float] = []
    swept: list[tuple[float, dict[str, int]]] = []

    def long_heartbeats(ctx: Any) -> None:
        began.append(time.monotonic())
        deadline = began[0] + 30  # bounded: the sweeper stalled, and the test fails below
        while not enough.wait(0.2) and time.monotonic() < deadline:
            assert ctx.heartbeat()
        ctx.update(payload=f"applied-by-job-{ctx.job.pk}")

    def sweeper() -> None:
        try:
            while not done.wait(0.05):
                at = time.monotonic()
                swept.append((at, sweep(dispatch=False)))
                late = [t for t, _ in swept if began and t > began[0] + 1.2]
                if len(late) >= 10:
                    enough.set()
        finally:
            connection.close()

    with (
        temp_handler("t.long_heartbeats", long_heartbeats),
        override_settings(TOMBSTONES_LEASE=timedelta(seconds=1)),
    ):
        job = enqueue("t.long_heartbeats", record)
        thread = threading.Thread(target=sweeper)
        thread.start()
        try:
            result = worker.run(job.pk)
        finally:
            done.set()
            thread.join(10)
    assert enough.is_set(), f"{len(swept)} sweeps in all"
    assert result["carried"] == [[job.pk, Status.SUCCEEDED, ""]]
    assert sum(s["requeued"] + s["expired"] for _, s in swept) == 0
    record.refresh_from_db()
    assert record.payload == f"applied-by-job-{job.pk}"


class _Racers:
    """Two threads, each with its own database connection, released by one barrier."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(2)
        self.barrier = threading.Barrier(2)

    def race(self, *calls: Callable[[], Any]) -> list[Any]:
        def run(call: Callable[[], Any]) -> Any:
            self.barrier.wait(10)
            return call()

        futures = [self.pool.submit(run, call) for call in calls]
        return [f.result(30) for f in futures]

    def close(self) -> None:
        def close_connections() -> None:
            self.barrier.wait(10)
            connections.close_all()

        self.race(close_connections, close_connections)
        self.pool.shutdown()


@pytest.fixture
def racers(queue: str) -> Iterator[_Racers]:
    pool = _Racers()
    try:
        yield pool
    finally:
        pool.close()


def test_lanes__two_workers_claim_the_same_job_at_once_exactly_one_wins(
    racers: _Racers,
) -> None:
    record = entity("R1")
    for _ in range(REPEATS):
        job = enqueue("stress.apply", record)
        claims = racers.race(*[partial(try_claim, job)] * 2)
        won = [c for c in claims if c is not None]
        assert len(won) == 1
        finish(won[0], Status.SUCCEEDED)
    # One success each: stored, or kept in the job's row (Job.history reads both).
    trails = [job.history() for job in Job.objects.all()]
    assert sum(e.event == JobEvent.Event.SUCCEEDED for trail in trails for e in trail) == REPEATS
    assert Job.objects.filter(status=Status.SUCCEEDED, attempts=1).count() == REPEATS


def test_lanes__two_workers_race_for_two_jobs_of_one_lane_only_the_head_runs(
    racers: _Racers,
) -> None:
    record = entity("R2")
    for _ in range(REPEATS):
        head, next_ = enqueue("stress.apply", record), enqueue("stress.apply", record)
        claims = racers.race(partial(try_claim, head), partial(try_claim, next_))
        assert claims[0] is not None
        assert claims[1] is None
        finish(claims[0], Status.SUCCEEDED)
        next_claim = try_claim(next_)
        assert next_claim is not None
        finish(next_claim, Status.SUCCEEDED)


def test_lanes__head_finishing_while_next_is_claimed_never_runs_two(racers: _Racers) -> None:
    """The head's outcome and the next job's claim at the same instant: never two running."""
    record = entity("R3")
    for _ in range(REPEATS // 2):
        head, next_ = enqueue("stress.apply", record), enqueue("stress.apply", record)
        taken = try_claim(head)
        assert taken is not None
        results = racers.race(partial(finish, taken, Status.SUCCEEDED), partial(try_claim, next_))
        assert Job.objects.filter(lane=head.lane, status=Status.RUNNING).count() <= 1
        if results[1] is None:
            results[1] = try_claim(next_)
        assert results[1] is not None
        finish(results[1], Status.SUCCEEDED)


@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
def test_lanes__a_cluster_runs_each_lane_in_order_and_lanes_in_parallel(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}
    # Handlers slow enough (200 ms) that one worker hands the jobs it has not started to the
    # other: quick handlers are better run back to back by one worker.
    lanes, per_lane = 4, 5
    cluster = Cluster(2, settings_module="tests.acceptance.cluster_settings")
    with cluster, cluster.messages():
        records = [entity(f"C{i}") for i in range(lanes)]
        jobs = [
            enqueue(
                "stress.apply", records[i % lanes], params={"delay_ms": 200, "delay_min_ms": 200}
            )
            for i in range(lanes * per_lane)
        ]
        wait_for(lambda: not Job.objects.filter(status__in=Job.UNFINISHED).exists(), timeout=90)
    assert set(Job.objects.values_list("status", flat=True)) == {Status.SUCCEEDED}
    assert_lane_order(records, jobs)
    if connection.vendor == "postgresql":
        # Two worker processes shared the work. (SQLite serialises writing transactions: a
        # worker whose handler holds the write lock for 200 ms takes it again at once, and the
        # other worker's busy-wait seldom gets in between, so there one worker may run them all.)
        owners = set(Job.objects.values_list("owner", flat=True))
        assert len(owners) >= 2
        spans = Job.objects.values_list("started_at", "finished_at", "lane")
        overlapping = any(
            a[2] != b[2] and a[0] < b[1] and b[0] < a[1] for a in spans for b in spans
        )
        assert overlapping, "no two lanes ever ran at the same time"
    assert Job.objects.filter(attempts__gt=1).count() == 0
    assert not Job.objects.filter(finished_at__lt=F("started_at")).exists()
