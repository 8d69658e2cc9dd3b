"""The one engine in a real qcluster (PostgreSQL + Redis, or SQLite + the ORM broker), with no
sweep: what the earlier roads got wrong, each with the bound the issue set.

- a batch of long heartbeating handlers completes with one attempt each (it livelocked);
- an external job behind an internal one runs at once (it waited for the sweep);
- a worker killed mid-job: its job runs again within lease + 5 s (the sweep took ~100 s);
- a delayed job runs within 2 s of its due time and does not hold back its lane;
- poison jobs (SystemExit, django-q2's timeout, a crash in the check) end failed/crashed after
  TOMBSTONES_MAX_ATTEMPTS claims, and the lane moves on (they looped forever);
- a rejection is neither a worker error nor a success in django-q2's tables and log.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_q.models import Task

from project.stress.models import AppliedWrite
from tombstones.jobs.engine.sweep import sweep
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job

from .helpers_cluster import broker_cluster, entity, finished, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

Status, Reason = Job.Status, Job.Reason


def _took(job: Job) -> float:
    """Seconds from enqueue to finish, in the database's clock."""
    job.refresh_from_db()
    assert job.finished_at is not None
    return (job.finished_at - job.created_at).total_seconds()


@pytest.mark.slow
def test_engine__long_heartbeating_handlers_in_one_worker_run_once_each() -> None:
    """Eight internal handlers of 2.5 s heartbeating every 0.5 s, lease 6 s, a sweep every 6 s,
    one worker: every job succeeds at its first attempt (the batch road livelocked here)."""
    lease = 6.0
    stop = threading.Event()
    swept: list[dict[str, int]] = []

    def sweeper() -> None:
        try:
            while not stop.wait(lease):
                swept.append(sweep())
        finally:
            connection.close()

    with broker_cluster(1, TOMBSTONES_LEASE_SECONDS=str(lease)):
        jobs = [
            enqueue(
                "stress.apply", entity(f"HB{i}"), params={"heartbeat": 2.5, "heartbeat_every": 0.5}
            )
            for i in range(8)
        ]
        thread = threading.Thread(target=sweeper)
        thread.start()
        try:
            wait_for(lambda: finished(*jobs), timeout=90, every=0.2)
        finally:
            stop.set()
            thread.join(30)
    rows = Job.objects.filter(pk__in=[j.pk for j in jobs])
    assert set(rows.values_list("status", "attempts")) == {(Status.SUCCEEDED, 1)}
    assert sum(s["requeued"] for s in swept) == 0
    assert AppliedWrite.objects.count() == 8


def test_engine__an_external_job_behind_an_internal_one_runs_at_once() -> None:
    with broker_cluster(2):
        record = entity("EXT")
        internal = enqueue("stress.apply", record, params={"delay_ms": 300, "delay_min_ms": 300})
        external = enqueue("stress.upsert", record)
        wait_for(lambda: finished(internal, external), timeout=30)
    assert _took(external) < 3.0
    external.refresh_from_db()
    assert external.status == Status.SUCCEEDED


def test_engine__a_killed_worker_s_job_runs_again_within_lease_plus_5_seconds() -> None:
    lease = 4.0
    with broker_cluster(2, TOMBSTONES_LEASE_SECONDS=str(lease)):
        record = entity("KILL")
        victim = enqueue("stress.apply", record, params={"crash": "sigkill", "crash_attempts": 1})
        behind = enqueue("stress.apply", record)
        wait_for(lambda: finished(victim, behind), timeout=lease + 30)
    victim.refresh_from_db()
    assert (victim.status, victim.attempts) == (Status.SUCCEEDED, 2)
    assert _took(victim) < lease + 5, _took(victim)
    behind.refresh_from_db()
    assert behind.status == Status.SUCCEEDED
    assert behind.started_at >= victim.finished_at  # in lane order
    assert AppliedWrite.objects.filter(job_id=victim.pk).count() == 1


def test_engine__a_delayed_job_runs_when_due_and_never_holds_back_its_lane() -> None:
    delay = 4.0
    with broker_cluster(2):
        record = entity("DELAY")
        due = timezone.now() + timedelta(seconds=delay)
        delayed = enqueue("stress.apply", record, run_after=due)
        immediate = enqueue("stress.apply", record)
        wait_for(lambda: finished(delayed, immediate), timeout=delay + 30)
    assert _took(immediate) < 2.0  # not behind the delayed job, queued before it
    delayed.refresh_from_db()
    assert delayed.status == Status.SUCCEEDED
    assert delayed.started_at >= delayed.run_after
    assert (delayed.finished_at - delayed.run_after).total_seconds() < 2.0
    assert delayed.found_version == 3  # it ran after the immediate job, on what that one left


