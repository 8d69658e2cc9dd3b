"""purge_tombstones: only old, unreferenced tombstones; says what it kept and why."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import models
from django.db.models import Value
from django.db.models.functions import Now

import tombstones
from project.customers.models import Customer, SheetRow
from tests.factories import CustomerFactory, SheetRowFactory
from tombstones.models import Job

pytestmark = pytest.mark.django_db


def _age(customer: Customer, days: int) -> None:
    # A plain QuerySet: the record querysets never touch tombstones, this back-dates one.

    models.QuerySet(Customer).filter(pk=customer.pk).update(
        deleted_at=Now() - Value(timedelta(days=days))
    )


def _purge(*args: str) -> str:
    out = StringIO()
    call_command("purge_tombstones", "--model", "customers.Customer", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def scene(settings: Any) -> dict[str, Customer]:
    settings.TOMBSTONES_RETENTION = timedelta(days=30)
    live, young, old, referenced = (CustomerFactory() for _ in range(4))
    job_for_referenced = tombstones.enqueue("customers.update_sheet_row", referenced)
    Job.objects.filter(pk=job_for_referenced.pk).update(status=Job.Status.QUEUED)
    for tomb in (young, old, referenced):
        tomb.delete()
    _age(old, 40)
    _age(referenced, 40)
    _age(young, 5)
    return {"live": live, "young": young, "old": old, "referenced": referenced}


def test_purge__dry_run_removes_nothing(scene: dict[str, Customer]) -> None:
    text = _purge("--dry-run")
    assert "Would remove 1" in text
    assert Customer.all_objects.count() == 4


def test_purge__removes_only_old_unreferenced_tombstones(scene: dict[str, Customer]) -> None:
    text = _purge("--noinput")
    remaining = set(Customer.all_objects.values_list("pk", flat=True))
    assert remaining == {scene["live"].pk, scene["young"].pk, scene["referenced"].pk}
    assert "kept 1 younger than retention, 1 referenced by unfinished jobs" in text
    assert "Removed 1" in text


def test_purge__a_finished_job_no_longer_protects_the_tombstone(scene: dict[str, Customer]) -> None:
    Job.objects.update(status=Job.Status.REJECTED)
    _purge("--noinput")
    assert not Customer.all_objects.filter(pk=scene["referenced"].pk).exists()


def test_purge__keeps_tombstones_protected_by_foreign_keys(settings: Any) -> None:
    settings.TOMBSTONES_RETENTION = timedelta(days=30)
    row = SheetRowFactory()
    row.customer.delete()
    _age(row.customer, 40)
    text = _purge("--noinput")
    assert "0 referenced by unfinished jobs, 1 protected by related rows" in text
    assert "Nothing to remove." in text
    assert SheetRow.all_objects.filter(pk=row.pk).exists()
    assert Customer.all_objects.filter(pk=row.customer.pk).exists()


def test_purge__interactive_refusal_changes_nothing(
    scene: dict[str, Customer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("builtins.input", lambda prompt: "no")
    with pytest.raises(CommandError, match="cancelled"):
        _purge()
    assert Customer.all_objects.count() == 4


def test_purge__unknown_or_plain_model_is_refused() -> None:
    with pytest.raises(CommandError):
        call_command("purge_tombstones", "--model", "customers.CrmContact", stdout=StringIO())
    with pytest.raises(CommandError):
        call_command("purge_tombstones", "--model", "nope.Nope", stdout=StringIO())


def _throwaway_child(name: str, on_delete: Any, **options: Any) -> Iterator[type[models.Model]]:
    """A plain model with a foreign key to Customer, its table created for the test."""
    from django.apps import apps
    from django.db import connection

    child = type(
        name,
        (models.Model,),
        {
            "__module__": __name__,
            "customer": models.ForeignKey(Customer, on_delete=on_delete, **options),
            "text": models.CharField(max_length=10, blank=True),
            "Meta": type("Meta", (), {"app_label": "customers", "db_table": f"test_{name}"}),
        },
    )
    apps.clear_cache()  # so Customer's reverse relations include the new model
    with connection.schema_editor() as editor:
        editor.create_model(child)
    try:
        yield child
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(child)
        del apps.all_models["customers"][name.lower()]
        apps.clear_cache()


@pytest.fixture
def cascade_child() -> Iterator[type[models.Model]]:
    """A throwaway model with a CASCADE foreign key to Customer."""
    yield from _throwaway_child("PurgeNote", models.CASCADE)


@pytest.fixture
def set_null_child() -> Iterator[type[models.Model]]:
    """A throwaway model whose nullable foreign key to Customer is SET_NULL."""
    yield from _throwaway_child("PurgeLink", models.SET_NULL, null=True)


@pytest.fixture
def readme_sheet_row() -> Iterator[type[models.Model]]:
    """The README's SheetRow: a plain model whose foreign key to Customer is PROTECT."""
    yield from _throwaway_child("ReadmeSheetRow", models.PROTECT)


