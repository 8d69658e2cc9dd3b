"""enqueue(): the snapshot, the refusals, the caller's transaction."""

from __future__ import annotations

import math

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django_q.models import OrmQ, Task

import tombstones
from project.customers.models import CrmContact, Customer
from tests.factories import CustomerFactory
from tombstones.exceptions import InvalidParams, MissingFence, RecordDeleted, UnknownHandler
from tombstones.jobs.ledger import lanes
from tombstones.jobs.models import Lane
from tombstones.models import Job, JobEvent

pytestmark = pytest.mark.django_db

HANDLER = "customers.update_sheet_row"


def test_enqueue__snapshots_generation_version_and_default_lane() -> None:
    customer = CustomerFactory()
    customer.name = "changed"
    customer.save()
    job = tombstones.enqueue(HANDLER, customer, params={"n": 1})
    job.refresh_from_db()
    assert (job.generation, job.version) == (1, 2)
    assert job.lane == f"customers.customer:{customer.pk}"
    assert job.status == Job.Status.QUEUED
    assert job.params == {"n": 1}
    # The job row is the record of the enqueue: no event row, one "enqueued" line in its history.
    assert not job.events.exists()
    [enqueued] = job.history()
    assert (enqueued.event, enqueued.created_at) == ("enqueued", job.created_at)
    assert (enqueued.expected_generation, enqueued.expected_version) == (1, 2)


def test_enqueue__is_one_insert_and_its_lane_held() -> None:
    """One INSERT; on PostgreSQL it names its lane through the lane's row, held (until the
    commit: no claim takes from the lane before the job is in it). The lane's first job makes
    the row, a statement more."""
    customer = CustomerFactory()
    ContentType.objects.get_for_model(customer)  # cached per process, as in a running site
    tombstones.enqueue(HANDLER, customer)  # the lane's first job
    with CaptureQueriesContext(connection) as queries:
        job = tombstones.enqueue(HANDLER, customer)
    statements = [q["sql"] for q in queries]
    assert len(statements) == 1, statements
    if connection.vendor == "postgresql":
        assert statements[0].startswith("WITH guard AS MATERIALIZED"), statements
        assert "FOR NO KEY UPDATE" in statements[0]
        assert 'INSERT INTO "tombstones_job"' in statements[0]
    else:
        assert statements[0].startswith('INSERT INTO "tombstones_job"')
    stored = Job.objects.get(pk=job.pk)
    assert (stored.lane, stored.status, stored.queued_at) == (job.lane, "queued", job.queued_at)
    assert job.ready_at == stored.ready_at is not None  # its lane's hint


def test_enqueue__a_lanes_first_job_is_one_statement_too() -> None:
    """The lane's row is made in the job's INSERT (PostgreSQL): a first job, or a lane this
    process has not seen (another made it), costs one statement; a row that went missing is
    made and held on its own, and the job placed behind it."""
    customer = CustomerFactory()
    ContentType.objects.get_for_model(customer)
    with CaptureQueriesContext(connection) as queries:
        first = tombstones.enqueue(HANDLER, customer)
    assert len(queries) == 1, [q["sql"] for q in queries]
    if connection.vendor != "postgresql":
        return
    assert "made AS (INSERT INTO tombstones_lane" in queries[0]["sql"]
    assert Lane.objects.filter(key=first.lane).count() == 1
    lanes.remember(connection.alias, first.lane, exists=False)  # as another process
    with CaptureQueriesContext(connection) as queries:
        second = tombstones.enqueue(HANDLER, customer)
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert Lane.objects.filter(key=first.lane).count() == 1
    Lane.objects.filter(key=first.lane).delete()  # remembered, but gone
    with CaptureQueriesContext(connection) as queries:
        third = tombstones.enqueue(HANDLER, customer)
    assert 2 < len(queries) <= 4, [q["sql"] for q in queries]
    assert Lane.objects.filter(key=first.lane).count() == 1
    placed = Job.objects.filter(lane=first.lane).order_by("queued_at", "id")
    assert list(placed.values_list("pk", flat=True)) == [first.pk, second.pk, third.pk]
    assert first.queued_at < second.queued_at < third.queued_at


def test_enqueue__ordering_key_overrides_the_lane() -> None:
    job = tombstones.enqueue(HANDLER, CustomerFactory(), ordering_key="tenant-7")
    assert job.lane == "tenant-7"


def test_enqueue__refuses_a_record_without_fence() -> None:
    with pytest.raises(MissingFence):
        tombstones.enqueue(HANDLER, CrmContact.objects.create(idempotency_key="k", reference="r"))
    with pytest.raises(MissingFence):
        tombstones.enqueue(HANDLER, Customer(reference="C-unsaved", name="x", email="x@x.test"))
    assert not Job.objects.exists()


