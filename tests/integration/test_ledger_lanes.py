"""Lane order under the interleavings a chaos soak found: a job of a lane never starts before
every earlier job of it (by lane place) reached a terminal state.

- An enqueue that commits late: its job took its place at its INSERT, but other sessions saw it
  only at its commit; a later job of the lane that committed first was claimed and ran before
  it (no kill, no take-back). Now a claim skips a lane while one of its enqueues is in flight.
- A worker that stalled past its lease (its renewals failed): another worker took its jobs back
  and ran them, while the stalled one went on starting the followers of its claim. Now a claim
  starts no job past its lease's end as this process measures it.
- A dead claim taken back one row at a time while other workers claimed: now whole, in one
  transaction.
"""

from __future__ import annotations

import threading
import time
import types
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Value
from django.db.models.functions import Now
from django.utils import timezone

import tombstones
from tests.factories import CustomerFactory
from tests.jobkit import JOIN_TIMEOUT, temp_handler
from tombstones.jobs import ledger
from tombstones.jobs.engine import runner
from tombstones.jobs.ledger import claims, lanes, rescue
from tombstones.models import Job

Status = Job.Status
ran: list[int] = []


def _touch(ctx: Any) -> None:
    ran.append(ctx.job.pk)
    ctx.update(phone=f"+{ctx.job.pk}")


@pytest.fixture
def touch(settings: Any) -> Any:
    settings.TOMBSTONES_Q_OPTIONS = {}  # nothing runs until the test runs the worker
    ran.clear()
    with temp_handler("t.touch", _touch):
        yield


def _lane_runs_in_place_order(jobs: list[Job]) -> None:
    """The lane's handlers ran once each, in lane place order, and every job succeeded (the
    pumps here run one at a time: a handler starts after the one before it returned, and a
    follower runs in its head's group, after it)."""
    placed = list(
        Job.objects.filter(pk__in=[j.pk for j in jobs])
        .order_by("queued_at", "id")
        .values_list("pk", "status")
    )
    assert {status for _, status in placed} == {Status.SUCCEEDED}
    mine = {j.pk for j in jobs}
    assert [pk for pk in ran if pk in mine] == [pk for pk, _ in placed]


def _enqueue_in_a_long_transaction(
    customer: Any, early: list[Job]
) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """A started thread that enqueues a job of ``customer``'s lane in a transaction it keeps
    open: ``inserted`` is set once the job is in ``early``, the thread commits on ``commit``."""
    inserted, commit = threading.Event(), threading.Event()

    def enqueue() -> None:
        try:
            with transaction.atomic():
                early.append(tombstones.enqueue("t.touch", customer))
                inserted.set()
                commit.wait(JOIN_TIMEOUT)
        finally:
            connection.close()

    thread = threading.Thread(target=enqueue)
    thread.start()
    return thread, inserted, commit


def _waiting_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


@pytest.mark.parametrize("lane", ["made before", "made by the first", "unknown to the next"])
@pytest.mark.django_db(transaction=True)
def test_order__a_job_whose_enqueue_commits_late_is_not_overtaken(
    postgres_only: None, touch: None, lane: str
) -> None:
    """A job enqueued in a long transaction, and a later job of its lane enqueued meanwhile:
    the later one takes its place (and commits) only after the first committed, so no claim
    can run it first. (It committed first, and ran first, before.) Also when the first job
    makes the lane's row in its INSERT, and when the next enqueue's process has not seen the
    lane: it waits for that row, then holds it."""
    customer = CustomerFactory()
    if lane == "made before":  # the lane's first job (done): the lane has its row
        tombstones.enqueue("t.touch", customer)
        runner.pump()
        ran.clear()
    early: list[Job] = []
    late: list[Job] = []
    pids: list[int] = []
    first, inserted, commit = _enqueue_in_a_long_transaction(customer, early)

    def enqueue_the_next() -> None:
        try:
            if lane == "unknown to the next":  # as another process: its INSERT makes the row
                lanes.remember(connection.alias, early[0].lane, exists=False)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids.append(cursor.fetchone()[0])
            late.append(tombstones.enqueue("t.touch", customer))
        finally:
            connection.close()

    second = threading.Thread(target=enqueue_the_next)
    try:
        assert inserted.wait(JOIN_TIMEOUT)
        second.start()
        deadline = time.monotonic() + JOIN_TIMEOUT
        while not (pids and _waiting_on_a_lock(pids[0])):  # bounded: it waits, or it failed
            assert time.monotonic() < deadline, "the later enqueue did not wait"
            assert second.is_alive() or pids, "the later enqueue ended"
            time.sleep(0.01)
        assert not late  # it waits for the lane's row: nothing of it is visible
        assert ledger.claim(20, whole=True) is None
    finally:
        commit.set()
        first.join(JOIN_TIMEOUT)
        second.join(JOIN_TIMEOUT)
    assert not first.is_alive()
    assert not second.is_alive()
    assert early[0].queued_at < late[0].queued_at
    runner.pump()
    assert ran == [early[0].pk, late[0].pk]
    _lane_runs_in_place_order([early[0], late[0]])


