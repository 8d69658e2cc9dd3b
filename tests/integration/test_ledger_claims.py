"""No starvation at any backlog: a due lane head is claimed whatever number of lanes are held
by a running, paused or retry-waiting head, and the claim that finds it does not read them.

The claim once looked only at the first ``batch x (workers + 1)`` lanes with a due job and none
running: a lane whose head waits for a retry, with a job queued behind it, qualified and gave no
head, so 60 such lanes (batch 20, two workers) kept every other due job waiting until the first
retry came due (up to TOMBSTONES_RETRY_BACKOFF_MAX).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Value
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import temp_handler
from tombstones import worker
from tombstones.jobs.ledger import hint_floor
from tombstones.models import Job

pytestmark = pytest.mark.django_db

Status = Job.Status


def _touch(ctx: Any) -> None:
    ctx.update(phone=f"+{ctx.job.pk}")


def _flaky(ctx: Any) -> None:
    raise tombstones.TransientError("upstream busy")


@pytest.fixture
def handlers(settings: Any) -> Any:
    settings.TOMBSTONES_Q_OPTIONS = {}  # nothing runs until the test calls the worker
    settings.TOMBSTONES_RETRY_BACKOFF = timedelta(minutes=5)
    with temp_handler("t.touch", _touch), temp_handler("t.flaky", _flaky):
        yield


def test_liveness__a_fresh_job_runs_behind_150_lanes_waiting_for_a_retry(handlers: None) -> None:
    """The issue's reproduction through the public API: 150 records, each with a job that
    fails for a temporary reason (backoff 5 minutes) and a job behind it, then one fresh job
    on another record: one wake-up runs it."""
    held = []
    for customer in CustomerFactory.create_batch(150):
        tombstones.enqueue("t.flaky", customer)
        held.append(tombstones.enqueue("t.touch", customer))
    worker.run()
    assert set(Job.objects.filter(handler="t.flaky").values_list("status", flat=True)) == {
        Status.RETRY_WAIT
    }
    fresh = tombstones.enqueue("t.touch", CustomerFactory())
    worker.run()
    fresh.refresh_from_db()
    assert fresh.status == Status.SUCCEEDED
    # The lanes held by their retries moved on by no job.
    behind = Job.objects.filter(pk__in=[j.pk for j in held])
    assert set(behind.values_list("status", flat=True)) == {Status.QUEUED}


def test_liveness__hints_on_rows_written_finished_are_cleared_and_hide_no_due_job(
    handlers: None,
) -> None:
    """A row inserted finished takes the hint column's default (bench/ledger.py's seed did, six
    million times): such hints come before every real one. The claim clears them from its scan
    of the hints (the look at a lane reads its unfinished jobs only) and one wake-up runs the
    fresh job."""
    customers = CustomerFactory.create_batch(3)
    template = tombstones.enqueue("t.touch", customers[0])
    Job.objects.filter(pk=template.pk).delete()
    stale = []
    for i in range(600):  # more than a claim's looks read hints at once
        template.pk = None
        template.lane = f"written-finished:{i}"
        template.status, template.finished_at = Status.SUCCEEDED, timezone.now()
        template.save(force_insert=True)
        stale.append(template.pk)
    assert Job.objects.filter(pk__in=stale, ready_at__isnull=False).count() == 600
    fresh = [tombstones.enqueue("t.touch", c) for c in customers[1:]]

    worker.run()

    assert set(
        Job.objects.filter(pk__in=[j.pk for j in fresh]).values_list("status", flat=True)
    ) == {Status.SUCCEEDED}
    assert not Job.objects.filter(pk__in=stale, ready_at__isnull=False).exists()


def _block(kind: str, jobs: list[Job]) -> None:
    """Put these lane heads in the state the engine leaves them in (as the job table holds it:
    no shortcut the engine would not take): waiting for a retry an hour away, running under a
    live lease of another worker's claim, or paused."""
    ids = [job.pk for job in jobs]
    rows = Job.objects.filter(pk__in=ids)
    later = Now() + Value(timedelta(hours=1))
    if kind == "retry":
        rows.update(status=Status.RETRY_WAIT, attempts=1, run_after=later, ready_at=later)
    elif kind == "running":
        for pk in ids:  # a claim of its own each: one running job per lane
            Job.objects.filter(pk=pk).update(
                status=Status.RUNNING,
                attempts=1,
                claim_token=f"other{pk}",
                owner="elsewhere:1",
                started_at=Now(),
                lease_expires_at=later,
                ready_at=None,
            )
    else:
        rows.update(status=Status.PAUSED, attempts=1, reason="tombstone_unreadable", ready_at=None)


