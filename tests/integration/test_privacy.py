"""Honest records: django-q2's task table, the doctor, and no personal data anywhere."""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.db.models import Value
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_q.models import OrmQ, Task
from django_q.signing import SignedPackage

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory, SheetRowFactory
from tests.jobkit import run, temp_handler
from tests.mail import file_mail
from tombstones.exceptions import InvalidParams, TombstoneError
from tombstones.models import Job, JobEvent

Status = Job.Status


def _doctor() -> str:
    out = StringIO()
    call_command("tombstones_doctor", stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_q_task__rejected_job_is_not_stored_as_a_success() -> None:
    ok_customer, gone_customer = CustomerFactory(), CustomerFactory()
    with transaction.atomic():
        good = tombstones.enqueue("customers.update_sheet_row", ok_customer)
    with transaction.atomic():
        bad = tombstones.enqueue("customers.update_sheet_row", gone_customer)
        gone_customer.delete()
    tasks = {t.args[0]: t for t in Task.objects.filter(func="tombstones.worker.run")}
    # The wake-up that ran the success is stored as one; the one that carried the rejection is
    # stored neither as a success nor as a worker failure: the ledger and the log line say it.
    assert tasks[good.pk].success is True
    assert tasks[good.pk].result["carried"] == [[good.pk, "succeeded", ""]]
    assert bad.pk not in tasks
    assert not Task.objects.filter(success=False).exists()
    bad.refresh_from_db()
    assert bad.status == Status.REJECTED
    assert "ok   django-q2 successes" in _doctor()


@pytest.mark.django_db(transaction=True)
def test_doctor__names_a_rejected_job_recorded_as_success() -> None:
    customer = CustomerFactory()
    with transaction.atomic():
        job = tombstones.enqueue("customers.update_sheet_row", customer)
        customer.delete()
    # What the doctor must catch: a stored success that carried the rejected job.
    Task.objects.create(
        id="f" * 32,
        name="forged",
        func="tombstones.worker.run",
        args=(job.pk,),
        started=timezone.now(),
        stopped=timezone.now(),
        success=True,
        result={"job": job.pk, "carried": [[job.pk, "rejected", "source_deleted"]]},
    )
    with pytest.raises(CommandError, match="1 problem"):
        _doctor()


@pytest.mark.django_db
def test_doctor__names_unfenced_jobs_and_expired_leases(settings: Any) -> None:
    customer = CustomerFactory()
    legacy = tombstones.enqueue("customers.update_sheet_row", customer)
    Job.objects.filter(pk=legacy.pk).update(version=None, status=Status.QUEUED)
    stuck = tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    Job.objects.filter(pk=stuck.pk).update(
        status=Status.RUNNING, lease_expires_at=Now() - Value(timedelta(minutes=1))
    )
    out = StringIO()
    with pytest.raises(CommandError, match="2 problem"):
        call_command("tombstones_doctor", stdout=out)
    assert f"job {legacy.pk} has no generation/version" in out.getvalue()
    assert f"job {stuck.pk} is running with an expired lease" in out.getvalue()


@pytest.mark.django_db
def test_doctor__fails_when_retention_is_not_longer_than_max_age(settings: Any) -> None:
    settings.TOMBSTONES_RETENTION = timedelta(days=1)
    settings.TOMBSTONES_JOB_MAX_AGE = timedelta(days=2)
    with pytest.raises(CommandError):
        _doctor()


# --- no personal data ------------------------------------------------------------------------

NAME = "Qwertzuiop Plantedname"
EMAIL = "planted-4417@pii.test"
PHONE = "+4915550199887"
PLANTED = (NAME, EMAIL, PHONE, "Qwertzuiop")


def _leaky(ctx: Any) -> None:
    # A careless handler: its exception message carries personal data.
    raise ValueError(f"could not sync {ctx.record.name} <{ctx.record.email}>")


def _leaky_external(ctx: Any) -> None:
    raise TimeoutError(f"timeout sending to {ctx.record.email}")


@pytest.mark.django_db(transaction=True)
def test_no_personal_data__in_logs_jobs_events_q2_rows_or_errors(
    caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    made: list[Customer] = []

    def planted(n: int) -> Customer:
        customer = CustomerFactory(reference=f"PII-{n}", name=NAME, email=EMAIL, phone=PHONE)
        SheetRowFactory(customer=customer)
        made.append(customer)
        return customer

    errors: list[str] = []
    with (
        temp_handler("t.leaky", _leaky),
        temp_handler("t.leaky_ext", _leaky_external, external=True),
    ):
        # succeeded, rejected (source_deleted), rejected (generation_changed), failed, uncertain
        with transaction.atomic():
            tombstones.enqueue("customers.update_sheet_row", planted(1))
        c2 = planted(2)
        with transaction.atomic():
            tombstones.enqueue("customers.update_sheet_row", c2)
            c2.delete()
        c3 = planted(3)
        with transaction.atomic():
            tombstones.enqueue("customers.update_sheet_row", c3)
            c3.delete()
            Customer.all_objects.recreate(reference="PII-3", name=NAME, email=EMAIL, phone=PHONE)
        with transaction.atomic():
            tombstones.enqueue("t.leaky", planted(4))
        with transaction.atomic():
            tombstones.enqueue("t.leaky_ext", planted(5))
        # escalated: a legacy row without a fence
        c6 = planted(6)
        settings.TOMBSTONES_Q_OPTIONS = {}  # leave a real message in the ORM broker's table
        with transaction.atomic():
            legacy = tombstones.enqueue("customers.update_sheet_row", c6)
        Job.objects.filter(pk=legacy.pk).update(generation=None)
        run(legacy)
        # exceptions raised to callers
        stale = Customer.objects.get(reference="PII-1")
        Customer.objects.filter(pk=stale.pk).update()
        for action in (
            stale.save,
            lambda: c2.save(),
            lambda: tombstones.enqueue("customers.update_sheet_row", c2),
            lambda: tombstones.enqueue(
                "customers.update_sheet_row", Customer(name=NAME, email=EMAIL)
            ),
        ):
            with pytest.raises(TombstoneError) as info:
                action()
            errors += [str(info.value), repr(info.value)]
    statuses = set(Job.objects.values_list("status", flat=True))
    assert statuses >= {"succeeded", "rejected", "failed", "uncertain", "escalated"}
    assert len(errors) == 8

    haystacks = {
        "logs": caplog.text + "\n".join(str(r.__dict__) for r in caplog.records),
        "jobs": "\n".join(str(row) for row in Job.objects.values()),
        "events": "\n".join(str(row) for row in JobEvent.objects.values()),
        "q2 tasks": "\n".join(str(row) for row in Task.objects.values()),
        "q2 queue": "\n".join(str(SignedPackage.loads(row.payload)) for row in OrmQ.objects.all()),
        "errors": "\n".join(errors),
    }
    assert OrmQ.objects.exists(), "the ORM broker's table must have been searched, not skipped"
    for place, text in haystacks.items():
        for value in PLANTED:
            assert value not in text, f"{value!r} leaked into {place}"


# --- every table after a delete ------------------------------------------------------------------

# Not personal, so enqueue accepts it; the job's params must still go with the record.
SECRET = "opaque-token-6604"
DIGEST = hashlib.sha256(NAME.encode()).hexdigest()[:16]  # what the demo derives from the name


def _decoded(value: Any) -> Any:
    return (
        bytes(value).decode("utf-8", "replace") if isinstance(value, bytes | memoryview) else value
    )


def _dump_database() -> dict[str, str]:
    """Every row of every table as text, plus the columns django-q2 and sessions encode."""
    dump: dict[str, str] = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            dump[table] = "\n".join(repr([_decoded(v) for v in row]) for row in cursor.fetchall())
    # Signed (the ORM broker's messages), pickled (django-q2's task rows), signed (sessions).
    dump["django_q_ormq decoded"] = "\n".join(
        repr(SignedPackage.loads(row.payload)) for row in OrmQ.objects.all()
    )
    dump["django_q_task decoded"] = "\n".join(repr(row) for row in Task.objects.values())
    dump["django_session decoded"] = "\n".join(
        repr(session.get_decoded()) for session in Session.objects.all()
    )
    return {table: text.casefold() for table, text in dump.items()}


def _found(dump: dict[str, str], values: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(v, table) for v in values for table, text in dump.items() if v.casefold() in text]


@pytest.mark.django_db(transaction=True)
def test_no_personal_data__in_any_table_after_a_delete(settings: Any, tmp_path: Any) -> None:
    file_mail(settings, tmp_path)
    customer = CustomerFactory(reference="PII-DUMP", name=NAME, email=EMAIL, phone=PHONE)
    row = SheetRowFactory(customer=customer)
    # Personal values never reach params, whatever their shape.
    for params in ({"to": EMAIL}, {"note": f"call {PHONE.lower()}"}, {"who": [NAME.upper()]}):
        with pytest.raises(InvalidParams):
            tombstones.enqueue("customers.update_sheet_row", customer, params=params)
    # A finished job, a welcome email, and a job still queued in the ORM broker.
    with transaction.atomic():
        tombstones.enqueue("customers.update_sheet_row", customer, params={"token": SECRET})
    customer = Customer.objects.get(pk=customer.pk)
    with transaction.atomic():
        tombstones.enqueue("customers.send_welcome", customer, params={"token": SECRET})
    settings.TOMBSTONES_Q_OPTIONS = {}
    with transaction.atomic():
        queued = tombstones.enqueue(
            "customers.update_sheet_row", Customer.objects.get(pk=customer.pk), params={"t": SECRET}
        )
    settings.TOMBSTONES_Q_OPTIONS = {"sync": True}
    row.refresh_from_db()
    assert row.name_hash == DIGEST
    planted = (NAME, EMAIL, PHONE, "Qwertzuiop", DIGEST, SECRET)
    # The search sees each planted value before the delete: it can fail.
    assert {value for value, _ in _found(_dump_database(), planted)} == set(planted)
    assert OrmQ.objects.exists()

    # The delete, as staff do it: the demo's admin also queues the erasure of derived data.
    staff = Client()
    staff.force_login(User.objects.create_superuser("root", password="pw-root"))
    url = reverse("admin:customers_customer_delete", args=(customer.pk,))
    assert staff.post(url, {"post": "yes"}).status_code == 302
    run(queued)  # the lane head: rejected, then the erasure behind it runs
    erase = Job.objects.get(handler="customers.erase_customer")
    assert run(erase).status == Status.SUCCEEDED
    assert run(queued).status == Status.REJECTED

    leaks = _found(_dump_database(), planted)
    assert leaks == [], f"planted values left behind: {leaks}"
    assert EMAIL not in "".join(p.read_text() for p in tmp_path.glob("*"))
