"""Record races on real PostgreSQL connections: one thread (one connection) per actor.

Each round lines the actors up on a threading.Barrier so their statements overlap, then checks
the row. Threads get their own connection from Django and close it when they finish.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from project.customers.models import Customer
from tests.jobkit import run_together
from tombstones.exceptions import AlreadyLive, RecordDeleted

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_save_racing_delete__never_resurrects(postgres_only: None) -> None:
    outcomes = {"save_first": 0, "save_raised": 0}
    for n in range(100):
        customer = Customer.objects.create(
            reference=f"R-{n}", name="Before", email="before@example.test"
        )
        stale = Customer.objects.get(pk=customer.pk)
        deleter = Customer.objects.get(pk=customer.pk)
        stale.name = "After"

        saved, deleted = run_together(stale.save, deleter.delete)

        assert deleted == (1, {"customers.Customer": 1}), f"round {n}"
        stored = Customer.all_objects.get(pk=customer.pk)
        assert stored.deleted_at is not None, f"round {n}: resurrected"
        assert (stored.generation, stored.name, stored.email) == (1, "", ""), f"round {n}"
        if isinstance(saved, RecordDeleted):
            # The delete landed first: the save wrote nothing.
            assert stored.version == 2, f"round {n}"
            outcomes["save_raised"] += 1
        else:
            # The save landed first (version 2), then the delete tombstoned it (version 3).
            assert saved is None, f"round {n}: {saved!r}"
            assert stored.version == 3, f"round {n}"
            outcomes["save_first"] += 1
        assert not Customer.objects.filter(pk=customer.pk).exists(), f"round {n}"
        assert Customer.all_objects.filter(reference=f"R-{n}").count() == 1

    assert sum(outcomes.values()) == 100


def test_save_after_delete_committed__always_raises(postgres_only: None) -> None:
    # The ordered half of the race: the delete has committed, the stale save must not land.
    for n in range(20):
        customer = Customer.objects.create(reference=f"S-{n}", name="A", email="a@ex.test")
        stale = Customer.objects.get(pk=customer.pk)
        (deleted,) = run_together(customer.delete)
        stale.name = "Back"

        (saved,) = run_together(stale.save)

        assert deleted[0] == 1
        assert isinstance(saved, RecordDeleted), f"round {n}: {saved!r}"
        stored = Customer.all_objects.get(pk=customer.pk)
        assert (stored.deleted_at is not None, stored.version, stored.name) == (True, 2, "")


def recreate(reference: str, name: str) -> Callable[[], Customer]:
    def action() -> Customer:
        return Customer.all_objects.recreate(
            reference=reference, name=name, email=f"{name}@ex.test"
        )

    return action


def test_recreate_racing_recreate__tombstone_exactly_one_wins(postgres_only: None) -> None:
    customer = Customer.objects.create(reference="K-1", name="Zero", email="z@ex.test")
    customer.delete()
    for n in range(50):
        before = Customer.all_objects.get(pk=customer.pk)
        assert before.is_tombstone

        results = run_together(recreate("K-1", "first"), recreate("K-1", "second"))

        winners = [r for r in results if isinstance(r, Customer)]
        losers = [r for r in results if isinstance(r, AlreadyLive)]
        assert (len(winners), len(losers)) == (1, 1), f"round {n}: {results!r}"
        stored = Customer.all_objects.get(reference="K-1")
        assert stored.pk == customer.pk
        assert stored.generation == before.generation + 1, f"round {n}"
        assert (stored.version, stored.deleted_at) == (1, None)
        assert stored.name == winners[0].name
        assert winners[0].generation == stored.generation
        assert Customer.all_objects.filter(reference="K-1").count() == 1
        stored.delete()

    assert Customer.all_objects.get(pk=customer.pk).generation == 51


def test_recreate_racing_recreate__new_key_exactly_one_row(postgres_only: None) -> None:
    for n in range(50):
        key = f"N-{n}"

        results = run_together(recreate(key, "first"), recreate(key, "second"))

        winners = [r for r in results if isinstance(r, Customer)]
        losers = [r for r in results if isinstance(r, AlreadyLive)]
        assert (len(winners), len(losers)) == (1, 1), f"round {n}: {results!r}"
        rows = list(Customer.all_objects.filter(reference=key))
        assert len(rows) == 1
        assert (rows[0].pk, rows[0].generation, rows[0].version) == (winners[0].pk, 1, 1)
        assert rows[0].deleted_at is None
        assert rows[0].name == winners[0].name


def test_delete_racing_delete__exactly_one_counts(postgres_only: None) -> None:
    for n in range(50):
        customer = Customer.objects.create(reference=f"D-{n}", name="A", email="a@ex.test")
        other = Customer.objects.get(pk=customer.pk)

        results = run_together(customer.delete, other.delete)

        assert sorted(r[0] for r in results) == [0, 1], f"round {n}: {results!r}"
        stored = Customer.all_objects.get(pk=customer.pk)
        assert (stored.deleted_at is not None, stored.version) == (True, 2), f"round {n}"


def test_delete_racing_recreate__delete_always_completes(postgres_only: None) -> None:
    outcomes = {"revived": 0, "already_live": 0}
    for n in range(200):
        customer = Customer.objects.create(reference=f"X-{n}", name="A", email="a@ex.test")

        deleted, recreated = run_together(customer.delete, recreate(f"X-{n}", "again"))

        assert deleted == (1, {"customers.Customer": 1}), f"round {n}: {deleted!r}"
        assert customer.is_tombstone
        assert customer.version == 2
        stored = Customer.all_objects.get(pk=customer.pk)
        if isinstance(recreated, AlreadyLive):
            # The recreate read the row before the delete: the row stays a generation-1 tombstone.
            assert (stored.generation, stored.is_tombstone) == (1, True), f"round {n}"
            outcomes["already_live"] += 1
        else:
            assert isinstance(recreated, Customer), f"round {n}: {recreated!r}"
            assert (stored.generation, stored.version, stored.deleted_at) == (2, 1, None)
            outcomes["revived"] += 1
    assert sum(outcomes.values()) == 200
