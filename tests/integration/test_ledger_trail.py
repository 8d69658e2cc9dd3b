"""A lean happy path: a plain success keeps its trail in its job row (no event rows); every other
end keeps its full stored trail. What an auditor asks of a success is answered the same."""

from __future__ import annotations

from typing import Any

import pytest

import tombstones
from project.customers.models import Customer
from tests.factories import SheetRowFactory
from tests.jobkit import events, make_due, run, temp_handler
from tombstones.exceptions import TransientError
from tombstones.models import Job, JobEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def customer() -> Customer:
    return SheetRowFactory().customer  # type: ignore[no-any-return]


def stored(job: Job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("event", flat=True))


def test_lean__a_plain_success_stores_no_event_and_its_row_tells_the_same(
    customer: Customer,
) -> None:
    job = run(tombstones.enqueue("customers.update_sheet_row", customer))
    assert job.status == "succeeded"
    assert stored(job) == []
    trail = job.history()
    assert [e.event for e in trail] == ["enqueued", "claimed", "checked", "succeeded"]
    _, claimed, checked, succeeded = trail
    assert claimed.worker == job.owner != ""
    assert claimed.created_at == job.started_at
    assert (checked.found_generation, checked.found_version) == (1, 1)
    assert (succeeded.found_generation, succeeded.found_version) == (1, 2)  # after its write
    assert succeeded.created_at == job.finished_at
    assert {e.expected_version for e in trail} == {1}


def test_lean__a_rejection_keeps_its_stored_trail(customer: Customer) -> None:
    job = tombstones.enqueue("customers.update_sheet_row", customer)
    customer.delete()
    job = run(job)
    assert stored(job) == ["claimed", "rejected"]


def test_lean__a_reread_success_keeps_its_stored_trail(customer: Customer) -> None:
    calls: list[int] = []

    def bumped_once(ctx: Any) -> None:
        calls.append(ctx.record.version)
        if len(calls) == 1:  # another writer moves the record between check and write
            Customer.objects.filter(pk=ctx.record.pk).update()
        ctx.update(phone="+1")

    with temp_handler("t.bumped", bumped_once):
        job = run(tombstones.enqueue("t.bumped", customer))
    assert job.status == "succeeded"
    assert stored(job) == ["claimed", "checked", "reread", "succeeded"]
    assert events(job) == ["enqueued", "claimed", "checked", "reread", "succeeded"]


def test_lean__a_success_after_a_retry_keeps_its_stored_trail(customer: Customer) -> None:
    def flaky(ctx: Any) -> None:
        if ctx.job.attempts == 1:
            raise TransientError("try again")
        ctx.update(phone="+2")

    with temp_handler("t.flaky", flaky):
        job = run(tombstones.enqueue("t.flaky", customer))
        assert job.status == "retry_wait"
        make_due(job)
        job = run(job)
    assert job.status == "succeeded"
    assert stored(job) == ["claimed", "checked", "retry", "claimed", "checked", "succeeded"]


def test_lean__an_external_success_keeps_its_stored_trail(customer: Customer) -> None:
    with temp_handler("t.sent", lambda ctx: None, external=True):
        job = run(tombstones.enqueue("t.sent", customer))
    assert job.status == "succeeded"
    assert "sending" in stored(job)
    assert stored(job)[-1] == "succeeded"


def test_lean__a_job_that_found_a_newer_version_tells_it_from_its_row(
    customer: Customer,
) -> None:
    job = tombstones.enqueue("customers.update_sheet_row", customer)
    Customer.objects.filter(pk=customer.pk).update()  # version 2 before the check
    job = run(job)
    assert (job.status, stored(job)) == ("succeeded", [])
    checked = job.history()[2]
    assert (checked.event, checked.expected_version, checked.found_version) == ("checked", 1, 2)
    assert (job.found_generation, job.found_version) == (1, 3)  # after its own write


def test_lean__rows_per_plain_success(customer: Customer) -> None:
    jobs = [tombstones.enqueue("customers.update_sheet_row", customer) for _ in range(10)]
    for job in jobs:
        run(job)
    assert set(Job.objects.values_list("status", flat=True)) == {"succeeded"}
    # One job row each, no event rows (three each before the lean path).
    assert JobEvent.objects.filter(job__in=jobs).count() == 0