@pytest.mark.django_db(transaction=True)
def test_purge__refuses_to_cascade_to_live_rows(
    settings: Any, cascade_child: type[models.Model]
) -> None:
    """A CASCADE child of a tombstone must never be hard-deleted by a purge."""
    settings.TOMBSTONES_RETENTION = timedelta(days=30)
    customer = CustomerFactory()
    cascade_child.objects.create(customer=customer, text="keep me")  # type: ignore[attr-defined]
    customer.delete()
    _age(customer, 40)
    with pytest.raises(models.ProtectedError):
        Customer.all_objects.filter(pk=customer.pk).purge()
    text = _purge("--noinput")
    assert "1 protected by related rows" in text
    assert "customers.PurgeNote: 1 row(s), on_delete=CASCADE" in text
    assert cascade_child.objects.count() == 1  # type: ignore[attr-defined]
    assert Customer.all_objects.filter(pk=customer.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_purge__dry_run_and_real_run_agree_when_a_related_row_protects_a_tombstone(
    settings: Any, readme_sheet_row: type[models.Model]
) -> None:
    """The README's SheetRow (on_delete=PROTECT): the dry run keeps what the real run keeps."""
    settings.TOMBSTONES_RETENTION = timedelta(days=30)
    protected, free = CustomerFactory(reference="C-PROT"), CustomerFactory()
    readme_sheet_row.objects.create(customer=protected)  # type: ignore[attr-defined]
    for tomb in (protected, free):
        tomb.delete()
        _age(tomb, 40)

    dry = _purge("--dry-run")
    assert "Would remove 1 tombstone(s)" in dry
    assert "1 protected by related rows" in dry
    kept = (
        f"  kept customers.Customer pk={protected.pk} generation=1 reference=C-PROT: protected "
        "by customers.ReadmeSheetRow: 1 live row(s), on_delete=PROTECT"
    )
    assert kept in dry.splitlines()
    assert Customer.all_objects.count() == 2

    real = _purge("--noinput")
    assert "Removed 1 tombstone(s)" in real
    assert kept in real.splitlines()
    assert set(Customer.all_objects.values_list("pk", flat=True)) == {protected.pk}


def test_purge__a_tombstone_protected_by_a_tombstone_goes_on_the_next_run(settings: Any) -> None:
    """The demo's SheetRow is a TombstoneModel: its tombstone protects its customer's until it is
    purged itself; each run removes what its dry run announced."""
    settings.TOMBSTONES_RETENTION = timedelta(days=30)
    row = SheetRowFactory()
    row.delete()
    row.customer.delete()
    _age(row.customer, 40)
    models.QuerySet(SheetRow).filter(pk=row.pk).update(deleted_at=Now() - Value(timedelta(days=40)))

    def purge_all(*args: str) -> str:
        out = StringIO()
        call_command("purge_tombstones", *args, stdout=out)
        return out.getvalue()

    dry = purge_all("--dry-run")
    assert "Would remove 1 tombstone(s)" in dry
    assert "by customers.SheetRow: 1 tombstone(s), on_delete=PROTECT" in dry
    assert "Removed 1 tombstone(s)" in purge_all("--noinput")
    assert not SheetRow.all_objects.filter(pk=row.pk).exists()
    assert Customer.all_objects.filter(pk=row.customer.pk).exists()

    assert "Would remove 1 tombstone(s)" in purge_all("--dry-run")
    assert "Removed 1 tombstone(s)" in purge_all("--noinput")
    assert not Customer.all_objects.filter(pk=row.customer.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_purge__a_set_null_row_loses_its_link_and_does_not_protect(
    settings: Any, set_null_child: type[models.Model]
) -> None:
    """What docs/records.md offers for rows that must outlive the record."""
    settings.TOMBSTONES_RETENTION = timedelta(days=30)
    customer = CustomerFactory()
    link = set_null_child.objects.create(customer=customer)  # type: ignore[attr-defined]
    customer.delete()
    _age(customer, 40)
    assert "Would remove 1 tombstone(s)" in _purge("--dry-run")
    assert "Removed 1 tombstone(s)" in _purge("--noinput")
    link.refresh_from_db()
    assert link.customer_id is None
