"""The seed's proposed acceptance tests, automated against the real database and worker phases."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import tombstones
from project.customers.models import Customer, SheetRow
from tests.factories import SheetRowFactory
from tombstones.jobs.engine import steps
from tombstones.models import Job, JobEvent


def _in_other_connection(action: Any) -> None:
    """Run ``action`` in a second thread: its own database connection, committed on return."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            with transaction.atomic():
                action()
        except Exception as exc:  # noqa: BLE001 - handed to the test thread and re-raised
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the second connection hung"
    if errors:
        raise errors[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("_round", range(5))
def test_seed__delete_committed_between_check_and_write_makes_the_write_fail(
    _round: int, settings: Any
) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}  # the wake goes to the ORM broker; no cluster runs here
    row = SheetRowFactory()
    customer = row.customer
    with transaction.atomic():
        job = tombstones.enqueue("customers.update_sheet_row", customer)
    # The worker's phases, driven by hand so the deletion lands between check and write.
    attempt = steps.claim(job.pk)
    assert attempt is not None
    assert steps.check(attempt) is None  # passed the check: the record was live
    _in_other_connection(lambda: Customer.objects.get(pk=customer.pk).delete())
    outcome = steps.act(attempt)
    assert (outcome.status, outcome.reason) == ("rejected", "source_deleted")
    row.refresh_from_db()
    assert row.synced_version is None
    assert row.name_hash == ""
    assert Customer.all_objects.get(pk=customer.pk).synced_at is None


@pytest.mark.django_db(transaction=True)
def test_seed__rejected_job_leaves_reason_id_and_timestamp_without_personal_content() -> None:
    row = SheetRowFactory(customer__name="Unique Seedname", customer__email="seed-91@pii.test")
    with transaction.atomic():
        job = tombstones.enqueue("customers.update_sheet_row", row.customer)
        row.customer.delete()
    job.refresh_from_db()
    event = JobEvent.objects.get(job=job, event="rejected")
    assert (event.reason, event.job_id, event.object_id) == (
        "source_deleted",
        job.pk,
        str(row.customer.pk),
    )
    assert event.created_at is not None
    assert job.finished_at is not None
    text = str(list(JobEvent.objects.filter(job=job).values())) + str(
        Job.objects.filter(pk=job.pk).values()
    )
    assert "Unique Seedname" not in text
    assert "seed-91@pii.test" not in text


@pytest.mark.django_db
def test_seed__retention_must_exceed_the_longest_queue_wait(settings: Any) -> None:
    from datetime import timedelta

    from tombstones.jobs.checks import check_settings

    settings.TOMBSTONES_RETENTION = timedelta(days=7)
    settings.TOMBSTONES_JOB_MAX_AGE = timedelta(days=7)
    assert [e.id for e in check_settings()] == ["tombstones.E010"]
    settings.TOMBSTONES_RETENTION = timedelta(days=8)
    assert check_settings() == []


# --- random interleavings --------------------------------------------------------------------


class Interleavings(RuleBasedStateMachine):
    """enqueue / delete / recreate / update / start / write in any order, on one record.

    The handler stamps every write with the job's generation; a write is checked against the
    record's state at the moment it was made.
    """

    def __init__(self) -> None:
        super().__init__()
        self.row = SheetRowFactory()
        self.pk = self.row.customer.pk
        self.reference = self.row.customer.reference
        self.jobs: list[int] = []
        self.started: dict[int, steps.Attempt] = {}
        self.last_stamp = ""

    def _record(self) -> Customer:
        return Customer.all_objects.get(pk=self.pk)

    @rule()
    def enqueue(self) -> None:
        record = self._record()
        if not record.is_tombstone:
            self.jobs.append(tombstones.enqueue("customers.update_sheet_row", record).pk)

    @rule()
    def delete(self) -> None:
        self._record().delete()

    @rule()
    def recreate(self) -> None:
        if self._record().is_tombstone:
            Customer.all_objects.recreate(reference=self.reference, name="n", email="e@x.test")

    @rule()
    def update(self) -> None:
        Customer.objects.filter(pk=self.pk).update(phone="+9")

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        if not self.jobs:
            return
        job_id = data.draw(st.sampled_from(self.jobs))
        attempt = steps.claim(job_id)
        if attempt is not None and steps.check(attempt) is None:
            self.started[job_id] = attempt

    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        if not self.started:
            return
        job_id = data.draw(st.sampled_from(sorted(self.started)))
        attempt = self.started.pop(job_id)
        before = self._record()
        outcome = steps.act(attempt)
        after = self._record()
        job = Job.objects.get(pk=job_id)
        if outcome.status == "succeeded":
            # It wrote: the record was live at the job's generation when it did.
            assert not before.is_tombstone
            assert before.generation == job.generation == after.generation
            assert after.version > before.version
        else:
            assert (after.generation, after.version) == (before.generation, before.version)

    @invariant()
    def no_write_to_a_tombstone_or_another_generation(self) -> None:
        record = self._record()
        row = SheetRow.all_objects.get(pk=self.row.pk)
        if row.name_hash != self.last_stamp and record.is_tombstone:
            raise AssertionError("a sheet row changed while its customer was a tombstone")
        self.last_stamp = row.name_hash

    @invariant()
    def every_finished_job_has_exactly_one_outcome(self) -> None:
        terminal = {"succeeded", "rejected", "failed", "escalated", "expired", "uncertain"}
        for job in Job.objects.filter(status__in=terminal):
            # Stored, or kept in its row by a plain success (Job.history reads both).
            outcomes = sum(e.event in terminal for e in job.history())
            assert outcomes == 1, f"job {job.pk} has {outcomes} outcomes"


@pytest.mark.django_db
def test_seed__random_interleavings_never_write_to_a_tombstone_or_another_generation() -> None:
    # In a test transaction on_commit never fires: jobs move only when a rule drives them.
    run_state_machine_as_test(
        Interleavings,
        settings=settings_for_machine(),
    )


def settings_for_machine() -> Any:
    return settings(
        max_examples=40,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
