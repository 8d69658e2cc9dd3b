"""Each job alone inside its batch (issue 18): a group of jobs changes how commits are grouped,
never what a job sees or what it can break.

- read-modify-write jobs of one lane, run in one group, lose no update (they did: the group
  shared one in-memory record);
- a job's own copy of the record: what a handler changes in memory is nobody else's;
- a reserved lane follower is its claim's: staff and the sweep leave it alone, so no other job's
  work is rolled back because of it (it was);
- every event is stamped when it happened, and a claim leaves its ``claimed`` event at once.

The PostgreSQL side (no lock at the check, the fence at the write, staff and web requests that
never wait for a handler) is in ``test_engine_group_locks.py``; the real cluster in
``tests/acceptance/test_batch_cluster.py``.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F, Value
from django.db.models.functions import Now

import tombstones
from project.stress.models import Meter, StressEntity
from tests.jobkit import events, temp_handler
from tombstones.jobs import ledger, staff_actions
from tombstones.jobs.engine import runner
from tombstones.jobs.engine.sweep import sweep
from tombstones.models import Job, JobEvent

pytestmark = pytest.mark.django_db

Status, Reason = Job.Status, Job.Reason


def _entity(key: str) -> StressEntity:
    return StressEntity.all_objects.recreate(key=key, payload="p")


@pytest.fixture
def queued(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs wait in the ORM broker: nothing runs until the test claims them. A claim's jobs run
    in one group however slow the machine is (a group closes after GROUP_SECONDS, and the jobs
    it did not start go back: on a loaded machine a test's claim ran in two groups)."""
    from tombstones.jobs.engine import group

    settings.TOMBSTONES_Q_OPTIONS = {}
    monkeypatch.setattr(group, "GROUP_SECONDS", 30.0)


def _claim_whole() -> ledger.Claim:
    """One claim of every due head and its lanes' followers: they run in one group."""
    taken = ledger.claim(20, whole=True)
    assert taken is not None
    return taken


# --- what a job sees ---------------------------------------------------------------------------


@pytest.mark.parametrize("_round", range(3))
def test_group__read_modify_write_jobs_of_one_lane_lose_no_update(
    queued: None, _round: int
) -> None:
    """F() then a value computed from ctx.record, alternating, all in one group: each job acts on
    the record as the jobs before it left it."""
    records = [_entity(f"rmw-{_round}-{i}") for i in range(3)]
    jobs = [
        tombstones.enqueue("stress.count", record, params={"how": how})
        for record in records
        for how in ("f", "read") * 3
    ]
    claim = _claim_whole()
    assert len(claim.jobs) == len(jobs)  # heads and followers: one claim, one group
    done, _ = runner.run_claim(claim)
    assert {o.status for o in done} == {Status.SUCCEEDED}
    for record in records:
        record.refresh_from_db()
        assert (record.counter, record.version) == (6, 7)
    assert Job.objects.filter(rereads__gt=0).count() == 0  # carried forward, not fenced out


def test_group__a_handler_sees_what_its_own_f_update_computed(queued: None) -> None:
    seen: list[int] = []

    def twice(ctx: Any) -> None:
        ctx.update(counter=F("counter") + 5)
        seen.append(ctx.record.counter)
        ctx.update(counter=ctx.record.counter * 2)

    record = _entity("own-f")
    StressEntity.objects.filter(pk=record.pk).update(counter=1)
    with temp_handler("t.twice", twice):
        tombstones.enqueue("t.twice", StressEntity.objects.get(pk=record.pk))
        runner.run_claim(_claim_whole())
    record.refresh_from_db()
    assert seen == [6]
    assert record.counter == 12


def test_group__a_generated_column_is_what_the_database_computed(queued: None) -> None:
    """A column the database computes from what the job before wrote: the next job of the group
    sees the computed value, not the one from before that write."""
    seen: list[int] = []

    def bump(ctx: Any) -> None:
        seen.append(ctx.record.doubled)
        ctx.update(reading=ctx.record.reading + 1)

    meter = Meter.all_objects.recreate(key="generated", reading=1)
    with temp_handler("t.bump", bump):
        for _ in range(3):
            tombstones.enqueue("t.bump", meter)
        claim = _claim_whole()
        assert len(claim.jobs) == 3  # one group
        runner.run_claim(claim)
    meter.refresh_from_db()
    assert seen == [2, 4, 6]
    assert (meter.reading, meter.doubled) == (4, 8)
    assert Job.objects.filter(rereads__gt=0).count() == 0


def test_group__what_a_handler_changes_in_memory_stays_its_own(queued: None) -> None:
    seen: list[str] = []

    def scribble(ctx: Any) -> None:
        seen.append(ctx.record.payload)
        ctx.record.payload = "scribbled, never written"
        ctx.update(counter=ctx.record.counter + 1)

    record = _entity("memory")
    with temp_handler("t.scribble", scribble):
        for _ in range(3):
            tombstones.enqueue("t.scribble", record)
        runner.run_claim(_claim_whole())
    record.refresh_from_db()
    assert seen == ["p", "p", "p"]
    assert (record.payload, record.counter) == ("p", 3)


def test_group__a_failing_follower_rolls_back_alone(queued: None) -> None:
    """Head, failing follower, follower: the failure keeps neither of the others' writes from
    committing, and its own write is rolled back."""
    record = _entity("fails-alone")

    def fails(ctx: Any) -> None:
        ctx.update(counter=ctx.record.counter + 100)
        raise ValueError("after its write")

    with temp_handler("t.fails", fails):
        head = tombstones.enqueue("stress.count", record)
        bad = tombstones.enqueue("t.fails", record)
        last = tombstones.enqueue("stress.count", record)
        runner.run_claim(_claim_whole())
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert (statuses[head.pk], statuses[bad.pk], statuses[last.pk]) == (
        Status.SUCCEEDED,
        Status.FAILED,
        Status.SUCCEEDED,
    )
    record.refresh_from_db()
    assert (record.counter, record.version) == (2, 3)


