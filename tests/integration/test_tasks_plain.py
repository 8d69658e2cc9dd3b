"""Plain tasks: a task call that passes no record is a job for none (no fence, a lane of its
own) on the same engine. Run in process by the production worker against the real database;
on a real cluster: tests/acceptance/test_tasks_cluster.py."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from project.customers.models import Customer
from tests import tasks
from tests.factories import SheetRowFactory
from tests.jobkit import events, job_of, run, temp_handler
from tombstones.exceptions import InvalidOrderingKey, InvalidParams, MissingFence, UnfencedTask
from tombstones.jobs import ledger
from tombstones.jobs.enqueue import enqueue, enqueue_plain
from tombstones.models import Job, JobEvent
from tombstones.tasks.compat import TaskResultStatus

pytestmark = [pytest.mark.tasks, pytest.mark.django_db, pytest.mark.usefixtures("tasks_forgotten")]

SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


@pytest.fixture
def customer() -> Customer:
    return SheetRowFactory().customer  # type: ignore[no-any-return]


def finish(result: Any) -> Any:
    run(job_of(result))
    return tasks.digest.get_backend().get_result(result.id)


def test_plain__a_call_without_a_record_is_a_job_for_none() -> None:
    result = tasks.digest.enqueue(7, period="day")
    job = job_of(result)
    assert job.is_plain
    assert (job.content_type_id, job.object_id, job.generation, job.version) == (
        None,
        "",
        None,
        None,
    )
    assert job.lane.startswith("plain:")
    assert (result.args, result.kwargs) == ([7], {"period": "day"})
    done = finish(result)
    assert done.status == SUCCESSFUL
    assert done.return_value == {"sent_to": 7, "period": "day"}
    assert tasks.seen == [{"user_id": 7, "period": "day"}]
    # A first-claim success keeps its trail in its row, as a fenced one does (no check event:
    # there is no record to check).
    assert not JobEvent.objects.filter(job_id=job.pk).exists()
    assert events(job) == ["enqueued", "claimed", "succeeded"]


def test_plain__a_task_without_arguments_runs() -> None:
    done = finish(tasks.ping.enqueue())
    assert (done.status, done.return_value, done.args) == (SUCCESSFUL, "pong", [])


def test_plain__each_job_has_a_lane_of_its_own_and_no_lane_row() -> None:
    """Nothing waits on a plain job: its lane is its own, and no enqueue locks it."""
    from tombstones.jobs.models import Lane

    jobs = [job_of(tasks.digest.enqueue(n)) for n in range(3)]
    assert len({job.lane for job in jobs}) == 3
    assert not Lane.objects.filter(key__in=[job.lane for job in jobs]).exists()
    taken = ledger.claim(10)  # each a lane head: one claim runs all three at once
    assert taken is not None
    assert sorted(j.pk for j in taken.jobs) == sorted(j.pk for j in jobs)
    running = Job.objects.filter(pk__in=[j.pk for j in jobs], status="running")
    assert running.count() == 3


def test_plain__its_context_has_no_record_and_no_fenced_write() -> None:
    done = finish(tasks.plain_context.enqueue(1))
    assert done.status == SUCCESSFUL
    assert tasks.seen[0]["record"] is None
    failed = finish(tasks.plain_context.enqueue(-1))
    assert failed.status == FAILED
    assert failed.errors[-1].exception_class_path == "tombstones.exceptions.NoRecord"


def test_plain__a_fenced_task_called_with_a_pk_is_refused(customer: Customer) -> None:
    """A parameter typed as a TombstoneModel, or a fence named, makes a task fenced: its pk
    passed by mistake is a TypeError, never a plain job."""
    with pytest.raises(UnfencedTask, match="fenced on 'customer'"):
        tasks.touch.enqueue(customer.pk)
    with pytest.raises(UnfencedTask, match="fenced on its argument 'customer'"):
        tasks.fenced_by_name.enqueue(customer.pk)
    with pytest.raises(TypeError):
        tasks.touch.enqueue(customer.pk)
    assert not Job.objects.exists()
    # With its record it is fenced, as ever.
    assert not job_of(tasks.fenced_by_name.enqueue(customer)).is_plain


def test_plain__an_email_address_in_its_arguments_is_refused() -> None:
    """A plain job has no record to compare its arguments with: an address is refused by its
    shape, named as such, never shown."""
    with pytest.raises(InvalidParams) as info:
        tasks.digest.enqueue(7, period="to ada.lovelace@example.org")
    assert "ada.lovelace" not in str(info.value)
    assert info.value.field == "e-mail address"
    assert isinstance(info.value, TypeError)
    assert not Job.objects.exists()
    assert finish(tasks.digest.enqueue(7, period="week@noon")).status == SUCCESSFUL


def test_plain__a_plain_row_of_a_handler_that_needs_a_record_is_escalated() -> None:
    """A job for no record written by hand for a record's handler: escalated, never run."""
    ran: list[Any] = []
    with temp_handler("tests.needs_record", ran.append):
        with pytest.raises(MissingFence, match="acts on a record"):
            enqueue_plain("tests.needs_record")
        job = Job.objects.create(handler="tests.needs_record", lane="plain:by-hand")
        assert job.is_plain
        run(job)
    assert (job.status, job.reason) == ("escalated", "missing_fence")
    assert ran == []


