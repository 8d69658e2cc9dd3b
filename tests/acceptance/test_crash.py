"""Crash and fault tests with real worker processes (SIGKILL, SIGSTOP/SIGCONT, PG restart).

Every worker here is a real process (``crash_worker.py`` or a ``qcluster``) on the real test
database. A worker is stopped at an exact phase through the worker's hook signals or a handler
rendezvous; leases are expired by back-dating them, never by sleeping.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import OperationalError, close_old_connections, connection
from django.test.utils import override_settings

from project.stress.models import AppliedWrite, Delivery, StressEntity
from tests.jobkit import run_together, succeeded
from tombstones import worker
from tombstones.jobs.engine.sweep import sweep
from tombstones.jobs.enqueue import enqueue, wake
from tombstones.models import Job, JobEvent

from .helpers_cluster import (
    Cluster,
    backdate_lease,
    entity,
    finish,
    kill,
    quiet_queue,
    start_worker,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

Status = Job.Status


@pytest.fixture
def queue() -> object:
    with quiet_queue() as name:
        yield name


def _applied(job: Job) -> int:
    return AppliedWrite.objects.filter(job_id=job.pk).count()


def _refresh(*jobs: Job) -> None:
    for job in jobs:
        job.refresh_from_db()


def _ran(output: str) -> dict[int, str]:
    """Job id -> status of what one worker task ran (from its JSON result)."""
    return {row[0]: row[1] for row in json.loads(output)["carried"]}


@pytest.mark.parametrize("crash_at", ["claimed", "checked", "act"])
def test_crash__sigkill_at_each_phase_loses_nothing_and_applies_once(
    crash_at: str, queue: str, tmp_path: Path
) -> None:
    record = entity("K1")
    marker, release = tmp_path / "reached", tmp_path / "release"
    in_act = crash_at == "act"
    params = {"signal": str(marker), "release": str(release), "hold": 60} if in_act else {}
    first = enqueue("stress.apply", record, params=params)
    second = enqueue("stress.apply", record)

    victim = start_worker(
        first.pk,
        queue=queue,
        crash_at="" if in_act else crash_at,
        marker=marker,
        release=release,
    )
    wait_for(marker.exists)
    kill(victim)

    _refresh(first, second)
    assert first.status == Status.RUNNING
    assert second.status == Status.QUEUED
    # The dead worker still holds the lane: the second job is not claimable.
    assert _ran(finish(start_worker(second.pk, queue=queue))) == {}
    assert _applied(first) == 0  # its act transaction (if any) never committed

    backdate_lease(first.pk)
    assert sweep(dispatch=False)["requeued"] == 1
    # The claim left its record although the worker died in it (issue 18).
    claimed = JobEvent.objects.filter(job=first, event="claimed")
    assert list(claimed.values_list("worker", flat=True)) == [first.owner]
    release.touch()
    # One wake-up runs the job, then the lane's next job, in order.
    ran = _ran(finish(start_worker(first.pk, queue=queue)))
    assert ran == {first.pk: Status.SUCCEEDED, second.pk: Status.SUCCEEDED}

    _refresh(first, second)
    assert (first.status, second.status) == (Status.SUCCEEDED, Status.SUCCEEDED)
    assert (_applied(first), _applied(second)) == (1, 1)
    order = list(AppliedWrite.objects.values_list("job_id", flat=True))
    assert order == [first.pk, second.pk]
    assert StressEntity.objects.get(pk=record.pk).version == 3
    assert first.attempts == 2


def test_crash__sigkill_after_sending_ends_uncertain_and_is_not_repeated(
    queue: str, tmp_path: Path
) -> None:
    record = entity("K2")
    marker, release = tmp_path / "sending", tmp_path / "never"
    external = enqueue(
        "stress.upsert", record, params={"signal": str(marker), "release": str(release)}
    )
    after = enqueue("stress.apply", record)

    victim = start_worker(external.pk, queue=queue)
    wait_for(marker.exists)
    kill(victim)
    external.refresh_from_db()
    assert external.status == Status.RUNNING
    assert external.sending_at is not None

    backdate_lease(external.pk)
    counts = sweep(dispatch=False)
    # The outcome roll-up's rows it folded, the silent workers it forgot: not this test's.
    counts.pop("folded")
    counts.pop("forgotten")
    assert counts == {
        "uncertain": 1,
        "requeued": 0,
        "crashed": 0,
        "expired": 0,
        "resumed": 0,
        "dispatched": 0,
    }
    external.refresh_from_db()
    assert (external.status, external.reason) == (Status.UNCERTAIN, Job.Reason.OUTCOME_UNKNOWN)

    # Never repeated by itself: a wake-up runs the lane's next job, not the uncertain one.
    assert _ran(finish(start_worker(external.pk, queue=queue))) == {after.pk: Status.SUCCEEDED}
    assert Delivery.objects.filter(job_id=external.pk, phase="start").count() == 1
    after.refresh_from_db()
    assert after.started_at > external.sending_at


def test_crash__zombie_resumed_after_takeover_writes_nothing(queue: str, tmp_path: Path) -> None:
    record = entity("K3")
    job = enqueue("stress.apply", record)
    marker, release = tmp_path / "claimed", tmp_path / "go"

    # Stopped after its claim, outside any transaction (SQLite: no write lock held).
    zombie = start_worker(job.pk, queue=queue, crash_at="claimed", marker=marker, release=release)
    wait_for(marker.exists)
    zombie.send_signal(signal.SIGSTOP)
    try:
        backdate_lease(job.pk)
        assert sweep(dispatch=False)["requeued"] == 1
        assert _ran(finish(start_worker(job.pk, queue=queue))) == {job.pk: Status.SUCCEEDED}
        release.touch()
    finally:
        zombie.send_signal(signal.SIGCONT)
    zombie_result = _ran(finish(zombie))

    # The zombie's handler ran on the record the rescuer left, then its outcome was fenced by
    # the claim token: the whole act transaction rolled back, and nothing is reported as its.
    assert zombie_result == {}
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED
    assert _applied(job) == 1
    assert StressEntity.objects.get(pk=record.pk).version == 2
    assert JobEvent.objects.filter(job=job, event=JobEvent.Event.SUCCEEDED).count() == 1


def test_crash__same_message_twice_runs_the_job_once(queue: str) -> None:
    record = entity("K4")
    job = enqueue("stress.apply", record, params={"delay_ms": 200, "delay_min_ms": 100})
    workers = [start_worker(job.pk, queue=queue) for _ in range(2)]
    results = [_ran(finish(p)) for p in workers]
    # And once more, after the fact.
    results.append({row[0]: row[1] for row in worker.run(job.pk)["carried"]})
    assert sorted(len(r) for r in results) == [0, 0, 1]
    assert _applied(job) == 1
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.SUCCEEDED, 1)


@pytest.mark.cluster
def test_crash__duplicate_django_q_messages_in_a_cluster_run_each_job_once(
    settings: object,
) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}  # type: ignore[attr-defined]
    cluster = Cluster(2, settings_module="tests.acceptance.cluster_settings")
    with cluster, cluster.messages():
        records = [entity(f"D{i}") for i in range(4)]
        jobs = [enqueue("stress.apply", r, params={"delay_ms": 20}) for r in records]
        for job in jobs:
            wake(job.pk)  # the same message, a second time
            wake(job.pk)
        wait_for(lambda: not Job.objects.filter(status__in=Job.UNFINISHED).exists(), timeout=60)
    assert set(Job.objects.values_list("status", flat=True)) == {Status.SUCCEEDED}
    assert sorted(AppliedWrite.objects.values_list("job_id", flat=True)) == sorted(
        j.pk for j in jobs
    )


def _db_retry(func: object, attempts: int = 50) -> object:
    """Run a query from the test process across a database restart."""
    for _ in range(attempts):
        try:
            return func()  # type: ignore[operator]
        except OperationalError:
            connection.close()
            time.sleep(0.2)
    raise TimeoutError("database did not come back")


def _restart_postgres() -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        timeout=120,
        capture_output=True,
    )


def _ensure_postgres_up() -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    status = subprocess.run(
        ["pg_ctlcluster", version, "main", "status"], capture_output=True, timeout=30
    )
    if status.returncode != 0:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
            timeout=120,
            capture_output=True,
        )


@pytest.mark.slow
@pytest.mark.serial  # restarts the shared server: every other process would lose its connections
@pytest.mark.postgres
@pytest.mark.cluster
def test_crash__postgres_restart_mid_run_every_job_ends_and_nothing_applies_twice(
    postgres_only: None, settings: object
) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}  # type: ignore[attr-defined]
    lease = 3
    cluster = Cluster(
        2,
        settings_module="tests.acceptance.cluster_settings",
        env={"TOMBSTONES_LEASE_SECONDS": str(lease)},
    )
    cluster.start()
    try:
        with cluster.messages(), override_settings(TOMBSTONES_LEASE=timedelta(seconds=lease)):
            records = [entity(f"R{i}") for i in range(8)]
            jobs = [
                enqueue("stress.apply", records[i % 8], params={"delay_ms": 60}) for i in range(48)
            ]
            wait_for(lambda: Job.objects.filter(status=Status.SUCCEEDED).count() >= 8)
            try:
                _restart_postgres()
            finally:
                _ensure_postgres_up()
            connection.close()

            def unfinished() -> int:
                close_old_connections()
                return Job.objects.filter(status__in=Job.UNFINISHED).count()

            deadline = time.monotonic() + 120
            while _db_retry(unfinished) and time.monotonic() < deadline:
                # The app's schedule runs every minute; the test sweeps more often.
                _db_retry(lambda: sweep())
                time.sleep(1)
    finally:
        _ensure_postgres_up()
        cluster.stop()
        connection.close()

    statuses = dict((job_id, status) for job_id, status in Job.objects.values_list("id", "status"))
    assert all(statuses[j.pk] in Job.TERMINAL for j in jobs), statuses
    for job in jobs:
        expected = 1 if statuses[job.pk] == Status.SUCCEEDED else 0
        assert _applied(job) == expected, (job.pk, statuses[job.pk])
    assert sum(s == Status.SUCCEEDED for s in statuses.values()) == len(jobs)
    # Lane order held: within each record, writes are in job order.
    for record in records:
        order = list(
            AppliedWrite.objects.filter(key=record.key)
            .order_by("id")
            .values_list("job_id", flat=True)
        )
        assert order == sorted(order)


def test_crash__two_threads_claim_while_worker_dies_only_one_rescue(queue: str) -> None:
    """Two sweeps and two rescuers racing over one dead worker's job: it is applied once."""
    record = entity("K5")
    job = enqueue("stress.apply", record)
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING, claim_token="dead", attempts=1)
    backdate_lease(job.pk)
    counts = succeeded(run_together(*[lambda: sweep(dispatch=False)] * 2))
    assert sum(c["requeued"] for c in counts) == 1
    rescuers = [start_worker(job.pk, queue=queue) for _ in range(2)]
    results = [_ran(finish(p)) for p in rescuers]
    assert sorted(len(r) for r in results) == [0, 1]
    assert _applied(job) == 1
