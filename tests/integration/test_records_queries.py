"""Record querysets: update(), get_or_create/update_or_create, recreate() and purge()."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from project.customers.models import Customer
from tests.factories import CustomerFactory, SheetRowFactory
from tombstones.exceptions import AlreadyLive, ProtectedField, RecordDeleted, UnfencedWrite

pytestmark = pytest.mark.django_db


def statements(ctx: CaptureQueriesContext, verb: str) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith(verb)]


def row(pk: Any) -> Customer:
    return Customer.all_objects.get(pk=pk)


def tombstoned(reference: str = "C-1", **kwargs: Any) -> Customer:
    customer = CustomerFactory(reference=reference, **kwargs)
    customer.delete()
    return row(customer.pk)


# --- queryset update() -----------------------------------------------------------------------


def test_update__bumps_version_of_matched_live_rows() -> None:
    first, second = CustomerFactory.create_batch(2)
    untouched = CustomerFactory()

    with CaptureQueriesContext(connection) as ctx:
        count = Customer.objects.filter(pk__in=[first.pk, second.pk]).update(phone="+1000")

    assert count == 2
    assert len(statements(ctx, "UPDATE")) == 1
    assert list(
        Customer.objects.filter(pk__in=[first.pk, second.pk]).values_list("phone", "version")
    ) == [("+1000", 2), ("+1000", 2)]
    assert (row(untouched.pk).phone, row(untouched.pk).version) == (untouched.phone, 1)


def test_update__never_touches_tombstones() -> None:
    dead = tombstoned("C-1")
    live = CustomerFactory(reference="C-2")

    count = Customer.all_objects.all().update(name="Everyone")
    tombstone_count = Customer.tombstones.all().update(name="Ghost")

    assert (count, tombstone_count) == (1, 0)
    stored = row(dead.pk)
    assert (stored.name, stored.version) == ("", 2)
    assert (row(live.pk).name, row(live.pk).version) == ("Everyone", 2)


def test_update__accepts_expressions() -> None:
    customer = CustomerFactory(reference="C-1", name="Ann")

    Customer.objects.filter(pk=customer.pk).update(name=F("reference"))

    assert (row(customer.pk).name, row(customer.pk).version) == ("C-1", 2)


@pytest.mark.parametrize(
    "values",
    [{"generation": 5}, {"version": 1}, {"deleted_at": None}, {"name": "x", "version": 9}],
)
def test_update__mixin_fields_raise_protected_field(values: dict[str, Any]) -> None:
    dead = tombstoned("C-1")
    live = CustomerFactory(reference="C-2")

    with pytest.raises(ProtectedField) as info:
        Customer.all_objects.all().update(**values)

    assert info.value.model == "customers.Customer"
    assert row(dead.pk).is_tombstone
    assert (row(dead.pk).generation, row(dead.pk).version) == (1, 2)
    assert (row(live.pk).version, row(live.pk).name) == (1, live.name)


def test_update__bulk_update_is_refused_it_has_no_version_check() -> None:
    customers = CustomerFactory.create_batch(2)
    for customer in customers:
        customer.phone = "+2000"

    with pytest.raises(UnfencedWrite, match=r"save\(\)"):
        Customer.objects.bulk_update(customers, ["phone"])

    assert not Customer.objects.filter(phone="+2000").exists()
    assert set(Customer.objects.values_list("version", flat=True)) == {1}


# --- get_or_create / update_or_create --------------------------------------------------------


def test_get_or_create__creates_generation_1() -> None:
    customer, created = Customer.objects.get_or_create(
        reference="C-1", defaults={"name": "Ann", "email": "ann@example.test"}
    )

    assert created is True
    assert (row(customer.pk).generation, row(customer.pk).version) == (1, 1)


def test_get_or_create__returns_the_live_record_unchanged() -> None:
    existing = CustomerFactory(reference="C-1", name="Ann")

    customer, created = Customer.objects.get_or_create(reference="C-1", defaults={"name": "Other"})

    assert (created, customer.pk) == (False, existing.pk)
    assert (row(existing.pk).name, row(existing.pk).version) == ("Ann", 1)


def test_get_or_create__tombstone_key_raises_record_deleted_never_revives() -> None:
    dead = tombstoned("C-1")

    with CaptureQueriesContext(connection) as ctx, pytest.raises(RecordDeleted) as info:
        Customer.objects.get_or_create(
            reference="C-1", defaults={"name": "Ann", "email": "a@example.test"}
        )

    assert statements(ctx, "INSERT") == []
    assert info.value.pk == dead.pk
    assert Customer.all_objects.filter(reference="C-1").count() == 1
    assert row(dead.pk).is_tombstone
    assert row(dead.pk).version == 2


def test_get_or_create__through_all_objects_returns_the_tombstone_as_is() -> None:
    dead = tombstoned("C-1")

    customer, created = Customer.all_objects.get_or_create(
        reference="C-1", defaults={"name": "Ann"}
    )

    assert (created, customer.pk, customer.is_tombstone) == (False, dead.pk, True)
    assert row(dead.pk).version == 2


def test_update_or_create__updates_live_record_with_a_fenced_save() -> None:
    existing = CustomerFactory(reference="C-1", name="Ann", email="ann@example.test")

    customer, created = Customer.objects.update_or_create(reference="C-1", defaults={"name": "Bea"})

    assert (created, customer.pk) == (False, existing.pk)
    stored = row(existing.pk)
    assert (stored.name, stored.email, stored.version, stored.deleted_at) == (
        "Bea",
        "ann@example.test",
        2,
        None,
    )
    assert customer.version == 2


def test_update_or_create__creates_generation_1_when_key_is_new() -> None:
    customer, created = Customer.objects.update_or_create(
        reference="C-1", defaults={"name": "Ann", "email": "a@example.test"}
    )

    assert created is True
    assert (row(customer.pk).generation, row(customer.pk).version) == (1, 1)


def test_update_or_create__tombstone_key_raises_record_deleted_never_revives() -> None:
    dead = tombstoned("C-1")

    with pytest.raises(RecordDeleted):
        Customer.objects.update_or_create(reference="C-1", defaults={"name": "Ann"})
    with pytest.raises(RecordDeleted):
        Customer.all_objects.update_or_create(reference="C-1", defaults={"name": "Ann"})

    assert Customer.all_objects.filter(reference="C-1").count() == 1
    stored = row(dead.pk)
    assert (stored.name, stored.version, stored.is_tombstone) == ("", 2, True)


# --- recreate() ------------------------------------------------------------------------------


def test_recreate__revives_tombstone_as_next_generation_same_pk() -> None:
    dead = tombstoned("C-1", name="Old", email="old@example.test", phone="+1")
    Customer.objects.filter(pk=dead.pk).update(name="unused")  # tombstones are skipped

    revived = Customer.all_objects.recreate(reference="C-1", name="New", email="new@example.test")

    assert revived.pk == dead.pk
    assert (revived.generation, revived.version, revived.deleted_at) == (2, 1, None)
    assert revived._state.adding is False
    stored = row(dead.pk)
    assert (stored.generation, stored.version, stored.deleted_at) == (2, 1, None)
    assert (stored.name, stored.email, stored.phone) == ("New", "new@example.test", "")
    assert Customer.all_objects.count() == 1


def test_recreate__generation_keeps_climbing() -> None:
    dead = tombstoned("C-1")

    for expected in (2, 3, 4):
        revived = Customer.all_objects.recreate(reference="C-1", name="N", email="n@ex.test")
        assert revived.generation == expected
        revived.delete()

    assert (row(dead.pk).generation, row(dead.pk).is_tombstone) == (4, True)


def test_recreate__revived_record_can_be_saved_immediately() -> None:
    tombstoned("C-1")
    revived = Customer.all_objects.recreate(reference="C-1", name="New", email="n@ex.test")

    revived.name = "Newer"
    revived.save()

    assert (row(revived.pk).name, row(revived.pk).version) == ("Newer", 2)


def test_recreate__creates_generation_1_when_no_row_holds_the_key() -> None:
    with CaptureQueriesContext(connection) as ctx:
        created = Customer.all_objects.recreate(reference="C-9", name="Ann", email="a@ex.test")

    assert len(statements(ctx, "INSERT")) == 1
    stored = row(created.pk)
    assert (stored.reference, stored.generation, stored.version, stored.deleted_at) == (
        "C-9",
        1,
        1,
        None,
    )
    assert created._state.adding is False


def test_recreate__live_key_raises_already_live_and_changes_nothing() -> None:
    live = CustomerFactory(reference="C-1", name="Ann")

    with pytest.raises(AlreadyLive) as info:
        Customer.all_objects.recreate(reference="C-1", name="Other", email="o@ex.test")

    assert (info.value.pk, info.value.found_generation, info.value.found_version) == (
        live.pk,
        1,
        1,
    )
    stored = row(live.pk)
    assert (stored.name, stored.generation, stored.version) == ("Ann", 1, 1)


def test_recreate__without_business_key_raises_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"needs the business key 'reference'"):
        Customer.all_objects.recreate(name="Ann", email="a@ex.test")
    assert Customer.all_objects.count() == 0


@pytest.mark.parametrize("field", ["generation", "version", "deleted_at"])
def test_recreate__mixin_fields_raise_protected_field(field: str) -> None:
    dead = tombstoned("C-1")

    with pytest.raises(ProtectedField):
        Customer.all_objects.recreate(reference="C-1", name="N", **{field: None})
    assert row(dead.pk).is_tombstone


def test_recreate__through_the_live_manager_sees_tombstones_too() -> None:
    dead = tombstoned("C-1")

    revived = Customer.objects.recreate(reference="C-1", name="New", email="n@ex.test")

    assert (revived.pk, revived.generation) == (dead.pk, 2)


def test_create__with_tombstone_key_points_to_recreate() -> None:
    tombstoned("C-1")

    with pytest.raises(RecordDeleted, match="recreate"):
        Customer.objects.create(reference="C-1", name="Ann", email="a@ex.test")
    assert Customer.all_objects.count() == 1


# --- purge() ---------------------------------------------------------------------------------


def test_purge__removes_tombstones_never_live_rows() -> None:
    dead = tombstoned("C-1")
    live = CustomerFactory(reference="C-2")

    count = Customer.all_objects.all().purge()

    assert count == 1
    assert not Customer.all_objects.filter(pk=dead.pk).exists()
    assert row(live.pk).deleted_at is None


def test_purge__refused_by_protecting_relation() -> None:
    from django.db.models import ProtectedError

    sheet_row = SheetRowFactory()
    sheet_row.customer.delete()

    with pytest.raises(ProtectedError):
        Customer.all_objects.all().purge()
    assert Customer.tombstones.filter(pk=sheet_row.customer.pk).exists()


@pytest.mark.parametrize("key", ["id", "pk"])
def test_update__the_primary_key_raises_protected_field(key: str) -> None:
    live = CustomerFactory(reference="C-1")

    with pytest.raises(ProtectedField, match=rf"customers\.Customer\.{key} names the record's"):
        Customer.objects.filter(pk=live.pk).update(**{key: live.pk + 100})

    assert (row(live.pk).pk, row(live.pk).version) == (live.pk, 1)