def test_plain__its_lane_prefix_is_no_ordering_key(customer: Customer) -> None:
    with pytest.raises(InvalidOrderingKey, match="plain:"):
        enqueue(tasks.touch.handler_name, customer, ordering_key="plain:mine")


def test_plain__external_sent_once_and_uncertain_kept_for_staff() -> None:
    done = finish(tasks.plain_call_out.enqueue(1))
    assert done.status == SUCCESSFUL
    assert tasks.seen[0]["sending"] is not None  # committed before the call
    job = job_of(tasks.plain_call_out.enqueue(-1))
    run(job)
    assert (job.status, job.reason) == ("uncertain", "outcome_unknown")
    assert job.params["args"] == [-1]  # kept: staff may resend it once
    trail = events(job)
    assert trail[-2:] == ["sending", "uncertain"]  # never "sent": the call's end is unknown
    from tombstones.jobs import staff_actions

    assert staff_actions.resolve_resend(job, "uncertain")
    job.refresh_from_db()
    assert job.status == "queued"


def test_plain__a_records_tombstone_leaves_plain_jobs_alone(customer: Customer) -> None:
    plain = job_of(tasks.digest.enqueue(customer.pk))
    customer.delete()
    plain.refresh_from_db()
    assert plain.params["args"] == [customer.pk]
    assert finish(tasks.digest.enqueue(1)).status == SUCCESSFUL


def test_plain__retention_removes_it_with_its_return_value() -> None:
    from django.core.management import call_command

    job = job_of(tasks.ping.enqueue())
    run(job)
    Job.objects.filter(pk=job.pk).update(finished_at="2000-01-01T00:00:00Z")
    call_command("purge_jobs", "--noinput", stdout=StringIO())
    assert not Job.objects.filter(pk=job.pk).exists()


def test_plain__the_admin_says_so(client: Client) -> None:
    staff = User.objects.create_superuser("staff", password="pw")
    client.force_login(staff)
    job = job_of(tasks.digest.enqueue(3))
    listing = client.get(reverse("admin:tombstones_job_changelist")).content.decode()
    assert "none: a plain task" in listing
    page = client.get(reverse("admin:tombstones_job_change", args=(job.pk,)))
    assert page.status_code == 200
    assert "none: a plain task" in page.content.decode()
    assert 'id="job-timeline"' not in page.content.decode()
    run(job)
    assert client.get(reverse("admin:tombstones_job_change", args=(job.pk,))).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_sync_mode__an_enqueue_outside_a_transaction_returns_the_run() -> None:
    """django-q2's sync mode (the suite's) runs a job at its enqueue's commit, in the caller:
    the result returned is the run's, as Django's immediate backend returns it."""
    from django.db import transaction

    done = tasks.ping.enqueue()
    assert (done.status, done.return_value) == (SUCCESSFUL, "pong")
    assert done.finished_at is not None
    with transaction.atomic():
        waiting = tasks.ping.enqueue()
        assert waiting.status == TaskResultStatus.READY  # runs at the commit, after this
    waiting.refresh()
    assert waiting.status == SUCCESSFUL


def test_plain__a_worker_lost_during_its_call_leaves_it_uncertain_with_its_arguments() -> None:
    """The sweep's take-back of an external plain job whose worker died after 'sending': it
    is uncertain, and keeps its arguments for staff to resend once (no record to outlive)."""
    from datetime import timedelta

    from django.db.models import Q
    from django.db.models.functions import Now

    from tombstones.jobs.engine.sweep import sweep

    job = job_of(tasks.plain_call_out.enqueue(5))
    taken = ledger.claim(1)
    assert taken is not None
    assert [j.pk for j in taken.jobs] == [job.pk]
    assert ledger.mark_sending(taken, taken.jobs[0], Q())
    Job.objects.filter(pk=job.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    assert sweep(dispatch=False)["uncertain"] == 1
    job.refresh_from_db()
    assert (job.status, job.reason) == ("uncertain", "outcome_unknown")
    assert job.params["args"] == [5]
