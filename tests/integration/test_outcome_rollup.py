"""The outcome roll-up: every finished job counted once per outcome, by a trigger, in the
transaction that finishes it; folds that never lose or double a count; a migration that counts
the ledger it finds (issue 35)."""

from __future__ import annotations

import importlib
import sqlite3
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.utils import timezone

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import rollup_counts, run, run_together, succeeded
from tombstones.jobs import staff_actions
from tombstones.jobs.engine.sweep import sweep
from tombstones.jobs.ledger import rollup
from tombstones.jobs.models import OutcomeRollup
from tombstones.models import Job

pytestmark = pytest.mark.django_db

HANDLER = "customers.update_sheet_row"
Status = Job.Status
Reason = Job.Reason

migration = importlib.import_module("tombstones.migrations.0016_outcome_rollup_of_every_job")


def _finish(status: str, reason: str = "", at: Any = None) -> Job:
    """A job the way a staff action or the sweep writes an outcome: ``finished_at`` set on an
    unfinished row (written here, not enqueued: a transactional test's enqueue runs its job)."""
    job = Job.objects.create(
        handler=HANDLER,
        content_type=ContentType.objects.get_for_model(Customer),
        object_id="1",
        lane="customers.customer:1",
        generation=1,
        version=1,
        status=Status.QUEUED,
    )
    Job.objects.filter(pk=job.pk).update(
        status=status, reason=reason, finished_at=at or timezone.now()
    )
    job.refresh_from_db()
    return job


def test_rollup__counts_each_outcome_the_engine_writes_in_its_quarter_hour() -> None:
    customers = CustomerFactory.create_batch(3)
    jobs = [tombstones.enqueue(HANDLER, c) for c in customers]
    Customer.objects.filter(pk=customers[0].pk).delete()  # a tombstone: its job is rejected
    assert not OutcomeRollup.objects.exists()  # queued jobs count nothing

    ran = [run(job) for job in jobs]

    assert [j.status for j in ran] == [Status.REJECTED, Status.SUCCEEDED, Status.SUCCEEDED]
    expected: dict[tuple[Any, str, str], int] = {}
    for job in ran:
        assert job.finished_at is not None
        key = (rollup.period_of(job.finished_at), job.status, job.reason)
        expected[key] = expected.get(key, 0) + 1
    assert rollup_counts() == expected
    assert rollup.totals() == {
        (Status.REJECTED, Reason.SOURCE_DELETED): 1,
        (Status.SUCCEEDED, ""): 2,
    }


def test_rollup__a_resolution_counts_a_second_outcome_and_a_hand_edit_none() -> None:
    job = _finish(Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN)
    assert rollup.totals() == {(Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN): 1}

    # A finish time edited by hand moves no count.
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=3))
    assert rollup.totals() == {(Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN): 1}
    # Staff resolve it as delivered: a second outcome, counted; the first stays.
    assert staff_actions.resolve_delivered(job, Status.UNCERTAIN)
    assert rollup.totals() == {
        (Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN): 1,
        (Status.SUCCEEDED, ""): 1,
    }
    # Requeued and finished again: counted again.
    Job.objects.filter(pk=job.pk).update(status=Status.QUEUED, finished_at=None)
    Job.objects.filter(pk=job.pk).update(status=Status.FAILED, finished_at=timezone.now())
    assert rollup.totals()[Status.FAILED, ""] == 1


def test_rollup__the_sweep_folds_each_key_into_one_row() -> None:
    at = timezone.now().replace(minute=1)
    for _ in range(5):
        _finish(Status.SUCCEEDED, at=at)
    _finish(Status.FAILED, Reason.HANDLER_ERROR, at=at)
    before = rollup_counts()
    assert OutcomeRollup.objects.count() == 6  # a row per job until folded

    counts = sweep(dispatch=False)

    assert counts["folded"] == 4
    assert OutcomeRollup.objects.count() == 2
    assert rollup_counts() == before
    # New rows beside the folded one add to it, folded or not.
    _finish(Status.SUCCEEDED, at=at)
    assert rollup_counts()[rollup.period_of(at), Status.SUCCEEDED, ""] == 6
    assert rollup.fold() == 1
    assert rollup_counts()[rollup.period_of(at), Status.SUCCEEDED, ""] == 6


