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


# --- a job's savepoint costs no round trip of its own (issue 34) ------------------------------


def _statements_of_group(handler: str, keys: list[str]) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for key in keys:
        tombstones.enqueue(handler, _entity(key))
    claim = _claim_whole()
    with CaptureQueriesContext(connection) as queries:
        runner.run_claim(claim)
    return [q["sql"] for q in queries]


def test_savepoint__made_with_the_jobs_first_statement(queued: None) -> None:
    """Each job's savepoint goes with its first statement: on PostgreSQL in the same round trip
    (no SAVEPOINT sent alone), on SQLite just before it (a call, no round trip)."""
    from django.db import connection

    statements = _statements_of_group("stress.count", ["sp-1", "sp-2", "sp-3"])
    # The group's transaction, nested in the test's, is a savepoint too: one, before the jobs.
    group, *alone = [s for s in statements if s.startswith("SAVEPOINT") and ";" not in s]
    assert statements.index(group) < 3, statements
    merged = [s for s in statements if s.startswith("SAVEPOINT") and ";" in s]
    if connection.vendor == "postgresql":
        assert (len(alone), len(merged)) == (0, 3), statements
        assert all("UPDATE" in s.split(";", 1)[1] for s in merged), merged
    else:
        assert (len(alone), len(merged)) == (3, 0), statements
    assert dict(StressEntity.objects.values_list("key", "counter")) == {
        "sp-1": 1,
        "sp-2": 1,
        "sp-3": 1,
    }


def test_savepoint__a_first_statement_that_reads_gets_its_own_rows(queued: None) -> None:
    """The merged round trip hands the handler its statement's result, not the savepoint's."""
    seen: list[Any] = []

    def reads_first(ctx: Any) -> None:
        seen.append(
            list(StressEntity.objects.filter(pk=ctx.record.pk).values_list("key", "counter"))
        )
        ctx.update(counter=F("counter") + 1)

    with temp_handler("t.reads-first", reads_first):
        _statements_of_group("t.reads-first", ["rf-1", "rf-2"])
    assert seen == [[("rf-1", 0)], [("rf-2", 0)]]
    assert Job.objects.filter(status=Status.SUCCEEDED).count() == 2


def test_savepoint__a_first_statement_with_percent_signs_is_sent_as_written(queued: None) -> None:
    """The first statement is bound in the client before the savepoint is put in front of it:
    a ``%`` in a value, and a ``%%`` in a statement's text, reach the database as they would
    without the savepoint."""
    from django.db import connection

    def percent(ctx: Any) -> None:
        with connection.cursor() as cursor:  # a raw first statement with a literal %
            cursor.execute(
                "UPDATE stress_stressentity SET payload = %s || '%%' WHERE id = %s",
                [f"{ctx.record.key} 100", ctx.record.pk],
            )
            cursor.execute("SELECT payload FROM stress_stressentity WHERE id = %s", [ctx.record.pk])
            seen.append(cursor.fetchone()[0])
        ctx.update(counter=F("counter") + 1, payload=f"{ctx.record.key} 50% off")

    seen: list[str] = []
    with temp_handler("t.percent", percent):
        _statements_of_group("t.percent", ["pc-1", "pc-2"])
    assert seen == ["pc-1 100%", "pc-2 100%"]
    assert dict(StressEntity.objects.values_list("key", "payload")) == {
        "pc-1": "pc-1 50% off",
        "pc-2": "pc-2 50% off",
    }
    assert Job.objects.filter(status=Status.SUCCEEDED).count() == 2


def test_savepoint__psycopg_parses_each_statement_text_once(
    queued: None, postgres_only: None
) -> None:
    """psycopg keeps its parse of a statement's text (an LRU of them). A savepoint name in the
    text made every job's first statement new: parsed again, and pushing the engine's own
    statements out of that cache. Bound first, the text it parses is the job's own statement,
    the same for every job of a handler."""
    from psycopg import _queries

    _statements_of_group("stress.count", ["pq-0", "pq-1"])  # the group's statements parsed once
    before = _queries._query2pg_client.cache_info().misses
    _statements_of_group("stress.count", [f"pq-{n}" for n in range(2, 12)])
    assert _queries._query2pg_client.cache_info().misses - before < 5


def test_savepoint__a_failing_first_statement_rolls_back_that_job_alone(queued: None) -> None:
    """The first statement fails in the round trip that made the savepoint: the job rolls back
    to it, the group's other jobs commit."""

    def breaks(ctx: Any) -> None:
        if ctx.record.key == "ff-bad":
            # A duplicate key: the statement itself fails (PostgreSQL aborts the transaction).
            StressEntity.all_objects.create(key="ff-1", payload="dup")
        ctx.update(counter=F("counter") + 1)

    with temp_handler("t.breaks", breaks):
        _statements_of_group("t.breaks", ["ff-1", "ff-bad", "ff-2"])
    statuses = dict(Job.objects.values_list("object_id", "status"))
    by_key = dict(StressEntity.objects.values_list("pk", "key"))
    ended = {by_key[int(pk)]: status for pk, status in statuses.items()}
    assert ended == {"ff-1": Status.SUCCEEDED, "ff-bad": Status.FAILED, "ff-2": Status.SUCCEEDED}
    assert dict(StressEntity.objects.values_list("key", "counter")) == {
        "ff-1": 1,
        "ff-bad": 0,
        "ff-2": 1,
    }


def test_savepoint__a_job_that_ran_no_statement_drops_its_callbacks(
    queued: None, django_capture_on_commit_callbacks: Any
) -> None:
    """A handler that fails before any statement made no savepoint: its on_commit callbacks go
    all the same, and the group goes on."""
    from django.db import transaction

    ran: list[str] = []

    def early(ctx: Any) -> None:
        key = ctx.record.key
        transaction.on_commit(lambda: ran.append(key))
        if key == "ns-fails":
            raise ValueError("before any statement")
        ctx.update(counter=F("counter") + 1)

    with temp_handler("t.early", early):
        for key in ("ns-1", "ns-fails", "ns-2"):
            tombstones.enqueue("t.early", _entity(key))
        with django_capture_on_commit_callbacks(execute=True):
            runner.run_claim(_claim_whole())
    assert sorted(ran) == ["ns-1", "ns-2"]
    assert dict(StressEntity.objects.values_list("key", "counter")) == {
        "ns-1": 1,
        "ns-fails": 0,
        "ns-2": 1,
    }
