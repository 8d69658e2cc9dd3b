"""enqueue_many(): one INSERT for many records, with the single enqueue's snapshots, lanes and
refusals, and one wake-up."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django_q.models import OrmQ

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import run, run_together
from tombstones.exceptions import InvalidParams, RecordDeleted, UnknownHandler
from tombstones.jobs.models import Lane
from tombstones.models import Job

pytestmark = pytest.mark.django_db

HANDLER = "customers.update_sheet_row"


def _fresh(customer: Customer) -> Customer:
    return Customer.objects.get(pk=customer.pk)


def test_enqueue_many__the_same_rows_as_one_enqueue_each() -> None:
    first, second = CustomerFactory(), CustomerFactory()
    second.name = "edited"
    second.save()  # version 2
    jobs = tombstones.enqueue_many(HANDLER, [first, second], params={"n": 1})
    single = tombstones.enqueue(HANDLER, first, params={"n": 1})
    stored = {job.pk: job for job in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    assert [stored[j.pk].object_id for j in jobs] == [str(first.pk), str(second.pk)]
    assert [(stored[j.pk].generation, stored[j.pk].version) for j in jobs] == [(1, 1), (1, 2)]
    columns = ("handler", "content_type_id", "lane", "status", "params", "external")
    same = [getattr(stored[jobs[0].pk], name) for name in columns]
    assert same == [getattr(Job.objects.get(pk=single.pk), name) for name in columns]
    # The returned jobs hold what the database set (their places, their hints).
    for job in jobs:
        row = stored[job.pk]
        assert (job.queued_at, job.created_at, job.run_after) == (
            row.queued_at,
            row.created_at,
            row.run_after,
        )
        assert job.queued_at is not None
        assert row.ready_at is not None


def _columns(job: Job) -> dict[str, Any]:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


@pytest.mark.parametrize("shape", ["one record", "one record twice", "records that differ"])
def test_enqueue_many__each_job_is_returned_as_it_is_stored(shape: str) -> None:
    """Every column of every job, as the INSERT wrote it and as the instance returned holds it:
    the bulk INSERT sends a column whose value is the same for every job once (all of them, for
    one record, or one record twice in its lane), the others as an array per column."""
    first, second = CustomerFactory(), CustomerFactory()
    second.name = "edited"
    second.save()  # version 2: generation, version, object id and lane differ from the first's
    records = {
        "one record": [first],
        "one record twice": [first, _fresh(first)],
        "records that differ": [first, second, _fresh(first)],
    }[shape]
    jobs = tombstones.enqueue_many(HANDLER, records, params={"n": 7})
    stored = {job.pk: job for job in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    assert len(stored) == len(records)
    for job, record in zip(jobs, records, strict=True):
        assert _columns(job) == _columns(stored[job.pk])
        assert (job.object_id, job.version) == (str(record.pk), record.version)
        assert job.params == {"n": 7}
        assert job.content_type == ContentType.objects.get_for_model(Customer)
    in_lane = Job.objects.filter(lane=jobs[0].lane).order_by("queued_at", "id")
    assert [j.pk for j in in_lane if j.object_id == str(first.pk)] == [
        j.pk for j in jobs if j.object_id == str(first.pk)
    ]


def test_enqueue_many__instances_as_the_keyword_road_makes_them() -> None:
    """The bulk enqueue builds its instances positionally: the same values as ``Job(**row)``,
    defaults made per instance (a dict is not shared), a relation cached as given."""
    from tombstones.jobs.ledger.insert import _instances

    kind = ContentType.objects.get_for_model(Customer)
    rows: list[dict[str, Any]] = [
        {"handler": "h", "content_type": kind, "object_id": "1", "lane": "a", "priority": 3},
        {"handler": "h", "content_type": None, "object_id": "", "lane": "b", "traceparent": "t"},
        {"handler": "h", "content_type_id": kind.pk, "lane": "c", "params": {"x": 1}},
    ]
    made = _instances(rows)
    for job, row in zip(made, rows, strict=True):
        expected = Job(**row)
        assert _columns(job) == _columns(expected)
        assert job._state.adding
        assert job._state.db is None
    assert made[0].content_type is kind
    assert made[1].content_type is None
    assert made[0].params is not made[1].params  # each its own default dict
    with pytest.raises(TypeError, match="nosuch"):
        _instances([{"handler": "h", "nosuch": 1}])


def test_enqueue_many__one_lane_takes_its_places_in_the_order_given() -> None:
    customer = CustomerFactory()
    earlier = tombstones.enqueue(HANDLER, customer, params={"n": 0})
    jobs = tombstones.enqueue_many(
        HANDLER, [customer, customer, customer], params={"n": 1}, ordering_key="one-lane"
    )
    more = tombstones.enqueue_many(HANDLER, [customer, customer])
    in_lane = list(Job.objects.filter(lane="one-lane").order_by("queued_at", "id"))
    assert [j.pk for j in in_lane] == [j.pk for j in jobs]
    own = list(Job.objects.filter(lane=earlier.lane).order_by("queued_at", "id"))
    assert [j.pk for j in own] == [earlier.pk, *[j.pk for j in more]]


def test_enqueue_many__is_a_bounded_number_of_statements(
    django_capture_on_commit_callbacks: Any,
) -> None:
    customers = CustomerFactory.create_batch(30)
    ContentType.objects.get_for_model(Customer)  # cached per process, as in a running site
    with (
        CaptureQueriesContext(connection) as queries,
        django_capture_on_commit_callbacks() as callbacks,
    ):
        jobs = tombstones.enqueue_many(HANDLER, customers)
    # PostgreSQL: the lanes' rows made, held, then one INSERT; SQLite: the INSERT.
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(statements) == (3 if connection.vendor == "postgresql" else 1), statements
    assert len(jobs) == 30
    assert Job.objects.count() == 30
    assert len(callbacks) == 1  # one wake-up for all of them
    if connection.vendor == "postgresql":
        assert Lane.objects.filter(key__in=[j.lane for j in jobs]).count() == 30


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("tombstone", RecordDeleted),
        ("params", InvalidParams),
    ],
)
def test_enqueue_many__one_refusal_refuses_all_before_any_sql(bad: str, error: type) -> None:
    customers = CustomerFactory.create_batch(3)
    params: dict[str, Any] | None = None
    if bad == "tombstone":
        _fresh(customers[1]).delete()
        customers[1] = Customer.all_objects.get(pk=customers[1].pk)
    else:
        params = {"note": customers[2].email}  # personal data of the third record
    with CaptureQueriesContext(connection) as queries, pytest.raises(error):
        tombstones.enqueue_many(HANDLER, customers, params=params)
    assert not [q for q in queries if "tombstones_job" in q["sql"]]
    assert not Job.objects.exists()


def test_enqueue_many__an_unknown_handler_or_nothing_to_queue() -> None:
    with pytest.raises(UnknownHandler):
        tombstones.enqueue_many("no.such.handler", [CustomerFactory()])
    assert tombstones.enqueue_many(HANDLER, []) == []
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_many__one_message_after_commit_none_after_a_rollback(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}  # a real ORM-broker message
    customers = CustomerFactory.create_batch(5)

    def failed_request() -> None:
        with transaction.atomic():
            tombstones.enqueue_many(HANDLER, customers)
            raise RuntimeError("the request failed")

    with pytest.raises(RuntimeError):
        failed_request()
    assert not Job.objects.exists()
    assert not OrmQ.objects.exists()
    with transaction.atomic():
        jobs = tombstones.enqueue_many(HANDLER, customers)
        assert not OrmQ.objects.exists()
    assert OrmQ.objects.count() == 1
    assert OrmQ.objects.get().task["args"] == (jobs[0].pk,)


def test_enqueue_many__the_worker_runs_them_fenced() -> None:
    customers = CustomerFactory.create_batch(4)
    jobs = tombstones.enqueue_many(HANDLER, customers)
    _fresh(customers[0]).delete()  # after its enqueue: its job is rejected
    for job in jobs:
        run(job)
    statuses = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    assert statuses[jobs[0].pk] == Job.Status.REJECTED
    assert [statuses[j.pk] for j in jobs[1:]] == [Job.Status.SUCCEEDED] * 3


@pytest.mark.django_db(transaction=True)
def test_enqueue_many__two_at_once_on_the_same_lanes_never_deadlock(postgres_only: None) -> None:
    """Two requests queue jobs for the same 40 records in opposite orders, released together:
    the lanes are held in key order, so neither waits for the other in a circle (PostgreSQL
    would abort one with a deadlock), and each lane keeps one request's jobs before the
    other's."""
    customers = CustomerFactory.create_batch(40)
    for _ in range(5):
        Job.objects.all().delete()

        def request(records: list[Customer]) -> list[int]:
            with transaction.atomic():
                return [j.pk for j in tombstones.enqueue_many(HANDLER, records)]

        first, second = run_together(
            lambda: request(customers), lambda: request(list(reversed(customers)))
        )
        assert isinstance(first, list), first
        assert isinstance(second, list), second
        for customer in customers:
            lane = list(
                Job.objects.filter(object_id=str(customer.pk))
                .order_by("queued_at", "id")
                .values_list("pk", flat=True)
            )
            assert len(lane) == 2
        # One request committed first: its jobs come first in every lane.
        ahead = {
            Job.objects.filter(object_id=str(c.pk)).order_by("queued_at", "id").first().pk
            for c in customers
        }
        assert ahead in (set(first), set(second))


def test_enqueue_many__delayed_jobs_take_their_places_when_due() -> None:
    from datetime import timedelta

    from django.utils import timezone

    customers = CustomerFactory.create_batch(3)
    at = timezone.now() + timedelta(minutes=5)
    jobs = tombstones.enqueue_many(HANDLER, customers, run_after=at)
    stored = list(Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("id"))
    assert [(j.run_after, j.queued_at, j.ready_at) for j in stored] == [(at, at, at)] * 3
    assert [j.run_after for j in jobs] == [at] * 3
    assert not Job.objects.claimable().exists()  # not due yet
    # Not before now: a past time is placed at the enqueue, as the single enqueue does.
    late = tombstones.enqueue_many(HANDLER, customers[:1], run_after=timezone.now())
    row = Job.objects.get(pk=late[0].pk)
    assert row.queued_at >= row.created_at