def test_enqueue__refuses_a_tombstone() -> None:
    customer = CustomerFactory()
    customer.delete()
    with pytest.raises(RecordDeleted):
        tombstones.enqueue(HANDLER, customer)
    assert not Job.objects.exists()


def test_enqueue__refuses_an_unknown_handler() -> None:
    with pytest.raises(UnknownHandler, match=r"no\.such\.handler"):
        tombstones.enqueue("no.such.handler", CustomerFactory())
    assert not Job.objects.exists()


@pytest.mark.parametrize("params", [{"s": {1, 2}}, {"f": math.nan}, ["not", "a", "dict"], "x"])
def test_enqueue__refuses_params_that_are_not_json(params: object) -> None:
    with pytest.raises(InvalidParams):
        tombstones.enqueue(HANDLER, CustomerFactory(), params=params)  # type: ignore[arg-type]
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue__rolled_back_request_leaves_no_job_and_no_message(settings: object) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}  # type: ignore[attr-defined]  # a real ORM-broker message
    customer = CustomerFactory()

    def failing_request() -> None:
        with transaction.atomic():
            tombstones.enqueue(HANDLER, customer)
            raise RuntimeError("request failed")

    with pytest.raises(RuntimeError):
        failing_request()
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()
    assert not OrmQ.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue__wakes_a_worker_only_after_commit(settings: object) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}  # type: ignore[attr-defined]
    customer = CustomerFactory()
    with transaction.atomic():
        job = tombstones.enqueue(HANDLER, customer)
        assert not OrmQ.objects.exists()
    assert OrmQ.objects.count() == 1
    # The message carries the job id and nothing else.
    task = OrmQ.objects.get().task
    assert task["args"] == (job.pk,)
    assert task["kwargs"] == {}


@pytest.mark.django_db(transaction=True)
def test_enqueue__sync_mode_runs_the_job_inline_after_commit() -> None:
    customer = CustomerFactory()
    with transaction.atomic():
        job = tombstones.enqueue(HANDLER, customer)
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCEEDED
    assert Task.objects.get().success is True


def test_enqueue__a_lane_whose_row_rolled_back_gets_it_again(postgres_only: None) -> None:
    """The lane's first enqueue made its row and rolled back: the next enqueue, which this
    process believes the row exists for, finds it gone and makes it again (held)."""
    customer = CustomerFactory()

    def failed_request() -> None:
        with transaction.atomic():
            tombstones.enqueue(HANDLER, customer)
            raise RuntimeError("the request failed")

    with pytest.raises(RuntimeError):
        failed_request()
    lane = f"{customer._meta.label_lower}:{customer.pk}"
    assert not Lane.objects.filter(key=lane).exists()
    job = tombstones.enqueue(HANDLER, customer)
    assert job.lane == lane
    assert Lane.objects.filter(key=lane).exists()
    assert Job.objects.filter(lane=lane).count() == 1


# --- one wake-up per transaction (issue 34) -----------------------------------------------------


def test_enqueue__one_wake_up_per_transaction(django_capture_on_commit_callbacks: object) -> None:
    customers = CustomerFactory.create_batch(3)
    with django_capture_on_commit_callbacks() as callbacks:  # type: ignore[operator]
        for customer in customers:
            tombstones.enqueue(HANDLER, customer)
        tombstones.enqueue_many(HANDLER, customers)
    assert len(callbacks) == 1


@pytest.mark.django_db(transaction=True)
def test_enqueue__a_wake_up_rolled_back_with_its_savepoint_is_sent_again(settings: object) -> None:
    """The first enqueue's wake-up was registered inside a savepoint that rolled back: the next
    enqueue, outside it, registers its own, and a message is sent after the commit."""
    settings.TOMBSTONES_Q_OPTIONS = {}  # type: ignore[attr-defined]  # a real ORM-broker message
    first, second = CustomerFactory(), CustomerFactory()
    with transaction.atomic():
        try:
            with transaction.atomic():
                tombstones.enqueue(HANDLER, first)
                raise RuntimeError("the inner block failed")
        except RuntimeError:
            pass
        job = tombstones.enqueue(HANDLER, second)
    assert list(Job.objects.values_list("pk", flat=True)) == [job.pk]
    assert OrmQ.objects.count() == 1
    assert OrmQ.objects.get().task["args"] == (job.pk,)


def test_enqueue__an_outer_wake_up_serves_the_jobs_of_inner_savepoints(
    django_capture_on_commit_callbacks: object,
) -> None:
    first, second = CustomerFactory(), CustomerFactory()
    with django_capture_on_commit_callbacks() as callbacks:  # type: ignore[operator]
        tombstones.enqueue(HANDLER, first)
        with transaction.atomic():
            tombstones.enqueue(HANDLER, second)
    assert len(callbacks) == 1