@pytest.mark.django_db(transaction=True)
def test_order__a_delayed_job_waits_for_an_earlier_enqueue_still_in_flight(
    postgres_only: None, touch: None
) -> None:
    """A delayed job's place is its due time. An immediate job of its lane enqueued before that
    time, in a transaction still open when it comes due, is placed before it: no claim takes
    the delayed job until that one committed (and ran)."""
    customer = CustomerFactory()
    tombstones.enqueue("t.touch", customer)  # the lane's row
    runner.pump()
    ran.clear()
    due = timezone.now() + timedelta(seconds=1)
    delayed = tombstones.enqueue("t.touch", customer, run_after=due)
    early: list[Job] = []
    thread, inserted, commit = _enqueue_in_a_long_transaction(customer, early)
    try:
        assert inserted.wait(JOIN_TIMEOUT)
        time.sleep(max(0.0, (due - timezone.now()).total_seconds()) + 0.05)  # its due time
        assert Job.objects.claimable().filter(pk=delayed.pk).exists()  # as far as one can see
        assert ledger.claim(20, whole=True) is None
    finally:
        commit.set()
        thread.join(JOIN_TIMEOUT)
    assert early[0].queued_at < Job.objects.get(pk=delayed.pk).queued_at
    runner.pump()
    assert ran == [early[0].pk, delayed.pk]


@pytest.mark.django_db
def test_order__a_worker_past_its_lease_starts_no_more_jobs_of_its_claim(
    touch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's handler runs; meanwhile (as this worker's clock sees it) an hour passes with
    no renewal: the followers it reserved are not started, and go back to the queue as they
    were (another worker may have taken them back by then and run them)."""
    customer = CustomerFactory()
    jobs = [tombstones.enqueue("t.touch", customer) for _ in range(3)]
    stalled = types.SimpleNamespace(monotonic=lambda: time.monotonic() + 3600)

    def stall(ctx: Any) -> None:
        _touch(ctx)
        monkeypatch.setattr(claims, "time", stalled)

    with temp_handler("t.stall", stall):
        Job.objects.filter(pk=jobs[0].pk).update(handler="t.stall")
        taken = ledger.claim(20, whole=True)
        assert taken is not None
        assert [j.pk for j in taken.jobs] == [j.pk for j in jobs]  # a head and two followers
        runner.run_claim(taken)
    monkeypatch.undo()
    assert ran == [jobs[0].pk]
    rows = dict(Job.objects.values_list("pk", "status"))
    assert rows == {jobs[0].pk: Status.SUCCEEDED, **{j.pk: Status.QUEUED for j in jobs[1:]}}
    back = Job.objects.filter(pk__in=[j.pk for j in jobs[1:]])
    assert set(back.values_list("claim_token", "attempts")) == {("", 0)}
    runner.pump()
    assert ran == [j.pk for j in jobs]
    _lane_runs_in_place_order(jobs)


@pytest.mark.django_db(transaction=True)
def test_order__a_dead_claim_is_taken_back_whole_while_others_claim(
    postgres_only: None, touch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim of four heads and fifteen followers of one lane, its worker dead: while the
    take-back runs, another worker's claims see all of it held or all of it back, never some
    followers back behind a head still held; afterwards the lane runs in its order."""
    customer = CustomerFactory()
    lane = [tombstones.enqueue("t.touch", customer) for _ in range(16)]
    others = [tombstones.enqueue("t.touch", CustomerFactory()) for _ in range(3)]
    dead = ledger.claim(20, whole=True)
    assert dead is not None
    assert len(dead.jobs) == 19
    Job.objects.filter(claim_token=dead.token, status=Status.RUNNING).update(
        lease_expires_at=Now() - Value(timedelta(minutes=1))
    )
    first_done, go_on = threading.Event(), threading.Event()
    real = rescue.transition

    # Holds the take-back after its first job's change (what any version of it does per job).
    def slow_transition(*args: Any, **kwargs: Any) -> int:
        changed = real(*args, **kwargs)
        first_done.set()
        go_on.wait(JOIN_TIMEOUT)
        return changed

    monkeypatch.setattr(rescue, "transition", slow_transition)
    results: list[Any] = []

    def take_back() -> None:
        try:
            results.append(ledger.take_back_lapsed())
        finally:
            connection.close()

    thread = threading.Thread(target=take_back)
    thread.start()
    try:
        assert first_done.wait(JOIN_TIMEOUT)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # a claim that waited would fail
        assert ledger.claim(20, whole=True) is None  # all of it still held
    finally:
        go_on.set()
        thread.join(JOIN_TIMEOUT)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert results
    assert results[0]["requeued"] == 4
    for _ in range(40):
        if not runner.pump():
            break
    _lane_runs_in_place_order(lane)
    assert set(Job.objects.filter(pk__in=[j.pk for j in others]).values_list("status")) == {
        (Status.SUCCEEDED,)
    }
