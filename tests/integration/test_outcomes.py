"""Every outcome of the worker, through the production phases against the real database."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.db.models import F, Value
from django.db.models.functions import Now
from django.utils import timezone

import tombstones
from project.customers.models import Customer, SheetRow
from tests.factories import CustomerFactory, SheetRowFactory
from tests.jobkit import events, make_due, run, temp_handler
from tombstones import worker
from tombstones.jobs.engine.sweep import sweep
from tombstones.models import Job
from tombstones.signals import job_escalated
from tombstones.testing import Case, RaceFixture

pytestmark = pytest.mark.django_db

Status, Reason = Job.Status, Job.Reason


@pytest.fixture
def customer() -> Customer:
    row = SheetRowFactory()
    return row.customer  # type: ignore[no-any-return]


# --- success and rejection --------------------------------------------------------------------


def test_internal_job__succeeds_with_fenced_writes(customer: Customer) -> None:
    job = run(tombstones.enqueue("customers.update_sheet_row", customer))
    assert (job.status, job.reason) == (Status.SUCCEEDED, Reason.NONE)
    customer.refresh_from_db()
    assert customer.version == 2
    assert customer.synced_at is not None
    assert SheetRow.objects.get(customer=customer).synced_version == 1
    assert events(job) == ["enqueued", "claimed", "checked", "succeeded"]


def test_rejected_job__is_never_retried(customer: Customer) -> None:
    job = tombstones.enqueue("customers.update_sheet_row", customer)
    customer.delete()
    job = run(job)
    assert (job.status, job.reason) == (Status.REJECTED, Reason.SOURCE_DELETED)
    make_due(job)
    sweep()
    job = run(job)
    assert job.status == Status.REJECTED
    assert job.attempts == 1
    assert events(job).count("claimed") == 1


# --- stale version: re-read, bounded ---------------------------------------------------------


def test_stale_version__rereads_then_backs_off_after_the_limit(
    customer: Customer, settings: Any
) -> None:
    settings.TOMBSTONES_STALE_REREADS = 2
    passes: list[int] = []

    def always_stale(ctx: Any) -> None:
        passes.append(ctx.rereads)
        # Someone else's write lands between this pass's read and its fenced write.
        Customer.all_objects.filter(pk=ctx.record.pk).update()
        ctx.update(phone="+1")

    with temp_handler("t.always_stale", always_stale):
        job = run(tombstones.enqueue("t.always_stale", customer))
    assert passes == [0, 1, 2]
    assert (job.status, job.reason) == (Status.RETRY_WAIT, Reason.STALE_VERSION)
    assert job.rereads == 2
    assert events(job).count("reread") == 2


def test_stale_version__reread_decides_again_on_the_fresh_record(customer: Customer) -> None:
    fixture = RaceFixture(Customer, "customers.update_sheet_row", make_record=lambda: customer)
    result = fixture.run_case(
        Case("4", ("enqueue J", "start J", "update R", "write J"), {"J": "reread"})
    )
    assert result.ok, result
    assert result.writes == 2  # the sheet row and the customer, once each, on the second pass


# --- temporary failures ----------------------------------------------------------------------


def test_transient_error__retries_with_backoff_then_fails(
    customer: Customer, settings: Any
) -> None:
    settings.TOMBSTONES_MAX_ATTEMPTS = 3
    settings.TOMBSTONES_RETRY_BACKOFF = timedelta(seconds=30)
    calls: list[int] = []

    def flaky(ctx: Any) -> None:
        calls.append(ctx.job.attempts)
        ctx.update(phone="+2")  # rolled back with the failure below
        raise tombstones.TransientError("upstream busy")

    with temp_handler("t.flaky", flaky):
        job = run(tombstones.enqueue("t.flaky", customer))
        assert (job.status, job.reason) == (Status.RETRY_WAIT, Reason.TRANSIENT)
        assert Job.objects.filter(
            pk=job.pk, run_after__gt=Now() + Value(timedelta(seconds=20))
        ).exists()
        assert run(job).attempts == 1  # not due yet: not claimed
        for _ in range(2):
            make_due(job)
            job = run(job)
    assert calls == [1, 2, 3]
    assert (job.status, job.reason) == (Status.FAILED, Reason.RETRIES_EXHAUSTED)
    assert events(job).count("checked") == 3  # the check is repeated every time
    customer.refresh_from_db()
    assert customer.version == 1
    assert customer.phone != "+2"


def test_transient_error__a_deletion_during_backoff_rejects_the_retry(customer: Customer) -> None:
    def flaky(ctx: Any) -> None:
        raise TimeoutError

    with temp_handler("t.timeout", flaky):
        job = run(tombstones.enqueue("t.timeout", customer))
        assert job.status == Status.RETRY_WAIT
        customer.delete()
        make_due(job)
        job = run(job)
    assert (job.status, job.reason) == (Status.REJECTED, Reason.SOURCE_DELETED)


def test_handler_error__fails_and_rolls_back_its_writes(customer: Customer) -> None:
    phone_before = customer.phone
    assert phone_before != "+3"
    written: list[tuple[int, str]] = []

    def broken(ctx: Any) -> None:
        ctx.update(phone="+3")
        # The write is in the database inside the job's transaction: only a rollback undoes it.
        stored = Customer.objects.get(pk=ctx.record.pk)
        written.append((stored.version, stored.phone))
        raise ValueError("boom")

    with temp_handler("t.broken", broken):
        job = run(tombstones.enqueue("t.broken", customer))
    assert (job.status, job.reason) == (Status.FAILED, Reason.HANDLER_ERROR)
    assert job.error_class == "builtins.ValueError"
    assert written == [(2, "+3")]
    customer.refresh_from_db()
    assert (customer.version, customer.phone) == (1, phone_before)


# --- unreadable tombstone: paused, never assumed live ----------------------------------------


@pytest.fixture
def unreadable_customers() -> Iterator[list[bool]]:
    """Make reads of the customer table fail at the database connection, as a lost table would."""
    switch = [True]

    def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if switch[0] and sql.lstrip().upper().startswith("SELECT") and "customers_customer" in sql:
            raise OperationalError("could not read customers_customer")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse):
        yield switch


def test_unreadable_record__pauses_then_resumes_with_the_check_repeated(
    customer: Customer, unreadable_customers: list[bool]
) -> None:
    job = run(tombstones.enqueue("customers.update_sheet_row", customer))
    assert (job.status, job.reason) == (Status.PAUSED, Reason.TOMBSTONE_UNREADABLE)
    unreadable_customers[0] = False
    counts = sweep(dispatch=False)
    assert counts["resumed"] == 1
    job = run(job)
    assert job.status == Status.SUCCEEDED
    assert events(job).count("checked") == 1
    assert "resumed" in events(job)


# --- external calls --------------------------------------------------------------------------


def test_external__sending_then_sent_then_succeeded(
    customer: Customer, mailoutbox: list[Any]
) -> None:
    job = run(tombstones.enqueue("customers.send_welcome", customer))
    assert job.status == Status.SUCCEEDED
    assert job.sending_at is not None
    assert job.sent_at is not None
    assert len(mailoutbox) == 1
    assert events(job) == ["enqueued", "claimed", "checked", "sending", "sent", "succeeded"]


def test_external__timeout_after_sending_is_uncertain_and_never_repeated(
    customer: Customer,
) -> None:
    calls: list[str] = []

    def slow(ctx: Any) -> None:
        calls.append(ctx.idempotency_key)
        raise TimeoutError("read timed out")

    with temp_handler("t.slow_send", slow, external=True):
        job = run(tombstones.enqueue("t.slow_send", customer))
        assert (job.status, job.reason) == (Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN)
        make_due(job)
        sweep()
        job = run(job)
    assert job.status == Status.UNCERTAIN
    assert len(calls) == 1


def test_external__record_deleted_during_the_send_is_uncertain(customer: Customer) -> None:
    def send_while_deleted(ctx: Any) -> None:
        # The deletion commits while the call is in flight.
        Customer.objects.get(pk=ctx.record.pk).delete()

    with temp_handler("t.send_deleted", send_while_deleted, external=True):
        job = run(tombstones.enqueue("t.send_deleted", customer))
    assert (job.status, job.reason) == (Status.UNCERTAIN, Reason.DELETED_DURING_SEND)


@pytest.mark.parametrize("then_sent", [True, False], ids=["newer-state-queued", "alone"])
def test_external__overtaken_by_a_recreate_is_superseded_only_if_a_later_job_sends_it(
    customer: Customer, then_sent: bool
) -> None:
    later: list[Job] = []
    calls: list[int] = []

    def send_while_recreated(ctx: Any) -> None:
        calls.append(ctx.job.pk)
        if len(calls) > 1:
            return  # the later job: it sends the new generation
        # A delete and a re-create commit while the call is in flight; the app queues the
        # propagation of the new generation in the record's lane, as a sync would.
        Customer.objects.get(pk=ctx.record.pk).delete()
        revived = Customer.all_objects.recreate(reference=ctx.record.reference, name="Again")
        if then_sent:
            later.append(tombstones.enqueue("t.send_recreated", revived))

    with temp_handler("t.send_recreated", send_while_recreated, external=True):
        job = tombstones.enqueue("t.send_recreated", customer)
        worker.run(job.pk)  # the first job, then the later one (if any) in the lane
    job.refresh_from_db()
    expected = Status.SUPERSEDED if then_sent else Status.UNCERTAIN
    assert (job.status, job.reason) == (expected, Reason.DELETED_DURING_SEND)
    assert events(job)[-1] == expected
    for sent in later:
        sent.refresh_from_db()
        assert sent.status == Status.SUCCEEDED


def test_external__refused_connection_is_retried_with_the_same_idempotency_key(
    customer: Customer,
) -> None:
    keys: list[str] = []

    def refused(ctx: Any) -> None:
        keys.append(ctx.idempotency_key)
        if len(keys) == 1:
            raise tombstones.TransientError("connection refused")

    with temp_handler("t.refused", refused, external=True):
        job = run(tombstones.enqueue("t.refused", customer))
        assert job.status == Status.RETRY_WAIT
        assert job.sending_at is None
        make_due(job)
        job = run(job)
    assert job.status == Status.SUCCEEDED
    assert keys[0] == keys[1] == job.idempotency_key


def test_external__crash_after_sending_is_marked_uncertain_by_the_sweep(customer: Customer) -> None:
    job = tombstones.enqueue("customers.send_welcome", customer)
    # A worker claimed it, committed "sending", then vanished: its lease ran out.
    Job.objects.filter(pk=job.pk).update(
        status=Status.RUNNING,
        sending_at=Now(),
        claim_token="gone",
        lease_expires_at=Now() - Value(timedelta(seconds=5)),
        attempts=F("attempts") + 1,
    )
    assert sweep(dispatch=False)["uncertain"] == 1
    job.refresh_from_db()
    assert (job.status, job.reason) == (Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN)


# --- stop conditions -------------------------------------------------------------------------


@pytest.fixture
def escalations() -> Iterator[list[tuple[int, str]]]:
    seen: list[tuple[int, str]] = []

    def receiver(sender: Any, job: Job, reason: str, **kwargs: Any) -> None:
        seen.append((job.pk, reason))

    job_escalated.connect(receiver)
    yield seen
    job_escalated.disconnect(receiver)


def test_legacy_job_without_fence__escalated_and_never_run(
    customer: Customer,
    escalations: list[tuple[int, str]],
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
) -> None:
    job = tombstones.enqueue("customers.update_sheet_row", customer)
    Job.objects.filter(pk=job.pk).update(generation=None)
    with django_capture_on_commit_callbacks(execute=True):
        job = run(job)
    assert (job.status, job.reason) == (Status.ESCALATED, Reason.MISSING_FENCE)
    assert escalations == [(job.pk, Reason.MISSING_FENCE)]
    assert any(r.levelno == logging.ERROR and "escalated" in r.getMessage() for r in caplog.records)
    customer.refresh_from_db()
    assert customer.version == 1


def test_purged_record__escalated_record_missing(customer: Customer) -> None:
    job = tombstones.enqueue("customers.update_sheet_row", customer)
    SheetRow.objects.all().delete()
    SheetRow.all_objects.all().purge()
    customer.delete()
    Customer.all_objects.filter(pk=customer.pk).purge()
    job = run(job)
    assert (job.status, job.reason) == (Status.ESCALATED, Reason.RECORD_MISSING)


@pytest.mark.parametrize(
    "object_id",
    ["abc", "", "1.5", "99999999999999999999"],  # not an integer, or past a bigint
    ids=["letters", "empty", "decimal", "past-bigint"],
)
def test_object_id_no_pk_holds__fails_alone_and_the_rest_of_its_claim_runs(
    object_id: str, escalations: list[tuple[int, str]], django_capture_on_commit_callbacks: Any
) -> None:
    """A job row written by hand with an object_id its model's pk cannot hold: the claim's one
    read of the model's records raised (ValueError; OverflowError on SQLite), and the jobs in
    hand were charged a crash. It fails alone, escalated with its reason; its neighbour in the
    same claim runs."""
    ran: list[int] = []

    def handler(ctx: Any) -> None:
        ran.append(ctx.record.pk)
        ctx.update(phone="")

    good, bad = CustomerFactory(), CustomerFactory()
    with temp_handler("t.touch", handler):
        broken = tombstones.enqueue("t.touch", bad, params={"n": 1})
        fine = tombstones.enqueue("t.touch", good)
        Job.objects.filter(pk=broken.pk).update(object_id=object_id)
        with django_capture_on_commit_callbacks(execute=True):
            carried = worker.run()["carried"]
    assert sorted((row[0], row[1], row[2]) for row in carried) == [
        (broken.pk, Status.ESCALATED, Reason.OBJECT_ID_INVALID),
        (fine.pk, Status.SUCCEEDED, Reason.NONE),
    ]  # one claim, one run: nothing given back, nothing crashed
    broken.refresh_from_db()
    assert (broken.attempts, broken.params) == (1, {})
    assert events(broken) == ["enqueued", "claimed", "escalated"]
    assert escalations == [(broken.pk, Reason.OBJECT_ID_INVALID)]
    assert ran == [good.pk]


def test_unknown_handler__waits_uncharged_for_a_worker_that_knows_it(customer: Customer) -> None:
    """A deploy, not a verdict: the job keeps its place (and its lane), uncharged."""
    job = tombstones.enqueue("customers.update_sheet_row", customer)
    Job.objects.filter(pk=job.pk).update(handler="customers.renamed_handler")
    job = run(job)
    assert (job.status, job.reason, job.attempts) == (Status.RETRY_WAIT, Reason.HANDLER_UNKNOWN, 0)
    assert job.run_after > timezone.now()
    assert job.finished_at is None


def test_unknown_handler__escalated_once_no_worker_knew_it_for_the_max_age(
    customer: Customer, settings: Any
) -> None:
    settings.TOMBSTONES_JOB_MAX_AGE = timedelta(hours=1)
    job = tombstones.enqueue("customers.update_sheet_row", customer)
    Job.objects.filter(pk=job.pk).update(
        handler="customers.renamed_handler", created_at=Now() - Value(timedelta(hours=2))
    )
    job = run(job)
    assert (job.status, job.reason) == (Status.ESCALATED, Reason.HANDLER_UNKNOWN)


def test_old_job__expires_without_running(customer: Customer, settings: Any) -> None:
    settings.TOMBSTONES_JOB_MAX_AGE = timedelta(hours=1)
    job = tombstones.enqueue("customers.update_sheet_row", customer)
    Job.objects.filter(pk=job.pk).update(created_at=Now() - Value(timedelta(hours=2)))
    job = run(job)
    assert (job.status, job.reason) == (Status.EXPIRED, Reason.QUEUE_EXPIRED)
    customer.refresh_from_db()
    assert customer.version == 1


def test_sweep__expires_old_jobs_too(customer: Customer, settings: Any) -> None:
    settings.TOMBSTONES_JOB_MAX_AGE = timedelta(hours=1)
    job = tombstones.enqueue("customers.update_sheet_row", customer)
    Job.objects.filter(pk=job.pk).update(created_at=Now() - Value(timedelta(hours=2)))
    assert sweep(dispatch=False)["expired"] == 1


# --- honest logging --------------------------------------------------------------------------


def test_logging__one_line_per_outcome_and_rejection_is_a_warning(
    customer: Customer, caplog: pytest.LogCaptureFixture, django_capture_on_commit_callbacks: Any
) -> None:
    caplog.set_level(logging.INFO, logger="tombstones")
    with django_capture_on_commit_callbacks(execute=True):
        ok = run(tombstones.enqueue("customers.update_sheet_row", customer))
        customer.refresh_from_db()
        bad = tombstones.enqueue("customers.update_sheet_row", customer)
        customer.delete()
        run(bad)
    lines = {r.tombstones["job_id"]: r for r in caplog.records if hasattr(r, "tombstones")}
    assert lines[ok.pk].levelno == logging.INFO
    assert "succeeded" in lines[ok.pk].getMessage()
    rejected = lines[bad.pk]
    assert rejected.levelno == logging.WARNING
    assert "rejected" in rejected.getMessage()
    assert "succe" not in rejected.getMessage()
    assert rejected.tombstones["reason"] == "source_deleted"
    assert rejected.tombstones["record"] == f"customers.customer:{customer.pk}"