@pytest.mark.slow
def test_liveness__1000_held_lanes_of_each_kind_never_keep_a_due_head_waiting(
    handlers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 held lanes (retry-waiting, running, paused heads, a job queued behind each), older
    than a fresh job: one wake-up runs the fresh job; once the claims have looked at the held
    lanes, the next fresh job costs the claim as many statements as with no held lane at all."""
    customers = CustomerFactory.create_batch(1000)
    heads, behind = [], []
    for customer in customers:
        heads.append(tombstones.enqueue("t.touch", customer))
        behind.append(tombstones.enqueue("t.touch", customer))
    for n, kind in enumerate(("retry", "running", "paused")):
        _block(kind, heads[n::3])
    fresh = tombstones.enqueue("t.touch", CustomerFactory())
    worker.run()
    fresh.refresh_from_db()
    assert fresh.status == Status.SUCCEEDED
    statuses = set(Job.objects.filter(pk__in=[j.pk for j in behind]).values_list("status"))
    assert statuses == {(Status.QUEUED,)}  # nothing passed its lane's head

    # The held lanes were looked at once: another fresh job reads none of them.
    again = tombstones.enqueue("t.touch", CustomerFactory())
    # Both runs start from the first hint, then read from their floors, whatever the time they
    # take (a floor older than WHOLE_EVERY is a scan from the first hint: one statement less).
    monkeypatch.setattr(hint_floor, "WHOLE_EVERY", 3600.0)
    hint_floor.forget()
    with CaptureQueriesContext(connection) as with_held:
        worker.run()
    again.refresh_from_db()
    assert again.status == Status.SUCCEEDED
    Job.objects.filter(pk__in=[j.pk for j in heads + behind]).delete()
    Customer.all_objects.filter(pk__in=[c.pk for c in customers]).delete()
    alone = tombstones.enqueue("t.touch", CustomerFactory())
    hint_floor.forget()
    with CaptureQueriesContext(connection) as without:
        worker.run()
    alone.refresh_from_db()
    assert alone.status == Status.SUCCEEDED
    assert len(with_held) == len(without), (
        [q["sql"][:120] for q in with_held],
        [q["sql"][:120] for q in without],
    )
    # And no statement of that run names a held lane.
    held_lanes = {j.lane for j in heads}
    named = [q["sql"] for q in with_held if any(f"'{lane}'" in q["sql"] for lane in held_lanes)]
    assert named == []


def test_claim__its_reads_give_each_time_as_stored(handlers: None) -> None:
    """The claim's look, its read of the lanes and its take return datetimes as the rows hold
    them, aware (PostgreSQL sends them in UTC without a zone, which psycopg's C loader reads):
    a hint cleared "as it was read" needs its exact time, to the microsecond."""
    from tombstones.jobs.ledger import heads

    customers = CustomerFactory.create_batch(3)
    jobs = [tombstones.enqueue("t.touch", c) for c in customers]
    stored = {j.pk: Job.objects.get(pk=j.pk) for j in jobs}
    for floor in (None, min(j.ready_at for j in stored.values()) - timedelta(seconds=1)):
        fields = ("lane", "id", "ready_at", "queued_at")
        rows = heads._scan("default", floor, fields, 10, ("default",))
        assert sorted(row[1] for row in rows) == sorted(stored)
        for _, pk, ready_at, queued_at in rows:
            assert (ready_at, queued_at) == (stored[pk].ready_at, stored[pk].queued_at)
            assert ready_at.utcoffset() == timedelta(0)
    fronts, hints = heads.read_lanes_jobs("default", [j.lane for j in jobs], 2)
    for job in jobs:
        (front,) = fronts[job.lane]
        row = stored[job.pk]
        assert (front.queued_at, front.ready_at, front.run_after) == (
            row.queued_at,
            row.ready_at,
            row.run_after,
        )
        assert front.queued_at.utcoffset() == timedelta(0)
        assert hints[job.lane] == [(job.pk, row.ready_at)]
    # Cleared as read: the exact times match the rows.
    picked = heads.Picked(clear=[h for lane in hints.values() for h in lane])
    heads.settle_hints("default", picked)
    assert not Job.objects.filter(pk__in=stored, ready_at__isnull=False).exists()
