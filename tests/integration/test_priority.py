"""Priorities: among due lanes a claim looks first at those with a job of a higher priority; a
lane's own order never changes. Through the production claim, on the real database."""

from __future__ import annotations

from typing import Any

import pytest

import tombstones
from project.customers.models import Customer
from tests import tasks
from tests.factories import SheetRowFactory
from tests.jobkit import job_of
from tombstones.exceptions import InvalidPriority
from tombstones.jobs import ledger
from tombstones.models import Job
from tombstones.tasks.compat import InvalidTask

pytestmark = [pytest.mark.tasks, pytest.mark.django_db]


def taken(size: int) -> list[int]:
    claim = ledger.claim(size)
    assert claim is not None
    return [job.pk for job in claim.jobs]


def test_priority__a_due_job_of_a_higher_priority_is_taken_before_the_backlog() -> None:
    backlog = [job_of(tasks.ping.enqueue()) for _ in range(40)]
    urgent = job_of(tasks.ping.using(priority=10).enqueue())
    higher = job_of(tasks.ping.using(priority=90).enqueue())
    assert (urgent.priority, higher.priority) == (10, 90)
    assert taken(1) == [higher.pk]
    assert taken(1) == [urgent.pk]
    assert taken(1) == [backlog[0].pk]  # then the others, in the order they came due


def test_priority__never_reorders_a_records_lane() -> None:
    customer: Customer = SheetRowFactory().customer
    [job_of(tasks.ping.enqueue()) for _ in range(5)]  # older lanes, due first otherwise
    first = tombstones.enqueue("customers.update_sheet_row", customer)
    second = tombstones.enqueue("customers.update_sheet_row", customer, priority=50)
    # The lane is looked at first for its priority job, and gives its head: its first job.
    assert taken(1) == [first.pk]
    second.refresh_from_db()
    assert second.status == "queued"


def test_priority__below_zero_yields_to_the_lanes_a_look_reads() -> None:
    low = job_of(tasks.ping.using(priority=-5).enqueue())
    normal = job_of(tasks.ping.enqueue())
    assert taken(1) == [normal.pk]
    assert taken(1) == [low.pk]


@pytest.mark.parametrize("priority", [101, -101, True, 1.5, "1"])
def test_priority__out_of_range_or_not_an_int_is_refused(priority: Any) -> None:
    customer = SheetRowFactory().customer
    with pytest.raises(InvalidPriority):
        tombstones.enqueue("customers.update_sheet_row", customer, priority=priority)
    with pytest.raises(ValueError, match="priority"):
        tombstones.enqueue_many("customers.update_sheet_row", [customer], priority=priority)
    assert not Job.objects.exists()


def test_priority__djangos_range_is_checked_at_the_task() -> None:
    with pytest.raises(InvalidTask):
        tasks.ping.using(priority=101)
    result = tasks.digest.using(priority=-100).enqueue(1)
    assert job_of(result).priority == -100
    assert result.task.priority == -100