@pytest.mark.slow
@pytest.mark.parametrize("poison", ["exit", "timeout", "check"])
def test_engine__poison_jobs_end_failed_crashed_and_their_lane_moves_on(poison: str) -> None:
    env = {
        "TOMBSTONES_MAX_ATTEMPTS": "3",
        "TOMBSTONES_RETRY_BACKOFF_SECONDS": "0.5",
        "TOMBSTONES_LEASE_SECONDS": "6",
    }
    params: dict[str, Any] = {}
    if poison == "exit":
        params = {"crash": "exit"}
    elif poison == "timeout":
        env["Q_TIMEOUT"] = "2"  # django-q2 kills the worker; the handler would run 10 s
        params = {"delay_ms": 10_000, "delay_min_ms": 10_000}
    with broker_cluster(2, **env):
        record = entity(f"POISON-{poison}")
        with transaction.atomic():  # the cluster sees the job only as it is at commit
            job = enqueue("stress.apply", record, params=params)
            if poison == "check":
                # A corrupt row: no primary key of its model holds its object_id. It once made
                # the check raise (a crash each time); now it fails alone, at once, saying why.
                Job.objects.filter(pk=job.pk).update(object_id="not-a-number")
        behind = enqueue("stress.apply", record)
        wait_for(lambda: finished(job, behind), timeout=90, every=0.2)
    job.refresh_from_db()
    if poison == "check":
        assert (job.status, job.reason, job.attempts) == (
            Status.ESCALATED,
            Reason.OBJECT_ID_INVALID,
            1,
        )
    else:
        assert (job.status, job.reason, job.attempts) == (Status.FAILED, Reason.CRASHED, 3)
    behind.refresh_from_db()
    assert (behind.status, behind.attempts) == (Status.SUCCEEDED, 1)
    assert AppliedWrite.objects.filter(job_id=job.pk).count() == 0


def test_engine__a_rejection_is_neither_a_worker_error_nor_a_success() -> None:
    with broker_cluster(1) as cluster:
        good = enqueue("stress.apply", entity("OK"))
        wait_for(lambda: _carried(good.pk), timeout=30)
        gone_record = entity("GONE")
        with transaction.atomic():
            rejected = enqueue("stress.apply", gone_record)
            gone_record.delete()
        wait_for(lambda: finished(rejected), timeout=30)
    # The cluster stopped gracefully: its monitor has been through every result.
    log = Path(cluster.log_path).read_text(errors="replace")
    rejected.refresh_from_db()
    assert (rejected.status, rejected.reason) == (Status.REJECTED, Reason.SOURCE_DELETED)
    assert _carried(good.pk) == [Status.SUCCEEDED]
    assert not Task.objects.filter(func="tombstones.worker.run", success=False).exists()
    assert _carried(rejected.pk) == []  # no stored task carries it, as success or failure
    assert "Failed 'tombstones.worker.run'" not in log
    assert f"job {rejected.pk} rejected reason=source_deleted" in log  # the one record of it


def _carried(job_id: int) -> list[str]:
    found = []
    for result in Task.objects.filter(func="tombstones.worker.run").values_list(
        "result", flat=True
    ):
        rows = result.get("carried", []) if isinstance(result, dict) else []
        found += [str(row[1]) for row in rows if row[0] == job_id]
    return found


def test_engine__a_job_due_while_a_long_claim_runs_goes_to_another_worker() -> None:
    """One worker holds a 3 s handler; a job of another lane enqueued meanwhile runs on the other
    worker at once (the long claim opens the wake-up gate and calls a helper). On SQLite the
    slow handler's transaction holds the database's write lock: there the quick job waits."""
    with broker_cluster(2):
        slow = enqueue(
            "stress.apply", entity("SLOW"), params={"delay_ms": 3000, "delay_min_ms": 3000}
        )
        wait_for(lambda: Job.objects.filter(pk=slow.pk, status=Status.RUNNING).exists())
        quick = enqueue("stress.apply", entity("QUICK"))
        wait_for(lambda: finished(slow, quick), timeout=30)
    if connection.vendor != "postgresql":
        return
    assert _took(quick) < 2.0
    slow.refresh_from_db()
    quick.refresh_from_db()
    assert quick.finished_at < slow.finished_at


def test_engine__a_deploy_a_handler_the_old_workers_lack_waits_for_the_new_ones() -> None:
    """Web processes run the new code first: the job reaches an old worker, which gives it back
    uncharged instead of escalating it for good; a worker of the new code then runs it."""
    from project.stress.handlers import added_in_deploy
    from tests.jobkit import temp_handler

    record = entity("DEPLOY")
    with temp_handler("stress.added_in_deploy", added_in_deploy):  # the new web code
        with broker_cluster(1) as old:  # an old worker: no such handler
            job = enqueue("stress.added_in_deploy", record)
            wait_for(
                lambda: Job.objects.filter(pk=job.pk, reason=Reason.HANDLER_UNKNOWN).exists(),
                timeout=30,
            )
            log = old.log_tail(200)
        job.refresh_from_db()
        assert (job.status, job.attempts, job.finished_at) == (Status.RETRY_WAIT, 0, None)
        assert "restart the workers" in log
        with broker_cluster(1, STRESS_DEPLOYED="1"):  # the new workers
            wait_for(lambda: finished(job), timeout=30)
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.SUCCEEDED, 1)
    record.refresh_from_db()
    assert record.payload == f"deployed-by-job-{job.pk}"
