"""The record mixin: managers, fenced delete() and save(), erasure, and the typed errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, models, transaction
from django.test.utils import CaptureQueriesContext, isolate_apps

from project.customers.models import Customer
from tests.factories import CustomerFactory, SheetRowFactory
from tombstones import enqueue
from tombstones.exceptions import (
    AlreadyLive,
    GenerationChanged,
    MissingFence,
    RecordDeleted,
    RecordMissing,
    StaleVersion,
    TombstoneError,
)
from tombstones.models import TombstoneModel

pytestmark = pytest.mark.django_db


def statements(ctx: CaptureQueriesContext, verb: str) -> list[str]:
    """The captured SQL statements starting with ``verb`` (UPDATE, INSERT, DELETE, ...)."""
    return [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith(verb)]


def row(pk: Any) -> Customer:
    return Customer.all_objects.get(pk=pk)


# --- fields and managers ---------------------------------------------------------------------


def test_create__starts_at_generation_1_version_1_live() -> None:
    customer = Customer.objects.create(reference="C-1", name="Ann", email="ann@example.test")

    stored = row(customer.pk)
    assert (stored.generation, stored.version, stored.deleted_at) == (1, 1, None)
    assert (customer.generation, customer.version) == (1, 1)
    assert not stored.is_tombstone


def test_create__ignores_mixin_values_passed_in() -> None:
    customer = Customer(reference="C-1", name="Ann", email="a@example.test")
    customer.generation, customer.version = 7, 9

    customer.save()

    assert (row(customer.pk).generation, row(customer.pk).version) == (1, 1)


def test_managers__split_live_and_tombstones() -> None:
    live = CustomerFactory()
    dead = CustomerFactory()
    dead.delete()

    assert list(Customer.objects.values_list("pk", flat=True)) == [live.pk]
    assert list(Customer.tombstones.values_list("pk", flat=True)) == [dead.pk]
    assert set(Customer.all_objects.values_list("pk", flat=True)) == {live.pk, dead.pk}
    assert Customer._default_manager.name == "objects"


def test_managers__live_and_dead_queryset_helpers() -> None:
    live = CustomerFactory()
    dead = CustomerFactory()
    dead.delete()

    assert list(Customer.all_objects.live()) == [live]
    assert list(Customer.all_objects.dead()) == [dead]


def test_is_tombstone__follows_deleted_at() -> None:
    customer = CustomerFactory()
    assert customer.is_tombstone is False

    customer.delete()

    assert customer.is_tombstone is True
    assert row(customer.pk).is_tombstone is True


def test_base_manager__sees_tombstones_for_refresh_and_relations() -> None:
    sheet_row = SheetRowFactory()
    customer = sheet_row.customer
    Customer.objects.filter(pk=customer.pk).delete()

    customer.refresh_from_db()
    fresh_row = type(sheet_row).objects.get(pk=sheet_row.pk)

    assert customer.is_tombstone
    assert fresh_row.customer.is_tombstone
    assert fresh_row.customer.pk == customer.pk


# --- delete() --------------------------------------------------------------------------------


def test_delete__instance_makes_tombstone_in_one_update() -> None:
    customer = CustomerFactory(name="Ann", email="ann@example.test", phone="+1555")

    with CaptureQueriesContext(connection) as ctx:
        result = customer.delete()

    assert result == (1, {"customers.Customer": 1})
    assert len(statements(ctx, "UPDATE")) == 1
    assert statements(ctx, "DELETE") == []
    stored = row(customer.pk)
    assert stored.deleted_at is not None
    assert (stored.generation, stored.version) == (1, 2)
    assert (stored.name, stored.email, stored.phone) == ("", "", "")
    assert stored.reference == customer.reference  # identity is kept
    assert Customer.all_objects.count() == 1


def test_delete__instance_is_updated_in_memory() -> None:
    customer = CustomerFactory(name="Ann")

    customer.delete()

    assert customer.deleted_at == row(customer.pk).deleted_at
    assert customer.version == 2
    assert (customer.name, customer.email, customer.phone) == ("", "", "")
    assert customer.pk is not None


def test_delete__queryset_makes_all_tombstones_in_one_update() -> None:
    customers = CustomerFactory.create_batch(5)
    other = CustomerFactory()
    pks = [c.pk for c in customers]

    with CaptureQueriesContext(connection) as ctx:
        result = Customer.objects.filter(pk__in=pks).delete()

    assert result == (5, {"customers.Customer": 5})
    assert len(statements(ctx, "UPDATE")) == 1
    assert statements(ctx, "DELETE") == []
    assert Customer.tombstones.filter(pk__in=pks, version=2, name="", email="").count() == 5
    assert row(other.pk).deleted_at is None
    assert row(other.pk).version == 1


def test_delete__queryset_through_all_objects_skips_tombstones() -> None:
    dead = CustomerFactory()
    dead.delete()
    CustomerFactory()

    result = Customer.all_objects.all().delete()

    assert result == (1, {"customers.Customer": 1})
    assert row(dead.pk).version == 2
    assert Customer.objects.count() == 0


def test_delete__tombstone_again_changes_nothing_and_counts_0() -> None:
    customer = CustomerFactory()
    customer.delete()
    before = row(customer.pk)

    assert customer.delete() == (0, {"customers.Customer": 0})
    assert Customer.all_objects.filter(pk=customer.pk).delete() == (0, {"customers.Customer": 0})
    after = row(customer.pk)
    assert (after.version, after.deleted_at) == (before.version, before.deleted_at)


def test_delete__stale_generation_cannot_delete_the_new_generation() -> None:
    stale = CustomerFactory(reference="C-1")
    stale.delete()
    reborn = Customer.all_objects.recreate(reference="C-1", name="New", email="new@example.test")
    stale_gen1 = Customer(pk=stale.pk, reference="C-1", generation=1, version=1)
    stale_gen1._state.adding = False

    result = stale_gen1.delete()

    assert result == (0, {"customers.Customer": 0})
    stored = row(reborn.pk)
    assert stored.deleted_at is None
    assert (stored.generation, stored.version, stored.name) == (2, 1, "New")


def test_delete__queryset_with_slice_is_refused() -> None:
    CustomerFactory.create_batch(2)

    with pytest.raises(TypeError, match="limit"):
        Customer.objects.all()[:1].delete()
    assert Customer.tombstones.count() == 0


def test_delete__instance_without_pk_is_refused() -> None:
    with pytest.raises(ValueError, match="pk is None"):
        Customer(reference="C-1").delete()


def test_delete__deleted_at_is_database_time_and_ordered() -> None:
    first, second = CustomerFactory.create_batch(2)

    first.delete()
    second.delete()

    assert row(first.pk).deleted_at <= row(second.pk).deleted_at


# --- erasure of nullable personal fields (a throwaway table) --------------------------------


@pytest.fixture
def contact_model(transactional_db: None) -> Iterator[type[TombstoneModel]]:
    """A tombstoned model with nullable and non-null personal fields, on a real table."""
    with isolate_apps("tests.integration"):

        class Contact(TombstoneModel):
            code = models.CharField(max_length=20, unique=True)
            nickname = models.CharField(max_length=50, null=True)
            notes = models.TextField()
            age = models.PositiveIntegerField(null=True)
            kept = models.CharField(max_length=20, default="kept")

            class TombstoneMeta:
                business_key = "code"
                personal_fields = ("nickname", "notes", "age")

            class Meta:
                app_label = "integration"

        with connection.schema_editor() as editor:
            editor.create_model(Contact)
        try:
            yield Contact
        finally:
            with connection.schema_editor() as editor:
                editor.delete_model(Contact)


def test_delete__erases_nullable_to_none_and_text_to_empty(
    contact_model: type[Any],
) -> None:
    contact = contact_model.objects.create(code="K-1", nickname="Kay", notes="secret", age=40)

    contact.delete()

    stored = contact_model.all_objects.get(pk=contact.pk)
    assert (stored.nickname, stored.notes, stored.age, stored.kept) == (None, "", None, "kept")
    assert (contact.nickname, contact.notes, contact.age) == (None, "", None)


# --- save() ----------------------------------------------------------------------------------


def test_save__is_a_fenced_update_that_bumps_version() -> None:
    customer = CustomerFactory()
    customer.name = "Renamed"

    with CaptureQueriesContext(connection) as ctx:
        customer.save()

    updates = statements(ctx, "UPDATE")
    assert len(updates) == 1
    assert statements(ctx, "INSERT") == []
    for column in ('"generation"', '"version"', '"deleted_at"'):
        assert column in updates[0].split("WHERE", 1)[1]
    stored = row(customer.pk)
    assert (stored.name, stored.version, stored.generation) == ("Renamed", 2, 1)
    assert customer.version == 2


def test_save__twice_in_a_row_uses_the_bumped_version() -> None:
    customer = CustomerFactory()

    customer.save()
    customer.save()

    assert row(customer.pk).version == 3
    assert customer.version == 3


def test_save__stale_instance_raises_stale_version() -> None:
    customer = CustomerFactory(name="Ann")
    stale = Customer.objects.get(pk=customer.pk)
    customer.name = "First"
    customer.save()
    stale.name = "Second"

    with pytest.raises(StaleVersion) as info:
        stale.save()

    assert (info.value.expected_version, info.value.found_version) == (1, 2)
    assert info.value.pk == customer.pk
    assert row(customer.pk).name == "First"
    assert row(customer.pk).version == 2


def test_save__tombstone_instance_raises_record_deleted_without_writing() -> None:
    customer = CustomerFactory()
    customer.delete()
    customer.name = "Back"

    with CaptureQueriesContext(connection) as ctx, pytest.raises(RecordDeleted):
        customer.save()

    assert statements(ctx, "UPDATE") == []
    assert statements(ctx, "INSERT") == []
    assert row(customer.pk).is_tombstone
    assert row(customer.pk).name == ""


def test_save__stale_instance_of_deleted_row_never_resurrects_or_inserts() -> None:
    customer = CustomerFactory(name="Ann")
    stale = Customer.objects.get(pk=customer.pk)
    customer.delete()
    stale.name = "Back"
    rows_before = Customer.all_objects.count()

    with CaptureQueriesContext(connection) as ctx, pytest.raises(RecordDeleted) as info:
        stale.save()

    assert statements(ctx, "INSERT") == []
    assert Customer.all_objects.count() == rows_before
    stored = row(customer.pk)
    assert stored.is_tombstone
    assert (stored.name, stored.version) == ("", 2)
    assert info.value.found_version == 2


def test_save__stale_instance_of_recreated_row_raises_generation_changed() -> None:
    customer = CustomerFactory(reference="C-1")
    stale = Customer.objects.get(pk=customer.pk)
    customer.delete()
    Customer.all_objects.recreate(reference="C-1", name="New", email="new@example.test")
    stale.name = "Old"

    with pytest.raises(GenerationChanged) as info:
        stale.save()

    assert (info.value.expected_generation, info.value.found_generation) == (1, 2)
    stored = row(customer.pk)
    assert (stored.name, stored.generation, stored.version) == ("New", 2, 1)


def test_save__purged_row_raises_record_missing_and_never_inserts() -> None:
    customer = CustomerFactory()
    stale = Customer.objects.get(pk=customer.pk)
    customer.delete()
    Customer.all_objects.filter(pk=customer.pk).purge()

    with CaptureQueriesContext(connection) as ctx, pytest.raises(RecordMissing):
        stale.save()

    assert statements(ctx, "INSERT") == []
    assert Customer.all_objects.count() == 0


def test_save__force_insert_of_existing_tombstone_key_raises_record_deleted() -> None:
    customer = CustomerFactory(reference="C-1")
    customer.delete()

    with pytest.raises(RecordDeleted):
        Customer(reference="C-1", name="Dup", email="d@example.test").save()

    assert Customer.all_objects.filter(reference="C-1").count() == 1
    assert row(customer.pk).is_tombstone


def test_save__update_fields_writes_only_those_fields() -> None:
    customer = CustomerFactory(name="Ann", email="ann@example.test")
    Customer.objects.filter(pk=customer.pk)  # no-op: the instance is current
    customer.name = "Bea"
    customer.email = "changed@example.test"

    customer.save(update_fields=["name"])

    stored = row(customer.pk)
    assert (stored.name, stored.email, stored.version) == ("Bea", "ann@example.test", 2)


def test_save__update_fields_still_fenced() -> None:
    customer = CustomerFactory()
    stale = Customer.objects.get(pk=customer.pk)
    customer.save()

    with pytest.raises(StaleVersion):
        stale.save(update_fields=["name"])
    assert row(customer.pk).version == 2


def test_save__update_fields_empty_is_a_no_op() -> None:
    customer = CustomerFactory()

    with CaptureQueriesContext(connection) as ctx:
        customer.save(update_fields=[])

    assert statements(ctx, "UPDATE") == []
    assert row(customer.pk).version == 1


def test_save__update_fields_unknown_name_is_refused() -> None:
    customer = CustomerFactory()

    with pytest.raises(ValueError, match="nickname"):
        customer.save(update_fields=["nickname"])
    assert row(customer.pk).version == 1


def test_save__update_fields_naming_mixin_fields_cannot_move_them() -> None:
    customer = CustomerFactory(name="Ann")
    customer.name = "Bea"
    customer.generation = 5  # ignored: only recreate() moves generation

    with pytest.raises(GenerationChanged):
        customer.save(update_fields=["name", "generation", "version", "deleted_at"])
    stored = row(customer.pk)
    assert (stored.name, stored.generation, stored.version) == ("Ann", 1, 1)

    customer.generation = 1
    customer.save(update_fields=["name", "generation", "version", "deleted_at"])
    stored = row(customer.pk)
    assert (stored.name, stored.generation, stored.version, stored.deleted_at) == (
        "Bea",
        1,
        2,
        None,
    )


def test_save__deferred_fields_are_not_written() -> None:
    customer = CustomerFactory(name="Ann", email="ann@example.test")
    partial = Customer.objects.only("name").get(pk=customer.pk)
    partial.name = "Bea"

    with CaptureQueriesContext(connection) as ctx:
        partial.save()

    assert len(ctx.captured_queries) == 1  # no extra SELECT for each deferred field
    assert '"email"' not in statements(ctx, "UPDATE")[0]
    stored = row(customer.pk)
    assert (stored.name, stored.email, stored.version) == ("Bea", "ann@example.test", 2)


def test_save__only_still_loads_the_fence_so_stale_is_detected() -> None:
    customer = CustomerFactory(name="Ann")
    stale = Customer.objects.only("name").get(pk=customer.pk)
    customer.name = "First"
    customer.save()
    stale.name = "Second"

    with pytest.raises(StaleVersion):
        stale.save()

    assert stale.get_deferred_fields() == {"reference", "email", "phone", "synced_at"}
    assert (row(customer.pk).name, row(customer.pk).version) == ("First", 2)


def test_delete__defer_generation_cannot_reach_the_new_generation() -> None:
    customer = CustomerFactory(reference="C-1")
    stale = Customer.objects.defer("generation", "version", "name").get(pk=customer.pk)
    customer.delete()
    Customer.all_objects.recreate(reference="C-1", name="New", email="new@example.test")

    assert stale.get_deferred_fields() == {"name"}
    assert stale.delete() == (0, {"customers.Customer": 0})
    assert row(customer.pk).deleted_at is None
    assert row(customer.pk).generation == 2


def test_save__raw_instance_without_fence_fields_raises_missing_fence() -> None:
    customer = CustomerFactory(name="Ann")
    table = Customer._meta.db_table
    (raw,) = Customer.objects.raw(f'SELECT "id", "name" FROM "{table}"')
    raw.name = "Bea"

    with pytest.raises(MissingFence):
        raw.save()
    with pytest.raises(MissingFence):
        raw.delete()
    stored = row(customer.pk)
    assert (stored.name, stored.version, stored.deleted_at) == ("Ann", 1, None)


def test_save__positional_arguments_are_refused() -> None:
    customer = CustomerFactory()

    with pytest.raises(TypeError, match="keyword arguments only"):
        customer.save(False)


def test_save__sends_pre_and_post_save_signals() -> None:
    customer = CustomerFactory()
    seen: list[tuple[str, bool | None, int]] = []

    def on_pre(sender: Any, instance: Customer, **kwargs: Any) -> None:
        seen.append(("pre", None, instance.version))

    def on_post(sender: Any, instance: Customer, created: bool, **kwargs: Any) -> None:
        seen.append(("post", created, instance.version))

    models.signals.pre_save.connect(on_pre, sender=Customer)
    models.signals.post_save.connect(on_post, sender=Customer)
    try:
        customer.save()
    finally:
        models.signals.pre_save.disconnect(on_pre, sender=Customer)
        models.signals.post_save.disconnect(on_post, sender=Customer)

    assert seen == [("pre", None, 1), ("post", False, 2)]


# --- errors never carry field values ---------------------------------------------------------

PLANTED = "Zyxwvut-Planted-Name-31337"


def _raise_record_deleted() -> TombstoneError:
    customer = CustomerFactory(name=PLANTED)
    stale = Customer.objects.get(pk=customer.pk)
    customer.delete()
    stale.name = PLANTED
    with pytest.raises(RecordDeleted) as info:
        stale.save()
    return info.value


def _raise_record_deleted_on_insert() -> TombstoneError:
    CustomerFactory(reference="C-planted").delete()
    with pytest.raises(RecordDeleted) as info:
        Customer.objects.create(reference="C-planted", name=PLANTED, email="p@example.test")
    return info.value


def _raise_generation_changed() -> TombstoneError:
    customer = CustomerFactory(reference="C-planted", name=PLANTED)
    stale = Customer.objects.get(pk=customer.pk)
    customer.delete()
    Customer.all_objects.recreate(reference="C-planted", name=PLANTED, email="p@example.test")
    with pytest.raises(GenerationChanged) as info:
        stale.save()
    return info.value


def _raise_stale_version() -> TombstoneError:
    customer = CustomerFactory(name=PLANTED)
    stale = Customer.objects.get(pk=customer.pk)
    customer.save()
    with pytest.raises(StaleVersion) as info:
        stale.save()
    return info.value


def _raise_already_live() -> TombstoneError:
    CustomerFactory(reference="C-planted", name=PLANTED)
    with pytest.raises(AlreadyLive) as info:
        Customer.all_objects.recreate(reference="C-planted", name=PLANTED, email="x@example.test")
    return info.value


def _raise_missing_fence() -> TombstoneError:
    customer = CustomerFactory(name=PLANTED)
    customer.version = None  # type: ignore[assignment]
    with transaction.atomic(), pytest.raises(MissingFence) as info:
        enqueue("customers.update_sheet_row", customer)
    return info.value


@pytest.mark.parametrize(
    ("trigger", "expected"),
    [
        (_raise_record_deleted, RecordDeleted),
        (_raise_record_deleted_on_insert, RecordDeleted),
        (_raise_generation_changed, GenerationChanged),
        (_raise_stale_version, StaleVersion),
        (_raise_already_live, AlreadyLive),
        (_raise_missing_fence, MissingFence),
    ],
)
def test_errors__carry_ids_never_field_values(trigger: Any, expected: type[TombstoneError]) -> None:
    exc = trigger()

    assert type(exc) is expected
    assert exc.model == "customers.Customer"
    assert PLANTED not in str(exc)
    assert PLANTED not in repr(exc)
    assert all(PLANTED not in str(value) for value in vars(exc).values())


def test_errors__carry_pk_and_generation_version_numbers() -> None:
    customer = CustomerFactory(reference="C-1")
    stale = Customer.objects.get(pk=customer.pk)
    customer.save()
    customer.delete()

    with pytest.raises(RecordDeleted) as info:
        stale.save()

    exc = info.value
    assert exc.pk == customer.pk
    assert (exc.expected_generation, exc.found_generation) == (1, 1)
    assert (exc.expected_version, exc.found_version) == (1, 3)
    assert f"pk={customer.pk}" in str(exc)


def test_generated_column__save_and_recreate_leave_it_to_the_database() -> None:
    """A GeneratedField is computed by the database from what save() and recreate() wrote."""
    from project.stress.models import Meter

    meter = Meter.all_objects.recreate(key="M-1", reading=2)
    meter.reading = 5
    meter.save()
    meter.refresh_from_db()
    assert (meter.reading, meter.doubled, meter.version) == (5, 10, 2)
    meter.delete()
    again = Meter.all_objects.recreate(key="M-1", reading=7)
    again.refresh_from_db()
    assert (again.generation, again.version, again.doubled) == (2, 1, 14)
