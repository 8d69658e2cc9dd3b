"""Coalescing per record (tombstones.jobs.coalescing): the newest job wins, never a started one,
lanes and fences kept; the debounce window, its maximum delay and its two edges; bad options
refused at definition. SQLite and PostgreSQL alike."""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections, transaction
from django.db.models import Value
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import make_due, run, temp_handler
from tombstones.exceptions import InvalidParams, MissingFence
from tombstones.jobs import registry
from tombstones.jobs.models import OutcomeRollup
from tombstones.models import Job, JobEvent
from tombstones.signals import job_finished

pytestmark = pytest.mark.django_db

Status, Reason = Job.Status, Job.Reason
SYNC = "t.coalesce_sync"


@pytest.fixture
def calls() -> Iterator[list[tuple[str, int, int]]]:
    """A coalescing handler that notes (handler, job id, version seen) per run, and a plain one."""
    seen: list[tuple[str, int, int]] = []

    def sync(ctx: Any) -> None:
        seen.append((SYNC, ctx.job.pk, ctx.record.version))
        ctx.update(phone="+1")

    def other(ctx: Any) -> None:
        seen.append(("t.other", ctx.job.pk, ctx.record.version))

    with temp_handler(SYNC, sync, coalesce=True), temp_handler("t.other", other):
        yield seen


