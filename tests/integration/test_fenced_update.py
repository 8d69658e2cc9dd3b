"""The handler's fenced write of plain values is one prepared statement (no ORM building per job),
and it writes exactly what the ORM's ``filter(fence).update(...)`` writes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection, models
from django.db.models import F, Value
from django.db.models.functions import Concat
from django.test.utils import CaptureQueriesContext

import tombstones
from project.customers.models import Customer, SheetRow
from project.stress.models import Account, BusinessAccount
from tests.factories import CustomerFactory, SheetRowFactory
from tests.jobkit import run, temp_handler
from tombstones.exceptions import ProtectedField
from tombstones.models import Job
from tombstones.records import fencing

pytestmark = pytest.mark.django_db

AT = datetime(2026, 12, 3, 10, 30, 15, 123456, tzinfo=UTC)


def _row(pk: Any) -> dict[str, Any]:
    return Customer.all_objects.filter(pk=pk).values().get()


def _write(record: Any, fields: dict[str, Any], *, version: int | None = None) -> int:
    version = record.version if version is None else version
    fence = fencing.Fence(type(record), record.pk, record.generation, version)
    return fencing.update_record(fence, fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"synced_at": AT},
        {"name": "Ada", "phone": "", "synced_at": AT},
        {"synced_at": None},
        {"phone": "123", "synced_at": None, "name": "Grace"},
    ],
)
def test_fenced_update__plain_values_are_one_statement_and_land_as_the_orm_writes_them(
    fields: dict[str, Any],
) -> None:
    fast, orm = CustomerFactory(synced_at=datetime(2020, 1, 1, tzinfo=UTC)), CustomerFactory()
    with CaptureQueriesContext(connection) as captured:
        assert _write(fast, fields) == 1
    assert len(captured) == 1
    assert captured[0]["sql"].startswith('UPDATE "customers_customer"')
    # The ORM's road, for comparison (a plain QuerySet: the record querysets refuse ``version``).
    models.QuerySet(Customer).filter(pk=orm.pk).update(version=F("version") + 1, **fields)
    got, want = _row(fast.pk), _row(orm.pk)
    for name in fields:
        assert got[name] == want[name] == fields[name], name
    assert got["version"] == fast.version + 1
    assert got["generation"] == fast.generation


def test_fenced_update__a_stale_version_or_a_tombstone_matches_nothing() -> None:
    record = CustomerFactory()
    assert _write(record, {"name": "Stale"}, version=record.version + 1) == 0
    assert _row(record.pk)["name"] == record.name
    Customer.objects.get(pk=record.pk).delete()
    dead = Customer.all_objects.get(pk=record.pk)
    assert _write(dead, {"name": "Dead"}) == 0
    assert _row(record.pk)["name"] == dead.name != "Dead"


def test_fenced_update__expressions_and_relations_take_the_orms_road() -> None:
    record = CustomerFactory(name="Ada")
    assert _write(record, {"name": Concat(F("name"), Value("!"))}) == 1
    assert _row(record.pk)["name"] == "Ada!"
    row = SheetRowFactory()
    other = CustomerFactory()
    assert _write(row, {"customer": other}) == 1
    assert SheetRow.all_objects.get(pk=row.pk).customer_id == other.pk


def _customer() -> Customer:
    return CustomerFactory()


def _account() -> Account:
    return Account.objects.create(key="A-1")


def _business_account() -> BusinessAccount:
    return BusinessAccount.objects.create(key="B-1")


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (_customer, "id"),
        (_customer, "pk"),
        (_account, "number"),  # a primary key named otherwise
        (_business_account, "account_ptr"),  # a multi-table child's: its parent link
        (_business_account, "account_ptr_id"),
        (_business_account, "number"),  # its parent's primary key
        (_business_account, "pk"),
    ],
)
def test_fenced_update__the_primary_key_is_refused_like_the_fence_fields(
    make: Callable[[], Any], key: str
) -> None:
    record = make()
    model, pk = type(record), record.pk
    with CaptureQueriesContext(connection) as captured, pytest.raises(ProtectedField) as refused:
        _write(record, {key: pk + 100})
    assert captured.captured_queries == []  # refused before any statement
    assert refused.value.model == model._meta.label
    assert refused.value.pk == pk
    assert f"{model._meta.label}.{key} names the record's primary key" in str(refused.value)
    assert list(model.all_objects.values_list("pk", "version")) == [(pk, 1)]


def test_fenced_update__the_handlers_write_refuses_a_record_tables_primary_key() -> None:
    record = CustomerFactory()
    target = Customer.all_objects.filter(pk=record.pk)
    with pytest.raises(ProtectedField, match=r"customers\.Customer\.id names"):
        fencing.write_related(
            target, fencing.Fence(Customer, record.pk, 1, 1), {"id": record.pk + 100}
        )
    assert list(Customer.all_objects.values_list("pk", "version")) == [(record.pk, 1)]


def test_fenced_update__ctx_update_of_the_primary_key_fails_the_job_and_renumbers_nothing() -> None:
    def renumber(ctx: Any) -> None:
        ctx.update(id=ctx.record.pk + 100)

    record = CustomerFactory()
    with temp_handler("t.renumber", renumber):
        job = run(tombstones.enqueue("t.renumber", record))
    assert (job.status, job.reason, job.error_class) == (
        Job.Status.FAILED,
        Job.Reason.HANDLER_ERROR,
        "tombstones.exceptions.ProtectedField",
    )
    assert list(Customer.all_objects.values_list("pk", "version")) == [(record.pk, 1)]
