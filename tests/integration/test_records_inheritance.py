"""A multi-table inheritance child (``stress.BusinessAccount``, child of ``stress.Account``): its
fence (generation, version, deleted_at) lives in the parent's table, its own fields in its own.

Every fenced write (delete, save, update, recreate, the handler's ``ctx.update`` and
``ctx.write``) works on it, writes both tables or neither, and every UPDATE of the fence's table
still carries the fence (issue 32: ``F("version") + 1`` on the parent's field raised
``FieldError: Joined field references are not permitted``; Django's own update of a child
updated the parent by pk alone).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

import tombstones
from project.stress.models import Account, BusinessAccount
from tests.jobkit import run, temp_handler
from tombstones.exceptions import RecordDeleted, StaleVersion
from tombstones.models import Job
from tombstones.records import fencing
from tombstones.records.fencing import Fence
from tombstones.signals import record_tombstoned

pytestmark = pytest.mark.django_db

PARENT = Account._meta.db_table
CHILD = BusinessAccount._meta.db_table


def _account(key: str = "A-1", **fields: Any) -> BusinessAccount:
    values: dict[str, Any] = {
        "holder": "Holder Planted",
        "company": "Acme",
        "contact_email": "contact@acme.test",
    }
    values.update(fields)
    return BusinessAccount.objects.create(key=key, **values)


def _row(pk: Any) -> dict[str, Any]:
    """The record as both tables hold it."""
    values = BusinessAccount.all_objects.filter(pk=pk).values(
        "generation", "version", "deleted_at", "holder", "company", "contact_email", "credits"
    )
    return dict(values.get())


def _updates_of(captured: CaptureQueriesContext, table: str) -> list[str]:
    return [q["sql"] for q in captured if q["sql"].startswith(f'UPDATE "{table}"')]


def test_inheritance__instance_delete_makes_a_tombstone_in_both_tables() -> None:
    account = _account()
    assert account.delete() == (1, {"stress.BusinessAccount": 1})
    row = _row(account.pk)
    assert row["deleted_at"] is not None
    assert row["version"] == 2
    assert row["holder"] == ""  # a personal field of the parent's table, erased
    assert row["contact_email"] == ""  # and one of the child's own
    assert row["company"] == "Acme"
    assert (account.version, account.holder, account.contact_email) == (2, "", "")
    assert account.delete() == (0, {"stress.BusinessAccount": 0})  # a tombstone stays as it is
    assert _row(account.pk)["version"] == 2


def test_inheritance__a_stale_instance_cannot_delete_the_new_generation() -> None:
    stale = _account()
    BusinessAccount.objects.filter(pk=stale.pk).delete()
    BusinessAccount.all_objects.recreate(key="A-1", company="Acme 2")
    assert stale.delete() == (0, {"stress.BusinessAccount": 0})
    row = _row(stale.pk)
    assert (row["generation"], row["version"], row["deleted_at"]) == (2, 1, None)


@pytest.mark.parametrize("receivers", [True, False], ids=["signal", "no-receiver"])
def test_inheritance__queryset_delete_tombstones_the_live_rows_only(
    receivers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not receivers:  # the one-statement road taken when nothing listens to the signal
        monkeypatch.setattr(record_tombstoned, "has_listeners", lambda sender=None: False)
    first, second, dead = _account("A-1"), _account("A-2"), _account("A-3")
    dead.delete()
    assert BusinessAccount.all_objects.all().delete() == (2, {"stress.BusinessAccount": 2})
    for account in (first, second):
        row = _row(account.pk)
        assert row["deleted_at"] is not None
        assert (row["version"], row["holder"], row["contact_email"]) == (2, "", "")
    assert _row(dead.pk)["version"] == 2  # already a tombstone: untouched


def test_inheritance__save_writes_both_tables_and_a_stale_instance_neither() -> None:
    account = _account()
    stale = BusinessAccount.objects.get(pk=account.pk)
    account.holder, account.company = "New Holder", "Acme Ltd"
    account.save()
    assert account.version == 2
    row = _row(account.pk)
    assert (row["version"], row["holder"], row["company"]) == (2, "New Holder", "Acme Ltd")
    stale.company, stale.holder = "Overwritten", "Overwritten"
    with pytest.raises(StaleVersion):
        stale.save()
    row = _row(account.pk)
    assert (row["version"], row["holder"], row["company"]) == (2, "New Holder", "Acme Ltd")


def test_inheritance__save_of_a_tombstone_writes_nothing() -> None:
    account = _account()
    stale = BusinessAccount.objects.get(pk=account.pk)
    account.delete()
    stale.company = "Resurrected"
    with pytest.raises(RecordDeleted):
        stale.save()
    assert _row(account.pk)["company"] == "Acme"


def test_inheritance__queryset_update_bumps_version_and_skips_tombstones() -> None:
    live, dead = _account("A-1"), _account("A-2")
    dead.delete()
    updated = BusinessAccount.all_objects.update(company="Renamed", holder="Someone", credits=5)
    assert updated == 1
    row = _row(live.pk)
    assert (row["version"], row["company"], row["holder"], row["credits"]) == (
        2,
        "Renamed",
        "Someone",
        5,
    )
    row = _row(dead.pk)
    assert (row["version"], row["company"], row["holder"], row["credits"]) == (2, "Acme", "", 0)


def test_inheritance__recreate_revives_both_tables_as_the_next_generation() -> None:
    account = _account()
    account.delete()
    fresh = BusinessAccount.all_objects.recreate(key="A-1", holder="Next", company="Acme 2")
    assert (fresh.pk, fresh.number) == (account.pk, account.pk)
    assert (fresh.generation, fresh.version) == (2, 1)
    row = _row(account.pk)
    assert (row["generation"], row["version"], row["deleted_at"]) == (2, 1, None)
    assert (row["holder"], row["company"], row["contact_email"]) == ("Next", "Acme 2", "")
    fresh.credits = 3
    fresh.save()  # the revived instance carries its fence
    assert _row(account.pk)["version"] == 2


def test_inheritance__a_new_child_never_overwrites_an_existing_parent_row() -> None:
    parent = Account.objects.create(key="P-1", holder="Parent Holder")
    parent.delete()
    child = BusinessAccount(number=parent.pk, key="P-2", company="Intruder")
    with pytest.raises(IntegrityError), transaction.atomic():
        child.save()
    row = Account.all_objects.filter(pk=parent.pk).values("key", "deleted_at", "version").get()
    assert row["key"] == "P-1"
    assert row["deleted_at"] is not None  # still a tombstone: not revived as generation 1
    assert row["version"] == 2


def test_inheritance__the_handlers_update_and_write_are_fenced() -> None:
    account = _account()
    pk, generation, version = account.pk, account.generation, account.version
    assert fencing.update_record(
        Fence(BusinessAccount, pk, generation, version), {"holder": "H", "credits": 7}
    )
    # The old version no longer matches: nothing is written, in either table.
    assert not fencing.update_record(
        Fence(BusinessAccount, pk, generation, version), {"holder": "X", "credits": 99}
    )
    target = BusinessAccount.all_objects.filter(pk=pk)
    at_two = Fence(BusinessAccount, pk, generation, 2)
    assert fencing.write_related(target, at_two, {"company": "W"})
    assert not fencing.write_related(target, at_two, {"company": "Z"})
    row = _row(pk)
    assert (row["version"], row["holder"], row["credits"], row["company"]) == (3, "H", 7, "W")


def test_inheritance__a_job_updates_the_record_through_the_worker() -> None:
    def handler(ctx: Any) -> None:
        ctx.update(holder="Job Holder", credits=ctx.params["credits"])

    account = _account()
    with temp_handler("t.account_credits", handler):
        job = run(tombstones.enqueue("t.account_credits", account, params={"credits": 4}))
    assert job.status == Job.Status.SUCCEEDED
    row = _row(account.pk)
    assert (row["version"], row["holder"], row["credits"]) == (2, "Job Holder", 4)


WRITES: dict[str, Callable[[BusinessAccount], Any]] = {
    "delete": lambda a: a.delete(),
    "queryset-delete": lambda a: BusinessAccount.objects.filter(pk=a.pk).delete(),
    "save": lambda a: a.save(),
    "update": lambda a: BusinessAccount.objects.filter(pk=a.pk).update(company="U"),
    "update_record": lambda a: fencing.update_record(Fence.of(a), {"company": "R", "holder": "R"}),
    "write_related": lambda a: fencing.write_related(
        BusinessAccount.all_objects.filter(pk=a.pk),
        Fence.of(a),
        {"company": "W"},
    ),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_inheritance__every_update_of_the_fences_table_carries_the_fence(write: str) -> None:
    account = _account()
    with CaptureQueriesContext(connection) as captured:
        WRITES[write](account)
    parent_updates = _updates_of(captured, PARENT)
    assert parent_updates, "the fence's table was not written"
    for sql in parent_updates:
        where = sql.split(" WHERE ", 1)[1]
        assert '"deleted_at" IS NULL' in where, sql
    # The fence's table first: a child table is written only for rows the fence matched.
    first_parent = next(i for i, q in enumerate(captured) if q["sql"] in parent_updates)
    child_updates = [i for i, q in enumerate(captured) if q["sql"].startswith(f'UPDATE "{CHILD}"')]
    assert all(i > first_parent for i in child_updates)


def test_inheritance__recreate_is_fenced_on_the_tombstone() -> None:
    account = _account()
    account.delete()
    with CaptureQueriesContext(connection) as captured:
        BusinessAccount.all_objects.recreate(key="A-1", company="Again")
    (revive,) = _updates_of(captured, PARENT)
    assert '"deleted_at" IS NOT NULL' in revive.split(" WHERE ", 1)[1]
