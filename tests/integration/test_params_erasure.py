"""Job params outlive no record: erased in the tombstoning transaction, and by purge."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, models, transaction
from django.db.models import Value
from django.db.models.functions import Now

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import JOIN_TIMEOUT, run, temp_handler
from tombstones.models import Job, JobEvent

pytestmark = pytest.mark.django_db

# Not personal (enqueue would refuse that), but it must not outlive the record either.
SECRET = "opaque-token-8812"
HANDLER = "customers.update_sheet_row"
PROPAGATE = "tests.propagate_delete"


@pytest.fixture
def propagate() -> Iterator[str]:
    """A handler that runs on tombstones: its unfinished jobs still need their params."""
    with temp_handler(PROPAGATE, lambda ctx: None, accepts_tombstones=True):
        yield PROPAGATE


def stored_params() -> dict[int, Any]:
    """Every job's params as the database holds them (no model, no cache)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, params FROM tombstones_job")
        rows = cursor.fetchall()
    return {pk: json.loads(value) if isinstance(value, str) else value for pk, value in rows}


def erased_events() -> set[int]:
    return set(
        JobEvent.objects.filter(event=JobEvent.Event.PARAMS_ERASED).values_list("job_id", flat=True)
    )


def _scene(customer: Customer) -> dict[str, Job]:
    finished = run(tombstones.enqueue(HANDLER, customer, params={"token": SECRET}))
    assert finished.status == Job.Status.SUCCEEDED
    customer.refresh_from_db()
    return {
        "finished": finished,
        "queued": tombstones.enqueue(HANDLER, customer, params={"token": SECRET}),
        "propagating": tombstones.enqueue(PROPAGATE, customer, params={"token": SECRET}),
        "empty": tombstones.enqueue(HANDLER, customer),
    }


def test_instance_delete__erases_params_of_the_records_jobs(propagate: str) -> None:
    customer = CustomerFactory()
    jobs = _scene(customer)
    other = tombstones.enqueue(HANDLER, CustomerFactory(), params={"token": SECRET})

    customer.delete()

    params = stored_params()
    assert params[jobs["finished"].pk] == {}
    assert params[jobs["queued"].pk] == {}  # it will be rejected: it needs nothing
    assert params[jobs["propagating"].pk] == {"token": SECRET}  # runs on the tombstone
    assert params[other.pk] == {"token": SECRET}  # another record's job
    # One event per erased job; none where there was nothing to erase.
    assert erased_events() == {jobs["finished"].pk, jobs["queued"].pk}
    event = JobEvent.objects.get(job=jobs["queued"], event="params_erased")
    assert (event.object_id, event.expected_generation) == (str(customer.pk), 1)
    assert event.reason == ""


def test_queryset_delete__erases_params_of_every_deleted_records_jobs() -> None:
    first, second, kept = CustomerFactory(), CustomerFactory(), CustomerFactory()
    jobs = [tombstones.enqueue(HANDLER, c, params={"token": SECRET}) for c in (first, second)]
    other = tombstones.enqueue(HANDLER, kept, params={"token": SECRET})

    count, _ = Customer.objects.filter(pk__in=[first.pk, second.pk]).delete()

    assert count == 2
    params = stored_params()
    assert [params[job.pk] for job in jobs] == [{}, {}]
    assert params[other.pk] == {"token": SECRET}
    assert erased_events() == {job.pk for job in jobs}


def test_delete__that_rolls_back_erases_nothing() -> None:
    customer = CustomerFactory()
    job = tombstones.enqueue(HANDLER, customer, params={"token": SECRET})

    def failing_request() -> None:
        with transaction.atomic():
            customer.delete()
            assert stored_params()[job.pk] == {}  # erased inside the deleting transaction
            raise RuntimeError("the request failed")

    with pytest.raises(RuntimeError):
        failing_request()

    assert stored_params()[job.pk] == {"token": SECRET}
    assert Customer.objects.filter(pk=customer.pk).exists()
    assert erased_events() == set()


def test_stale_delete__that_matches_nothing_erases_nothing() -> None:
    customer = CustomerFactory()
    stale = Customer.objects.get(pk=customer.pk)
    customer.delete()
    revived = Customer.all_objects.recreate(reference=customer.reference, name="n", email="e@x.t")
    job = tombstones.enqueue(HANDLER, revived, params={"token": SECRET})

    assert stale.delete() == (0, {"customers.Customer": 0})  # generation 1 cannot delete 2

    assert stored_params()[job.pk] == {"token": SECRET}


def _age(customer: Customer, days: int) -> None:
    models.QuerySet(Customer).filter(pk=customer.pk).update(
        deleted_at=Now() - Value(timedelta(days=days))
    )


def test_purge__erases_the_params_the_tombstone_kept(propagate: str, settings: Any) -> None:
    settings.TOMBSTONES_RETENTION = timedelta(days=30)
    customer = CustomerFactory()
    job = tombstones.enqueue(PROPAGATE, customer, params={"token": SECRET})
    customer.delete()
    assert stored_params()[job.pk] == {"token": SECRET}
    # It ended without its params being erased (e.g. a row left by an older version).
    Job.objects.filter(pk=job.pk).update(status=Job.Status.CANCELLED)
    _age(customer, 31)

    call_command("purge_tombstones", "--noinput", stdout=StringIO())

    assert not Customer.all_objects.filter(pk=customer.pk).exists()
    assert stored_params()[job.pk] == {}
    assert erased_events() == {job.pk}


def test_queryset_purge__erases_params_of_every_job_of_the_purged_records(propagate: str) -> None:
    customer = CustomerFactory()
    job = tombstones.enqueue(PROPAGATE, customer, params={"token": SECRET})
    customer.delete()

    assert Customer.tombstones.filter(pk=customer.pk).purge() == 1

    assert stored_params()[job.pk] == {}
    assert erased_events() == {job.pk}


@pytest.mark.django_db(transaction=True)
def test_delete__skips_a_job_row_a_worker_holds_instead_of_waiting(postgres_only: None) -> None:
    """A worker that locked its job row before the record must not deadlock with a delete."""
    customer = CustomerFactory()
    held = tombstones.enqueue(HANDLER, customer, params={"token": SECRET})
    free = tombstones.enqueue(HANDLER, customer, params={"token": SECRET})
    locked, release = threading.Event(), threading.Event()

    def worker() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().filter(pk=held.pk).get()
                locked.set()
                release.wait(JOIN_TIMEOUT)
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert locked.wait(JOIN_TIMEOUT)
        started = time.monotonic()
        customer.delete()
        assert time.monotonic() - started < 5  # did not wait for the worker's transaction
    finally:
        release.set()
        thread.join(JOIN_TIMEOUT)
    params = stored_params()
    assert params[free.pk] == {}
    assert params[held.pk] == {"token": SECRET}  # its worker's outcome erases it