# --- a reserved follower belongs to its claim ---------------------------------------------------


def test_reserved_follower__staff_cancel_is_refused_and_says_why(queued: None) -> None:
    record = _entity("reserved-cancel")
    head = tombstones.enqueue("stress.count", record)
    follower = tombstones.enqueue("stress.count", record)
    other = tombstones.enqueue("stress.count", _entity("reserved-other"))
    claim = _claim_whole()
    follower.refresh_from_db()
    assert (follower.status, bool(follower.claim_token)) == (Status.QUEUED, True)
    action = staff_actions.ACTIONS["cancel"]
    assert "reserved" in staff_actions.why_not(action, follower)
    assert action not in staff_actions.available(follower)
    assert not staff_actions.cancel(follower, Status.QUEUED, by="staff:1")
    assert not staff_actions.skip_head(follower, Status.QUEUED, by="staff:1")
    done, _ = runner.run_claim(claim)
    assert sorted(o.job_id for o in done) == sorted([head.pk, follower.pk, other.pk])
    assert set(Job.objects.values_list("status", flat=True)) == {Status.SUCCEEDED}
    record.refresh_from_db()
    assert record.counter == 2


def test_reserved_follower__the_sweep_does_not_expire_it_under_its_claim(
    queued: None, settings: Any
) -> None:
    settings.TOMBSTONES_JOB_MAX_AGE = timedelta(hours=1)
    record = _entity("reserved-expiry")
    head = tombstones.enqueue("stress.count", record)
    follower = tombstones.enqueue("stress.count", record)
    claim = _claim_whole()
    Job.objects.filter(pk=follower.pk).update(created_at=Now() - Value(timedelta(hours=2)))
    assert sweep(dispatch=False)["expired"] == 0
    done, _ = runner.run_claim(claim)
    assert {o.job_id for o in done} == {head.pk, follower.pk}
    head.refresh_from_db()
    assert head.status == Status.SUCCEEDED  # never rolled back because of its follower
    follower.refresh_from_db()
    assert follower.status in (Status.SUCCEEDED, Status.EXPIRED)


# --- honest timestamps -------------------------------------------------------------------------


def test_events__each_is_stamped_at_its_step_not_at_the_outcome(queued: None) -> None:
    def slow(ctx: Any) -> None:
        time.sleep(0.6)
        ctx.update(counter=1)

    with temp_handler("t.slow", slow):
        job = tombstones.enqueue("t.slow", _entity("stamps"))
        runner.run_claim(_claim_whole())
    job.refresh_from_db()
    # A plain success keeps its trail in its row (claim: started_at; outcome: finished_at).
    assert not JobEvent.objects.filter(job=job).exists()
    stamps = {e.event: e.created_at for e in job.history()[1:]}
    assert list(stamps) == ["claimed", "checked", "succeeded"]
    assert (stamps["succeeded"] - stamps["checked"]).total_seconds() >= 0.55
    assert (stamps["checked"] - stamps["claimed"]).total_seconds() < 0.3
    job.refresh_from_db()
    assert job.started_at is not None
    assert job.finished_at is not None
    assert abs((stamps["claimed"] - job.started_at).total_seconds()) < 0.3
    assert abs((stamps["succeeded"] - job.finished_at).total_seconds()) < 0.3


def test_events__a_claim_whose_worker_vanished_leaves_its_claimed_event(queued: None) -> None:
    """A worker that dies in the handler leaves the record of its claim: the take-back writes
    the ``claimed`` event from the claim's row, stamped at the claim, by that worker."""
    job = tombstones.enqueue("stress.count", _entity("claimed-vanished"))
    claim = ledger.claim(1)
    assert claim is not None
    Job.objects.filter(pk=job.pk).update(lease_expires_at=Now() - Value(timedelta(seconds=1)))
    assert ledger.take_back_lapsed()["requeued"] == 1
    assert events(job) == ["enqueued", "claimed", "requeued"]
    job.refresh_from_db()
    claimed = JobEvent.objects.get(job=job, event="claimed")
    assert claimed.worker == claim.worker
    assert claimed.created_at == job.started_at


def test_group__a_failed_jobs_on_commit_callbacks_are_dropped_with_its_writes(
    queued: None, django_capture_on_commit_callbacks: Any
) -> None:
    """The job's savepoint takes its on_commit callbacks with it; the others' stay."""
    from django.db import transaction

    ran: list[str] = []

    def notes(ctx: Any) -> None:
        transaction.on_commit(lambda: ran.append(ctx.record.key))
        ctx.update(counter=ctx.record.counter + 1)
        if ctx.record.key == "cb-fails":
            raise ValueError("after its write and its callback")

    with temp_handler("t.notes", notes):
        for key in ("cb-ok-1", "cb-fails", "cb-ok-2"):
            tombstones.enqueue("t.notes", _entity(key))
        with django_capture_on_commit_callbacks(execute=True):
            runner.run_claim(_claim_whole())
    assert sorted(ran) == ["cb-ok-1", "cb-ok-2"]
    counters = dict(StressEntity.objects.values_list("key", "counter"))
    assert counters == {"cb-ok-1": 1, "cb-fails": 0, "cb-ok-2": 1}
