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
    assert "kept 1 protected by related rows" in text
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


@pytest.fixture
def cascade_child() -> Iterator[type[models.Model]]:
    """A throwaway model with a CASCADE foreign key to Customer, table created for the test."""
    from django.apps import apps
    from django.db import connection

    class PurgeNote(models.Model):
        customer = models.ForeignKey(Customer, on_delete=models.CASCADE)
        text = models.CharField(max_length=10)

        class Meta:
            app_label = "customers"
            db_table = "test_purge_note"

        def __str__(self) -> str:
            return f"note {self.pk}"

    apps.clear_cache()  # so Customer's reverse relations include the new model
    with connection.schema_editor() as editor:
        editor.create_model(PurgeNote)
    try:
        yield PurgeNote
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(PurgeNote)
        del apps.all_models["customers"]["purgenote"]
        apps.clear_cache()


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
    assert "kept 1 protected by related rows" in text
    assert cascade_child.objects.count() == 1  # type: ignore[attr-defined]
    assert Customer.all_objects.filter(pk=customer.pk).exists()
