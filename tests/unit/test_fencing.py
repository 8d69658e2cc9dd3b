"""The fence as a value (tombstones.records.fencing.Fence): one spelling of "this row, at this
generation and version, not deleted", for the ORM's filters and the hand-written UPDATE alike.

No database: the querysets are compiled, never run.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import Q

from project.customers.models import Customer
from tombstones.exceptions import GenerationChanged, RecordDeleted, RecordMissing, StaleVersion
from tombstones.records import fencing
from tombstones.records.fencing import Fence, Observation, State


def test_fence__its_lookups_are_generation_version_and_not_deleted() -> None:
    fence = Fence(Customer, 3, 2, 5)
    assert fence.lookups() == {"generation": 2, "version": 5, "deleted_at__isnull": True}
    # A handler that runs on tombstones: its generation and version only.
    assert fence.lookups(live=False) == {"generation": 2, "version": 5}
    assert fence.q() == Q(pk=3, generation=2, version=5, deleted_at__isnull=True)


def test_fence__without_a_version_it_expects_the_generation_only() -> None:
    fence = Fence(Customer, 3, 2)
    assert fence.lookups() == {"generation": 2, "deleted_at__isnull": True}
    assert fence.q(live=False) == Q(pk=3, generation=2)


def test_fence__of_a_record_takes_its_model_pk_and_fence_as_read() -> None:
    record = Customer(pk=9, generation=4, version=7)
    assert Fence.of(record) == Fence(Customer, 9, 4, 7)
    with pytest.raises(AttributeError):
        Fence.of(record).version = 8  # type: ignore[misc]  # a value: frozen


def test_fence__its_rows_are_filtered_on_exactly_its_lookups() -> None:
    sql = str(Fence(Customer, 3, 2, 5).rows("default").query).split(" WHERE ")[1]
    for column in ('"generation" = 2', '"version" = 5', '"deleted_at" IS NULL'):
        assert column in sql
    dead_too = str(Fence(Customer, 3, 2, 5).rows("default", live=False).query)
    assert "deleted_at" not in dead_too.split(" WHERE ")[1]


def test_fence__the_hand_written_update_carries_the_same_fence() -> None:
    fence = Fence(Customer, 3, 2, 5)
    found = fencing._plain_update(fence, "default", {"name": "N"})
    assert found is not None
    sql, params = found
    qn = connection.ops.quote_name
    where = sql.split(" WHERE ")[1]
    assert where == (
        f"{qn('id')} = %s AND {qn('generation')} = %s AND {qn('version')} = %s"
        f" AND {qn('deleted_at')} IS NULL"
    )
    assert params[-3:] == [3, 2, 5]


def test_fence__a_stale_observation_keeps_what_was_expected() -> None:
    assert Fence(Customer, 3, 2, 5).stale() == Observation(State.STALE, 2, 5)


@pytest.mark.parametrize(
    ("state", "error"),
    [
        (State.TOMBSTONE, RecordDeleted),
        (State.GENERATION_CHANGED, GenerationChanged),
        (State.MISSING, RecordMissing),
        (State.STALE, StaleVersion),
    ],
)
def test_fence__a_conflict_names_what_was_expected_and_found(state: State, error: Any) -> None:
    seen = Observation(state, 3, 9, deleted=state == State.TOMBSTONE)
    raised = fencing.conflict_error(Fence(Customer, 3, 2, 5), seen)
    assert isinstance(raised, error)
    assert (raised.model, raised.pk) == ("customers.Customer", 3)
    assert (raised.expected_generation, raised.found_generation) == (2, 3)
    assert (raised.expected_version, raised.found_version) == (5, 9)