@pytest.mark.django_db(transaction=True)
def test_rollup__folds_at_once_and_jobs_finishing_meanwhile_count_each_job_once() -> None:
    """Two folds on their own connections, released together by a barrier, while a third
    connection finishes jobs: nothing lost, nothing counted twice. Repeated."""
    now = timezone.now()
    finished = 0
    for round_ in range(6):
        for i in range(30):  # rows of several keys to fold
            _finish(Status.SUCCEEDED, at=now - timedelta(minutes=15 * (i % 4)))
        finished += 30

        def finish_more() -> int:
            for _ in range(10):
                _finish(Status.REJECTED, Reason.SOURCE_DELETED)
            return 10

        results = succeeded(run_together(rollup.fold, rollup.fold, finish_more))
        finished += results[2]
        total = sum(n for n in rollup.totals().values())
        assert total == finished, f"round {round_}"
    rollup.fold()
    assert sum(rollup.totals().values()) == finished
    assert OutcomeRollup.objects.count() == len(rollup_counts())  # folded: one row per key


def test_rollup__counting_comes_back_after_a_migrate_that_lost_the_triggers() -> None:
    """SQLite rebuilds a table without its triggers when a migration alters a column: the
    post_migrate receiver installs them again."""
    rollup.uninstall()
    _finish(Status.SUCCEEDED)
    assert not OutcomeRollup.objects.exists()  # without the triggers nothing counts

    rollup.after_migrate(using="default")
    rollup.after_migrate(using="default")  # idempotent

    _finish(Status.SUCCEEDED)
    assert rollup.totals() == {(Status.SUCCEEDED, ""): 1}


def test_rollup__the_migration_counts_the_ledger_it_finds_once() -> None:
    """The jobs finished before the triggers existed are counted by the migration, beside the
    purged jobs the roll-up already held; later finishes by the triggers. Each once."""
    rollup.uninstall()
    old = timezone.now() - timedelta(days=2)
    for _ in range(3):
        _finish(Status.SUCCEEDED, at=old)
    _finish(Status.FAILED, Reason.HANDLER_ERROR, at=old)
    tombstones.enqueue(HANDLER, CustomerFactory())  # unfinished: not counted
    purged = OutcomeRollup.objects.create(
        period=rollup.period_of(old - timedelta(days=20)), status=Status.SUCCEEDED, jobs=7
    )

    # The migration's function reads only its editor's connection (SQLite's schema editor
    # cannot open inside the test's transaction).
    migration.count_every_job(None, SimpleNamespace(connection=connection))

    assert rollup_counts() == {
        (purged.period, Status.SUCCEEDED, ""): 7,
        (rollup.period_of(old), Status.SUCCEEDED, ""): 3,
        (rollup.period_of(old), Status.FAILED, Reason.HANDLER_ERROR): 1,
    }
    _finish(Status.SUCCEEDED, at=old)
    assert rollup.totals() == {(Status.SUCCEEDED, ""): 11, (Status.FAILED, Reason.HANDLER_ERROR): 1}


def test_rollup__a_fold_of_more_rows_than_a_statement_may_name() -> None:
    """A minute of a busy cluster leaves tens of thousands of rows; SQLite caps a statement at
    32,766 parameters (its default since 3.32; Debian's build allows 250,000, so the test sets
    the default): the fold takes them all, in one transaction."""
    at = rollup.period_of(timezone.now())
    OutcomeRollup.objects.bulk_create(
        OutcomeRollup(period=at, status=Status.SUCCEEDED, jobs=1) for _ in range(40_000)
    )
    raw, cap = connection.connection, None
    if connection.vendor == "sqlite":
        cap = raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766)  # returns the old cap
    try:
        assert rollup.fold() == 39_999
    finally:
        if cap is not None:
            raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, cap)

    assert list(OutcomeRollup.objects.values_list("period", "status", "jobs")) == [
        (at, Status.SUCCEEDED, 40_000)
    ]
