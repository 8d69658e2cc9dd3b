"""bulk_create stores new records only; bulk_update is refused with a hint to the fenced writes."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, models
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from project.customers.models import Customer
from tests.factories import CustomerFactory
from tombstones.exceptions import ProtectedField, RecordDeleted, UnfencedWrite

pytestmark = pytest.mark.django_db

MANAGERS = ("objects", "all_objects", "tombstones")


def _new(reference: str, **fields: Any) -> Customer:
    return Customer(reference=reference, name="Ada", email="ada@example.test", **fields)


@pytest.mark.parametrize("manager", MANAGERS)
@pytest.mark.parametrize(
    "forged",
    [{"generation": 7}, {"version": 99}, {"deleted_at": timezone.now()}],
    ids=["generation", "version", "deleted_at"],
)
def test_bulk_create__refuses_a_foreign_generation_version_or_tombstone(
    manager: str, forged: dict[str, Any]
) -> None:
    objs = [_new("B-1"), _new("B-2", **forged)]
    with pytest.raises(ProtectedField, match="new records only"):
        getattr(Customer, manager).bulk_create(objs)
    assert not models.QuerySet(Customer).exists()  # not even the valid one


def test_bulk_create__stores_fresh_records_at_generation_1_version_1() -> None:
    made = Customer.objects.bulk_create([_new("B-1"), _new("B-2", generation=1, version=1)])
    assert len(made) == 2
    rows = models.QuerySet(Customer).order_by("reference")
    assert list(rows.values_list("reference", "generation", "version", "deleted_at")) == [
        ("B-1", 1, 1, None),
        ("B-2", 1, 1, None),
    ]


def test_bulk_create__refuses_a_business_key_held_by_a_tombstone_in_one_query() -> None:
    dead = CustomerFactory(reference="B-DEAD")
    dead.delete()
    objs = [_new(f"B-{n}") for n in range(50)] + [_new("B-DEAD")]
    with CaptureQueriesContext(connection) as queries, pytest.raises(RecordDeleted) as info:
        Customer.objects.bulk_create(objs)
    assert len(queries) == 1, [q["sql"] for q in queries]  # one SELECT for all keys, no INSERT
    assert info.value.pk == dead.pk
    assert "recreate()" in str(info.value)
    assert models.QuerySet(Customer).count() == 1  # the tombstone only


def test_bulk_create__with_update_conflicts_is_refused() -> None:
    dead = CustomerFactory(reference="B-UPSERT")
    dead.delete()
    with pytest.raises(UnfencedWrite, match="update_conflicts"):
        Customer.all_objects.bulk_create(
            [_new("B-UPSERT")],
            update_conflicts=True,
            unique_fields=["reference"],
            update_fields=["name", "email"],
        )
    row = Customer.all_objects.get(pk=dead.pk)
    assert (row.name, row.email, row.deleted_at is not None) == ("", "", True)


@pytest.mark.parametrize("manager", MANAGERS)
def test_bulk_update__is_refused_with_a_hint_and_writes_nothing(manager: str) -> None:
    customer = CustomerFactory(name="Old name")
    stale = Customer.all_objects.get(pk=customer.pk)
    Customer.objects.filter(pk=customer.pk).update(name="Newer name")  # version 2
    stale.name = "Stale overwrite"
    with pytest.raises(UnfencedWrite) as info:
        getattr(Customer, manager).bulk_update([stale], ["name"])
    assert "save()" in str(info.value)
    assert "update()" in str(info.value)
    row = Customer.all_objects.get(pk=customer.pk)
    assert (row.name, row.version) == ("Newer name", 2)


def test_bulk_update__of_a_tombstone_is_refused_too() -> None:
    customer = CustomerFactory()
    stale = Customer.objects.get(pk=customer.pk)
    customer.delete()
    stale.name = "Back from the dead"
    with pytest.raises(UnfencedWrite):
        Customer.all_objects.bulk_update([stale], ["name"])
    assert Customer.all_objects.get(pk=customer.pk).name == ""