def _status(job: Job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.status, job.reason


# --- the newest wins ----------------------------------------------------------------------------


def test_coalesce__the_newest_job_of_a_record_runs_the_others_are_superseded(
    calls: list[Any],
) -> None:
    customer = CustomerFactory()
    first = tombstones.enqueue(SYNC, customer, params={"n": 1})
    second = tombstones.enqueue(SYNC, customer, params={"n": 2})
    third = tombstones.enqueue(SYNC, customer, params={"n": 3})

    for older in (first, second):
        older.refresh_from_db()
        assert (older.status, older.reason) == (Status.SUPERSEDED, Reason.COALESCED)
        assert older.finished_at is not None
        assert older.attempts == 0
        assert older.params == {}
        assert [e.event for e in older.history()][-1] == JobEvent.Event.SUPERSEDED
    third = run(third)
    assert (third.status, third.reason) == (Status.SUCCEEDED, Reason.NONE)
    assert calls == [(SYNC, third.pk, customer.version)]  # one run: the newest's


def test_coalesce__other_records_handlers_and_keys_do_not_coalesce(calls: list[Any]) -> None:
    one, two = CustomerFactory(), CustomerFactory()
    with temp_handler("t.keyed", lambda ctx: None, coalesce=lambda params: params["field"]):
        jobs = [
            tombstones.enqueue(SYNC, one),
            tombstones.enqueue(SYNC, two),
            tombstones.enqueue("t.other", one),
            tombstones.enqueue("t.keyed", one, params={"field": "email"}),
            tombstones.enqueue("t.keyed", one, params={"field": "phone"}),
        ]
        assert [_status(job)[0] for job in jobs] == [Status.QUEUED] * 5
        newer = tombstones.enqueue("t.keyed", one, params={"field": "email"})
        assert _status(jobs[3]) == (Status.SUPERSEDED, Reason.COALESCED)
        assert _status(jobs[4])[0] == _status(newer)[0] == Status.QUEUED


def test_coalesce__a_started_job_is_never_touched(calls: list[Any]) -> None:
    customer = CustomerFactory()
    tries = []

    def flaky(ctx: Any) -> None:
        tries.append(ctx.job.pk)
        if len(tries) == 1:
            raise tombstones.TransientError("the CRM is down")

    with temp_handler("t.flaky", flaky, coalesce=True):
        first = run(tombstones.enqueue("t.flaky", customer))
        assert first.status == Status.RETRY_WAIT
        assert first.attempts == 1
        second = tombstones.enqueue("t.flaky", customer)
        assert _status(first)[0] == Status.RETRY_WAIT  # it started: it keeps its place
        make_due(first)
        run(first)
        run(second)
    assert _status(first)[0] == _status(second)[0] == Status.SUCCEEDED
    assert tries == [first.pk, first.pk, second.pk]


def test_coalesce__a_resent_uncertain_call_is_never_superseded() -> None:
    customer = CustomerFactory()
    with temp_handler("t.send", lambda ctx: None, external=True, coalesce=True):
        resent = tombstones.enqueue("t.send", customer)
        # As staff's "resend once" leaves it: queued again, its first attempt spent.
        Job.objects.filter(pk=resent.pk).update(attempts=1, reason=Reason.OUTCOME_UNKNOWN)
        uncertain = tombstones.enqueue("t.send", customer)
        Job.objects.filter(pk=uncertain.pk).update(
            status=Status.UNCERTAIN, reason=Reason.OUTCOME_UNKNOWN, attempts=1, finished_at=Now()
        )
        tombstones.enqueue("t.send", customer)
    assert _status(resent) == (Status.QUEUED, Reason.OUTCOME_UNKNOWN)
    assert _status(uncertain) == (Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN)


def test_coalesce__a_later_job_never_overtakes_an_earlier_uncoalesced_one(
    calls: list[Any],
) -> None:
    customer = CustomerFactory()
    old = tombstones.enqueue(SYNC, customer)
    between = tombstones.enqueue("t.other", customer)
    newest = tombstones.enqueue(SYNC, customer)
    assert _status(old) == (Status.SUPERSEDED, Reason.COALESCED)
    run(newest)  # a worker takes lane heads: "between" first
    run(newest)
    assert [(name, pk) for name, pk, _ in calls] == [("t.other", between.pk), (SYNC, newest.pk)]


# --- the fence ------------------------------------------------------------------------------------


def test_coalesce__the_survivor_is_rejected_after_a_delete_or_a_recreate(calls: list[Any]) -> None:
    deleted, recreated = CustomerFactory(), CustomerFactory()
    jobs = {c.pk: [tombstones.enqueue(SYNC, c) for _ in range(2)] for c in (deleted, recreated)}
    deleted.delete()
    recreated.delete()
    Customer.all_objects.recreate(reference=recreated.reference, name="New", email="n@example.com")

    assert _status(run(jobs[deleted.pk][1])) == (Status.REJECTED, Reason.SOURCE_DELETED)
    assert _status(run(jobs[recreated.pk][1])) == (Status.REJECTED, Reason.GENERATION_CHANGED)
    assert _status(jobs[deleted.pk][0]) == (Status.SUPERSEDED, Reason.COALESCED)
    assert calls == []


def test_coalesce__the_survivor_carries_the_newest_snapshot(calls: list[Any]) -> None:
    customer = CustomerFactory()
    first = tombstones.enqueue(SYNC, customer)
    customer.name = "Edited"
    customer.save()
    second = tombstones.enqueue(SYNC, customer)
    assert (first.version, second.version) == (customer.version - 1, customer.version)
    assert _status(run(second))[0] == Status.SUCCEEDED
    assert calls == [(SYNC, second.pk, customer.version)]


# --- the debounce window ------------------------------------------------------------------------


def _seconds_from_now(moment: Any) -> float:
    return (moment - timezone.now()).total_seconds()


def test_debounce__trailing_each_job_waits_the_window_and_the_newest_runs() -> None:
    customer = CustomerFactory()
    with temp_handler(
        "t.debounced",
        lambda ctx: None,
        coalesce=True,
        debounce=timedelta(seconds=30),
        max_delay=timedelta(minutes=5),
    ):
        first = tombstones.enqueue("t.debounced", customer)
        second = tombstones.enqueue("t.debounced", customer)
        assert 25 < _seconds_from_now(second.run_after) <= 30.5
        assert _status(first) == (Status.SUPERSEDED, Reason.COALESCED)
        first.refresh_from_db()
        assert second.window_started_at == first.window_started_at  # one window
        assert _status(run(second))[0] == Status.QUEUED  # not due
        make_due(second)
        assert _status(run(second))[0] == Status.SUCCEEDED


def test_debounce__max_delay_bounds_how_long_a_stream_postpones_the_newest() -> None:
    customer = CustomerFactory()
    with temp_handler(
        "t.bounded",
        lambda ctx: None,
        coalesce=True,
        debounce=timedelta(seconds=30),
        max_delay=timedelta(seconds=40),
    ):
        first = tombstones.enqueue("t.bounded", customer)
        # The window opened 35 s ago: a stream of edits has kept it open since.
        Job.objects.filter(pk=first.pk).update(
            window_started_at=Now() - Value(timedelta(seconds=35))
        )
        newest = tombstones.enqueue("t.bounded", customer)
    # Due 40 s after the window opened, 5 s from now, not 30 s from now.
    assert 3 < _seconds_from_now(newest.run_after) <= 5.5
    assert _status(first) == (Status.SUPERSEDED, Reason.COALESCED)


def test_debounce__a_due_job_is_left_to_run_and_the_next_opens_a_window() -> None:
    customer = CustomerFactory()
    with temp_handler(
        "t.due",
        lambda ctx: None,
        coalesce=True,
        debounce=timedelta(seconds=30),
        max_delay=timedelta(seconds=40),
    ):
        first = tombstones.enqueue("t.due", customer)
        make_due(first)  # its window's time came; no worker took it yet
        second = tombstones.enqueue("t.due", customer)
    # Superseding it would postpone its window's run at every edit, past max_delay.
    assert _status(first) == (Status.QUEUED, Reason.NONE)
    second.refresh_from_db()
    first.refresh_from_db()
    assert second.window_started_at > first.window_started_at
    assert 25 < _seconds_from_now(second.run_after) <= 30.5


def test_debounce__leading_edge_runs_the_first_at_once_and_the_rest_at_the_window_end() -> None:
    customer = CustomerFactory()
    with temp_handler(
        "t.leading",
        lambda ctx: None,
        coalesce=True,
        debounce=timedelta(seconds=30),
        max_delay=timedelta(seconds=30),
        edge="leading",
    ):
        leader = tombstones.enqueue("t.leading", customer)
        assert _seconds_from_now(leader.run_after) <= 0.5  # due now
        second = tombstones.enqueue("t.leading", customer)
        third = tombstones.enqueue("t.leading", customer)
        # The leader, due, is left to run; the rest of the window is one job at its end.
        assert _status(leader) == (Status.QUEUED, Reason.NONE)
        assert _status(second) == (Status.SUPERSEDED, Reason.COALESCED)
        end = leader.window_started_at + timedelta(seconds=30)
        assert abs((third.run_after - end).total_seconds()) < 0.01
        assert _status(run(leader))[0] == Status.SUCCEEDED
        assert _status(third)[0] == Status.QUEUED
        # Once the window is over, the next job leads a new one.
        Job.objects.filter(pk__in=[leader.pk, second.pk, third.pk]).update(
            window_started_at=Now() - Value(timedelta(minutes=1))
        )
        later = tombstones.enqueue("t.leading", customer)
        assert _seconds_from_now(later.run_after) <= 0.5
        assert _status(third) == (Status.SUPERSEDED, Reason.COALESCED)


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"coalesce": True, "debounce": timedelta(seconds=1)}, "needs max_delay"),
        ({"coalesce": True, "debounce": timedelta(seconds=-1), "max_delay": timedelta(1)}, "pos"),
        ({"coalesce": True, "debounce": timedelta(0), "max_delay": timedelta(1)}, "positive"),
        ({"coalesce": True, "debounce": 5, "max_delay": timedelta(1)}, "positive timedelta"),
        (
            {"coalesce": True, "debounce": timedelta(seconds=9), "max_delay": timedelta(seconds=5)},
            "at least the debounce",
        ),
        ({"coalesce": True, "plain": True}, "no record to coalesce on"),
        ({"coalesce": True, "max_delay": timedelta(seconds=5)}, "need a debounce"),
        ({"debounce": timedelta(seconds=1), "max_delay": timedelta(1)}, "need coalesce"),
        (
            {
                "coalesce": True,
                "debounce": timedelta(seconds=1),
                "max_delay": timedelta(1),
                "edge": "middle",
            },
            "edge is",
        ),
        ({"coalesce": "yes"}, "coalesce is True, False or a function"),
    ],
)
def test_coalesce__bad_options_are_refused_at_definition(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        registry.handler("t.bad_coalesce", **options)(lambda ctx: None)
    assert registry.registered_as("t.bad_coalesce") is None


def test_coalesce__a_key_that_is_no_str_is_refused_before_any_write() -> None:
    customer = CustomerFactory()
    key = lambda params: params.get("n")  # noqa: E731 - returns an int, not a str
    with (
        temp_handler("t.badkey", lambda ctx: None, coalesce=key),
        pytest.raises(InvalidParams, match="coalescing key"),
    ):
        tombstones.enqueue("t.badkey", customer, params={"n": 1})
    assert not Job.objects.filter(handler="t.badkey").exists()


def test_coalesce__a_plain_enqueue_of_a_coalescing_handler_is_refused(calls: list[Any]) -> None:
    with pytest.raises(MissingFence):
        tombstones.enqueue_plain(SYNC)


# --- many at once -------------------------------------------------------------------------------


def test_coalesce__enqueue_many_leaves_the_last_job_of_each_record(calls: list[Any]) -> None:
    one, two = CustomerFactory(), CustomerFactory()
    jobs = tombstones.enqueue_many(SYNC, [one, two, one, two, one])
    assert [_status(job)[0] for job in jobs] == [
        Status.SUPERSEDED,
        Status.SUPERSEDED,
        Status.SUPERSEDED,
        Status.QUEUED,
        Status.QUEUED,
    ]


def test_coalesce__enqueue_many_checks_every_key_before_any_write() -> None:
    one, two = CustomerFactory(), CustomerFactory()
    key = lambda params: params.get("field")  # noqa: E731 - None for a job without "field"
    with (
        temp_handler("t.keyed_many", lambda ctx: None, coalesce=key),
        pytest.raises(InvalidParams, match="coalescing key"),
    ):
        tombstones.enqueue_many("t.keyed_many", [one, two], params={"n": 1})
    assert not Job.objects.filter(handler="t.keyed_many").exists()


def _enqueue_in_child(pk: int, barrier: Any, out: Any) -> None:
    """A process of its own (forked: the handler registered, no connection open), released with
    the others by the barrier, enqueueing in a transaction of its own."""
    try:
        customer = Customer.objects.get(pk=pk)
        barrier.wait(timeout=30)
        with transaction.atomic():
            out.put(tombstones.enqueue(SYNC, customer).pk)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        out.put(repr(exc))
    finally:
        connections.close_all()


# --- its cost and its announcements -----------------------------------------------------------

WINDOWS = {
    "no window": {},
    "trailing": {"debounce": timedelta(seconds=30), "max_delay": timedelta(minutes=5)},
    "leading": {
        "debounce": timedelta(seconds=30),
        "max_delay": timedelta(seconds=30),
        "edge": "leading",
    },
}


@pytest.mark.parametrize("window", list(WINDOWS))
def test_coalesce__an_enqueue_is_one_statement_plus_the_lane_hold(window: str) -> None:
    customer = CustomerFactory()
    with temp_handler("t.cost", lambda ctx: None, coalesce=True, **WINDOWS[window]):
        tombstones.enqueue("t.cost", customer)  # the lane's row exists: its hold is one read
        tombstones.enqueue("t.cost", customer)  # a window's waiting job to supersede
        with transaction.atomic(), CaptureQueriesContext(connection) as captured:
            newest = tombstones.enqueue("t.cost", customer)
    statements = [q["sql"] for q in captured.captured_queries]
    assert Job.objects.filter(pk__lt=newest.pk, status=Status.SUPERSEDED).count() >= 1
    if connection.vendor == "postgresql":
        # The lane's row held, then the UPDATE, the events and the INSERT in one statement.
        assert len(statements) == 2, statements
        assert "FOR NO KEY UPDATE" in statements[0]
    else:
        # SQLite: the UPDATE, the INSERT, the events; a window's due time read back; the leading
        # edge's open window read first.
        assert len(statements) == {"no window": 3, "trailing": 4, "leading": 5}[window], statements


def test_coalesce__a_superseded_job_is_announced_after_commit_and_counted(
    calls: list[Any], caplog: pytest.LogCaptureFixture, django_capture_on_commit_callbacks: Any
) -> None:
    customer = CustomerFactory()
    finished: list[tuple[int, str, str, Any]] = []

    def receiver(sender: Any, job: Job, status: str, reason: str, **kwargs: Any) -> None:
        finished.append((job.pk, status, reason, job.finished_at))

    job_finished.connect(receiver)
    try:
        with (
            caplog.at_level(logging.INFO, logger="tombstones"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            old = tombstones.enqueue(SYNC, customer, params={"phone": "+1 555 0100"})
            tombstones.enqueue(SYNC, customer)
            assert finished == []  # after the commit only
    finally:
        job_finished.disconnect(receiver)
    old.refresh_from_db()
    assert [f for f in finished if f[0] == old.pk] == [
        (old.pk, Status.SUPERSEDED, Reason.COALESCED, old.finished_at)
    ]
    lines = [r for r in caplog.records if f"job {old.pk} superseded" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO]
    assert "555" not in caplog.text  # ids and reasons only
    counted = OutcomeRollup.objects.filter(status=Status.SUPERSEDED, reason=Reason.COALESCED)
    assert sum(counted.values_list("jobs", flat=True)) == 1


ROUNDS = 15
RACERS = 3


@pytest.mark.django_db(transaction=True)
def test_coalesce__concurrent_enqueues_from_processes_leave_exactly_one_survivor(
    calls: list[Any], settings: Any
) -> None:
    # As web requests: the wake-ups go to the broker, no worker runs a job in between.
    settings.TOMBSTONES_Q_OPTIONS = {}
    fork = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        customer = CustomerFactory()
        connections.close_all()  # the children open their own
        barrier, out = fork.Barrier(RACERS), fork.Queue()
        children = [
            fork.Process(target=_enqueue_in_child, args=(customer.pk, barrier, out))
            for _ in range(RACERS)
        ]
        for child in children:
            child.start()
        made = [out.get(timeout=60) for _ in children]
        for child in children:
            child.join(30)
        assert all(isinstance(pk, int) for pk in made), made
        status = dict(Job.objects.filter(pk__in=made).values_list("pk", "status"))
        survivors = [pk for pk in made if status[pk] != Status.SUPERSEDED]
        # One survivor, the newest (each enqueue took its place behind the others' commits);
        # the wake-up after its commit may have run it already.
        assert survivors == [max(made)], (round_, status)
        assert status[max(made)] == Status.QUEUED


def test_coalesce__the_rejection_log_lists_coalesced_jobs(
    calls: list[Any], admin_client: Client
) -> None:
    customer = CustomerFactory()
    old = tombstones.enqueue(SYNC, customer)
    tombstones.enqueue(SYNC, customer)
    page = admin_client.get(reverse("admin:tombstones_rejection_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "coalesced" in html
    assert f">{old.pk}<" in html.replace("#", "")
    job_page = admin_client.get(reverse("admin:tombstones_job_change", args=(old.pk,)))
    text = job_page.content.decode()
    assert 'data-status="superseded"' in text  # its badge: colour, shape and word
    assert "coalesced" in text
