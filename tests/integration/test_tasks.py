"""Django's tasks framework through TombstoneBackend, in process: the production worker runs the
jobs (tombstones.worker.run) against the real database. The real cluster: tests/acceptance."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction

from project.customers.models import Customer, SheetRow
from tests import tasks
from tests.factories import SheetRowFactory
from tests.jobkit import caught, job_of, run
from tombstones.exceptions import InvalidParams, RecordDeleted, UnfencedTask, UnknownQueue
from tombstones.jobs import registry
from tombstones.models import Job
from tombstones.tasks import TombstoneBackend, TombstoneTask, fenced_task
from tombstones.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)
from tombstones.testing import RaceFixture

pytestmark = [pytest.mark.tasks, pytest.mark.django_db, pytest.mark.usefixtures("tasks_forgotten")]

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED
PLANTED = "Zebediah Quarrington-Vole"


@pytest.fixture
def customer() -> Customer:
    row = SheetRowFactory(customer__name=PLANTED, customer__email="zebediah@vole.test")
    return row.customer  # type: ignore[no-any-return]


def finish(result: Any) -> Any:
    """Run the job with the production worker; the ledger's TaskResult after it."""
    run(job_of(result))
    return tasks.sync_sheet.get_backend().get_result(result.id)


# --- enqueue ------------------------------------------------------------------------------------


def test_enqueue__the_record_becomes_the_jobs_snapshot_in_its_lane(customer: Customer) -> None:
    result = tasks.sync_sheet.enqueue(customer, note="first")
    job = job_of(result)
    assert (job.handler, job.object_id) == ("task:tests.tasks.sync_sheet", str(customer.pk))
    assert (job.generation, job.version, job.status) == (1, customer.version, "queued")
    assert job.lane == f"customers.customer:{customer.pk}"
    assert result.status == READY
    assert result.id == str(job.pk)
    assert result.backend == "default"
    assert result.kwargs == {"note": "first"}
    assert result.args == [
        {"model": "customers.customer", "pk": str(customer.pk), "generation": 1, "version": 1}
    ]
    # The record is a snapshot: none of its field values is stored.
    stored = json.dumps(job.params)
    for value in (PLANTED, customer.email, customer.reference):
        assert value not in stored


def test_enqueue__rolled_back_with_the_request_leaves_no_job(customer: Customer) -> None:
    before = Job.objects.count()
    with transaction.atomic():
        tasks.sync_sheet.enqueue(customer)
        transaction.set_rollback(True)  # the request fails
    assert Job.objects.count() == before


def test_enqueue__task_enqueued_is_sent_once_the_transaction_commits(
    customer: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    got: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        got.append((sender, task_result.id))

    task_enqueued.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            result = tasks.touch.enqueue(customer)
            assert got == []  # not before the commit: a rollback would leave no job
    finally:
        task_enqueued.disconnect(receiver)
    assert got == [(TombstoneBackend, result.id)]


def _signals_seen() -> tuple[list[tuple[str, str]], Any]:
    """(signal, task id) of Django's three task signals as they arrive, and a disconnector."""
    got: list[tuple[str, str]] = []
    receivers = {}
    for name, signal in (
        ("enqueued", task_enqueued),
        ("started", task_started),
        ("finished", task_finished),
    ):

        def receiver(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            got.append((_name, task_result.id))

        receivers[signal] = receiver
        signal.connect(receiver)

    def disconnect() -> None:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)

    return got, disconnect


def _in_djangos_order(got: list[tuple[str, str]], ids: list[str]) -> None:
    for pk in ids:
        assert [name for name, of in got if of == pk] == ["enqueued", "started", "finished"], got
    # Every task of the transaction announced before any runs.
    enqueued = [n for n, (name, _) in enumerate(got) if name == "enqueued"]
    started = [n for n, (name, _) in enumerate(got) if name == "started"]
    assert max(enqueued) < min(started), got


def test_signals__in_djangos_order_when_the_transaction_commits(
    customer: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    """Sync mode runs the jobs once the request commits: task_enqueued first (it came after
    task_started and task_finished: the wake-up was registered before it)."""
    from tests.factories import CustomerFactory

    got, disconnect = _signals_seen()
    try:
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            first = tasks.touch.enqueue(customer)
            second = tasks.touch.enqueue(CustomerFactory())
            with transaction.atomic():  # a savepoint released into the request
                third = tasks.touch.enqueue(CustomerFactory())
    finally:
        disconnect()
    _in_djangos_order(got, [first.id, second.id, third.id])


@pytest.mark.django_db(transaction=True)
def test_signals__in_djangos_order_in_autocommit() -> None:
    """Outside a transaction (a command, a shell): the enqueue commits at once, and sync mode
    runs the job at once; task_enqueued still comes first."""
    from tests.factories import CustomerFactory

    got, disconnect = _signals_seen()
    try:
        done = tasks.touch.enqueue(CustomerFactory())
    finally:
        disconnect()
    _in_djangos_order(got, [done.id])
    assert job_of(done).status == "succeeded"


def test_signals__a_refused_enqueue_announces_nothing(
    customer: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    from tests.factories import CustomerFactory

    got, disconnect = _signals_seen()
    try:
        with django_capture_on_commit_callbacks(execute=True):
            gone = CustomerFactory()
            gone.delete()
            with pytest.raises(RecordDeleted):  # refused by the enqueue, past the encoding
                tasks.touch.enqueue(Customer.all_objects.get(pk=gone.pk))
            ok = tasks.touch.enqueue(customer)
    finally:
        disconnect()
    _in_djangos_order(got, [ok.id])
    assert len(got) == 3


# --- refusals -----------------------------------------------------------------------------------


def test_refused__a_call_of_a_fenced_task_without_its_record(customer: Customer) -> None:
    """Its parameter is typed as a TombstoneModel: a pk passed by mistake is refused, never run
    as a plain job (a task whose call passes no record: test_tasks_plain)."""
    with pytest.raises(UnfencedTask, match=r"fenced on 'customer'.*not its pk"):
        tasks.touch.enqueue(customer.pk)
    assert not Job.objects.exists()


def test_refused__two_records_without_a_fence_named(customer: Customer) -> None:
    other = SheetRowFactory().customer
    with pytest.raises(UnfencedTask, match=r"several records .*@task\(fence="):
        tasks.pair.enqueue(customer, other)


def test_refused__a_non_json_argument_is_named_never_shown(customer: Customer) -> None:
    from datetime import datetime

    with pytest.raises(InvalidParams) as info:
        tasks.sync_sheet.enqueue(customer, note=datetime(2031, 7, 9, 13, 37))
    message = str(info.value)
    assert "'note'" in message
    assert "datetime" in message
    assert "2031" not in message


def test_refused__a_personal_value_among_the_arguments(customer: Customer) -> None:
    with pytest.raises(InvalidParams) as info:
        tasks.sync_sheet.enqueue(customer, note=f"for {PLANTED}")
    assert info.value.field == "name"
    assert PLANTED not in str(info.value)
    assert not Job.objects.exists()


def test_refused__a_personal_value_of_another_record_argument(customer: Customer) -> None:
    row = SheetRow.objects.get(customer=customer)
    SheetRow.objects.filter(pk=row.pk).update(name_hash="f00dfeedcafe")
    row.refresh_from_db()
    with pytest.raises(InvalidParams) as info:
        tasks.link_row.enqueue(row, customer=customer, note="f00dfeedcafe")
    assert (info.value.field, info.value.model) == ("name_hash", "customers.SheetRow")


def test_refused__a_tombstone_as_tombstones_enqueue_refuses_it(customer: Customer) -> None:
    customer.delete()
    tombstone = Customer.all_objects.get(pk=customer.pk)
    with pytest.raises(RecordDeleted):
        tasks.sync_sheet.enqueue(tombstone)


def test_refused__a_model_that_is_not_a_tombstone_model(customer: Customer) -> None:
    from django.contrib.auth.models import Group

    group = Group.objects.create(name="g")
    with pytest.raises(InvalidParams, match=r"position 1 .*auth\.Group .*pass its pk"):
        tasks.pair.enqueue(customer, group)


def test_refused__every_argument_refusal_is_a_type_error_as_djangos_own(
    customer: Customer,
) -> None:
    """Django's own backends refuse an argument they cannot store with a TypeError: code written
    for them catches ours too."""
    from datetime import datetime

    from django.contrib.auth.models import Group

    group = Group.objects.create(name="g")
    calls = [
        lambda: tasks.sync_sheet.enqueue(customer, note=datetime(2031, 7, 9)),  # not JSON
        lambda: tasks.sync_sheet.enqueue(customer, note=f"for {PLANTED}"),  # a personal value
        lambda: tasks.pair.enqueue(customer, group),  # a model that is no TombstoneModel
        lambda: tasks.touch.enqueue(customer.pk),  # a fenced task without its record
    ]
    for call in calls:
        with pytest.raises(TypeError):
            call()
    assert not Job.objects.exists()


def _plain(customer: Customer) -> None:
    """A module-level function for the definition checks below."""


async def _coroutine(customer: Customer) -> None:
    """Async."""


@pytest.mark.parametrize(
    ("func", "options", "message"),
    [
        (_plain, {"fence": "nope"}, "fenced on 'nope', which is not one of"),
        (_plain, {"queue_name": "emails"}, "Queue 'emails'"),
    ],
)
def test_refused__at_definition(func: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidTask, match=message):
        fenced_task(**options)(func)


def test_async__an_async_task_runs_on_the_worker_in_its_jobs_transaction(
    customer: Customer,
) -> None:
    assert fenced_task(_coroutine).get_backend().supports_async_task is True
    done = finish(tasks.async_touch.enqueue(customer))
    assert done.status == SUCCESSFUL
    assert done.return_value == {"written": 1, "rows": 1}
    customer.refresh_from_db()
    assert (customer.phone, customer.version) == ("+4", 2)  # the fenced write, version + 1


def test_async__a_stale_record_is_read_again_and_the_task_awaited_again(
    customer: Customer,
) -> None:
    """The fence of an awaited write holds as a sync task's: the record moved between the check
    and the write, the write matched nothing, the record was read again, the task awaited again."""
    tasks.calls.clear()
    done = finish(tasks.async_bump_once.enqueue(customer))
    assert done.status == SUCCESSFUL
    assert len(tasks.calls) == 2  # the move rolled back with the lost write: read again at v1
    assert job_of(done).rereads == 1
    assert done.return_value == 1
    customer.refresh_from_db()
    assert (customer.phone, customer.version) == ("+5", 2)


def test_fenced_task__makes_the_same_task_on_every_django_version() -> None:
    made = fenced_task(fence="customer", external=True)(_plain)
    assert isinstance(made, TombstoneTask)
    assert (made.fence, made.external, made.handler_name) == (
        "customer",
        True,
        "task:tests.integration.test_tasks._plain",
    )
    assert registry.get_handler(made.handler_name).external is True


def test_check__runs_at_startup_without_any_task_imported() -> None:
    import subprocess
    import sys

    from django.conf import settings

    env = {**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "tests.tasks_check_settings"}
    out = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "tombstones.E031" in out.stderr + out.stdout


def test_check__queues_and_options_it_cannot_honour() -> None:
    backend = TombstoneBackend(
        alias="other", params={"QUEUES": ["default", "e/mails"], "OPTIONS": {"RETRIES": 3}}
    )
    assert [m.id for m in backend.check()] == ["tombstones.E031", "tombstones.E032"]
    assert TombstoneBackend(alias="x", params={"QUEUES": []}).check() == []
    assert TombstoneBackend(alias="default", params={}).check() == []
    named = TombstoneBackend(alias="default", params={"QUEUES": ["default", "emails"]})
    assert named.check() == []


def test_queues__a_task_of_a_named_queue_is_a_job_of_that_queue(
    customer: Customer, settings: Any
) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "tombstones.tasks.TombstoneBackend",
            "QUEUES": ["default", "emails"],
        }
    }
    mail = tasks.sync_sheet.using(queue_name="emails")
    result = mail.enqueue(customer)
    job = job_of(result)
    assert (job.queue, job.lane) == ("emails", f"queue:emails/customers.customer:{customer.pk}")
    assert result.task.queue_name == "emails"
    assert finish(result).status == SUCCESSFUL  # the worker here serves every queue
    plain = tasks.digest.using(queue_name="emails").enqueue(7, period="day")
    assert (job_of(plain).queue, finish(plain).status) == ("emails", SUCCESSFUL)
    with pytest.raises(InvalidTask, match="Queue 'reports'"):
        tasks.sync_sheet.using(queue_name="reports")
    # QUEUES = [] is "any queue" to Django: the queues tombstones knows of, no other.
    settings.TASKS = {"default": {"BACKEND": "tombstones.tasks.TombstoneBackend", "QUEUES": []}}
    anywhere = tasks.sync_sheet.using(queue_name="reports")  # Django does not validate it
    with pytest.raises(UnknownQueue, match="no queue 'reports'"):
        anywhere.enqueue(customer)
    assert Job.objects.filter(queue="reports").count() == 0


# --- running ------------------------------------------------------------------------------------


def test_run__the_task_gets_the_record_read_fresh_and_writes_through_the_fence(
    customer: Customer,
) -> None:
    result = tasks.sync_sheet.enqueue(customer, note="n")
    Customer.objects.filter(pk=customer.pk).update()  # version 2 before the job runs
    done = finish(result)
    assert done.status == SUCCESSFUL
    assert done.errors == []
    [seen] = tasks.seen
    assert seen["customer"] is seen["record"]  # the argument is the checked record
    assert seen["version"] == 2
    assert seen["note"] == "n"
    assert (seen["status"], seen["attempt"], seen["id"]) == (RUNNING, 1, result.id)
    assert SheetRow.objects.get(customer=customer).synced_version == 2
    fresh = Customer.objects.get(pk=customer.pk)
    assert fresh.synced_at is not None
    assert fresh.version == 3
    assert done.attempts == 1
    assert done.worker_ids
    assert done.worker_ids[0]
    assert done.started_at is not None
    assert done.finished_at is not None
    assert done.enqueued_at <= done.started_at <= done.finished_at


def test_run__a_worker_that_never_saw_the_task_imports_it_by_path(customer: Customer) -> None:
    result = tasks.touch.enqueue(customer)
    registry.unregister(tasks.touch.handler_name)  # a fresh worker process
    assert finish(result).status == SUCCESSFUL
    assert tasks.seen == [{"customer": tasks.seen[0]["customer"]}]


def test_run__a_task_path_nobody_can_import_waits_as_an_unknown_handler(customer: Customer) -> None:
    result = tasks.touch.enqueue(customer)
    Job.objects.filter(pk=result.id).update(handler="task:tests.tasks_gone.touch")
    job = run(job_of(result))
    assert (job.status, job.reason) == ("retry_wait", "handler_unknown")
    assert tasks.seen == []


def test_run__with_two_records_the_fence_is_the_one_named(customer: Customer) -> None:
    row = SheetRow.objects.get(customer=customer)
    result = tasks.link_row.enqueue(row, customer=customer)
    assert job_of(result).object_id == str(customer.pk)
    assert result.args == [{"model": "customers.sheetrow", "pk": str(row.pk)}]
    assert finish(result).status == SUCCESSFUL
    [seen] = tasks.seen
    assert seen["record"] is seen["customer"]
    assert seen["row"].pk == row.pk
    # Deleting the row (not the fence) does not reject; deleting the customer does.
    again = tasks.link_row.enqueue(row, customer=customer)
    customer.delete()
    assert finish(again).status == FAILED


def test_run__external_task_is_bracketed_and_gets_the_idempotency_key(customer: Customer) -> None:
    result = tasks.call_out.enqueue(customer)
    assert job_of(result).external
    assert finish(result).status == SUCCESSFUL
    [seen] = tasks.seen
    assert seen["key"] == job_of(result).idempotency_key
    assert seen["sending"] is not None  # marked sending (committed) before the call
    assert job_of(result).sent_at is not None


# --- outcomes as TaskResults --------------------------------------------------------------------


def test_result__a_job_from_before_a_delete_is_failed_never_successful(customer: Customer) -> None:
    result = tasks.sync_sheet.enqueue(customer)
    customer.delete()
    done = finish(result)
    assert done.status == FAILED
    [error] = done.errors
    assert error.exception_class is RecordDeleted
    assert "rejected: source_deleted" in error.traceback
    assert done.args == []  # the params of a job that did not succeed are erased
    assert tasks.seen == []
    with pytest.raises(ValueError, match="failed"):
        done.return_value  # noqa: B018


def test_result__a_recreated_record_rejects_the_old_generations_task(customer: Customer) -> None:
    from tombstones.exceptions import GenerationChanged

    old = tasks.sync_sheet.enqueue(customer)
    customer.delete()
    again = Customer.all_objects.recreate(reference=customer.reference, name="N", email="n@x.test")
    new = tasks.sync_sheet.enqueue(again)
    first, second = finish(old), finish(new)
    assert first.status == FAILED
    assert first.errors[0].exception_class is GenerationChanged
    assert second.status == SUCCESSFUL
    assert [s["customer"].generation for s in tasks.seen] == [2]


def test_result__a_task_that_raises_is_failed_with_the_class_it_raised(customer: Customer) -> None:
    done = finish(tasks.broken_personally.enqueue(customer))
    assert done.status == FAILED
    [error] = done.errors
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert "failed: handler_error" in error.traceback
    # Its frames, as Python prints them: file, line, function and source line, then the class.
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert 'tests/tasks.py", line ' in error.traceback
    assert ", in broken_personally\n" in error.traceback
    assert 'raise ValueError(f"a bug in the task for {secret}")' in error.traceback
    assert "\nbuiltins.ValueError\n" in error.traceback
    # Never the message, nor a frame's local values: either may hold personal data.
    assert PLANTED not in error.traceback
    assert "a bug in the task for Z" not in error.traceback
    assert PLANTED not in job_of(done).error_trace


def test_result__a_class_that_cannot_be_imported_reads_as_the_librarys(customer: Customer) -> None:
    from tombstones.exceptions import JobFailed

    done = finish(tasks.broken_locally.enqueue(customer))
    [error] = done.errors
    assert error.exception_class is JobFailed  # Django imports the class: this one cannot be
    assert "tests.tasks.broken_locally.<locals>.Local" in error.traceback


def test_result__a_success_after_a_retry_keeps_no_trace(customer: Customer) -> None:
    from tests.jobkit import make_due

    tasks.calls.clear()
    result = tasks.flaky_once.enqueue(customer)
    first = finish(result)
    job = job_of(result)
    assert job.status == "retry_wait"
    assert ", in flaky_once\n" in job.error_trace  # the last error, while it waits
    make_due(job)
    assert finish(result).status == SUCCESSFUL
    assert job_of(result).error_trace == ""
    assert first.errors == []


def test_return_value__kept_for_json_and_erased_with_the_records_tombstone(
    customer: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    with caught(task_finished) as finished:
        with django_capture_on_commit_callbacks(execute=True):
            done = finish(tasks.returns.enqueue(customer, "counts"))
        as_tuple = finish(tasks.returns.enqueue(customer, "tuple"))
    assert done.status == SUCCESSFUL
    assert done.return_value == {"rows": 2, "ids": [customer.pk]}
    assert [r.return_value for r in finished] == [done.return_value]  # the signal's too
    assert as_tuple.return_value == [1, "two"]  # JSON's list, as Django's own backends give it
    customer.refresh_from_db()
    assert customer.phone == "+2"
    Customer.objects.get(pk=customer.pk).delete()
    erased = tasks.returns.get_result(done.id)
    assert (erased.status, erased.return_value, erased.args) == (SUCCESSFUL, None, [])


def test_return_value__none_is_not_stored(customer: Customer) -> None:
    done = finish(tasks.returns.enqueue(customer, "none"))
    assert (done.status, done.return_value) == (SUCCESSFUL, None)
    assert "return" not in job_of(done).params


@pytest.mark.parametrize("kind", ["object", "personal"])
def test_return_value__refused_fails_the_task_and_rolls_its_writes_back(
    customer: Customer, kind: str
) -> None:
    from tombstones.exceptions import InvalidResult

    done = finish(tasks.returns.enqueue(customer, kind))
    assert done.status == FAILED
    [error] = done.errors
    assert error.exception_class is InvalidResult
    customer.refresh_from_db()
    assert customer.phone != "+2"  # the task's write went with it
    job = job_of(done)
    assert PLANTED not in json.dumps(job.params) + job.error_trace + error.traceback
    with pytest.raises(ValueError, match="failed"):
        done.return_value  # noqa: B018 - Django's property raises for a failed task


def test_result__an_uncertain_end_is_uncertain_whatever_its_reason() -> None:
    from tombstones.exceptions import OutcomeUncertain
    from tombstones.tasks.results import errors_of

    job = Job(pk=7, status="uncertain", reason="deleted_during_send", generation=1, version=1)
    [error] = errors_of(job)
    assert error.exception_class is OutcomeUncertain
    assert "uncertain: deleted_during_send" in error.traceback


def test_get_result__ids_that_are_no_task_of_this_backend(customer: Customer) -> None:
    import tombstones

    backend = tasks.touch.get_backend()
    plain = tombstones.enqueue("customers.update_sheet_row", customer)
    for unknown in ("999999", "abc", str(plain.pk), None):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(unknown)
    result = tasks.touch.enqueue(customer)
    from tombstones.tasks.compat import TaskResult

    assert isinstance(tasks.touch.get_result(result.id), TaskResult)
    with pytest.raises(Exception, match="Task does not match"):
        tasks.sync_sheet.get_result(result.id)


def test_signals__started_in_the_worker_finished_after_the_outcome_commits(
    customer: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    got: list[tuple[str, str]] = []
    results: list[tuple[str, Any]] = []

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        got.append(("started", task_result.status))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        got.append(("finished", task_result.status))
        results.append(("finished", task_result))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        ok = tasks.touch.enqueue(customer)
        with django_capture_on_commit_callbacks(execute=True):
            run(job_of(ok))
        rejected = tasks.touch.enqueue(customer)
        Customer.objects.get(pk=customer.pk).delete()
        with django_capture_on_commit_callbacks(execute=True):
            run(job_of(rejected))
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert got == [("started", RUNNING), ("finished", SUCCESSFUL), ("finished", FAILED)]
    # What task_finished carried is what get_result() reads: the row as the outcome left it.
    [ok_done, rejected_done] = [r for kind, r in results if kind == "finished"]
    assert ok_done.finished_at is not None
    assert rejected_done.args == []  # erased with the job's params
    assert "gNone" not in rejected_done.errors[0].traceback


def test_signals__started_once_per_claim_though_a_reread_calls_the_task_again(
    customer: Customer,
) -> None:
    tasks.calls.clear()
    with caught(task_started) as got:
        done = finish(tasks.bump_once.enqueue(customer))
    assert done.status == SUCCESSFUL
    assert len(tasks.calls) == 2  # the fence lost, the record read again, the task called again
    assert job_of(done).rereads == 1
    assert len(got) == 1
    assert got[0].started_at is not None
    assert got[0].worker_ids == done.worker_ids
    # While it ran, get_result() already showed it running on its worker.
    assert {s["live_status"] for s in tasks.seen} == {RUNNING}
    assert all(s["live_workers"] == done.worker_ids for s in tasks.seen)


# --- the race fixture through a task ------------------------------------------------------------


def test_race_fixture__the_four_cases_and_the_worked_example_through_a_task() -> None:
    from tests.factories import CustomerFactory

    report = RaceFixture(Customer, tasks.sync_sheet, make_record=CustomerFactory).run()
    assert report.ok, report.table()
    actual = {r.case.name: r.actual for r in report.results}
    assert actual["1"] == {"J": "rejected:source_deleted"}
    assert actual["3"] == {"J": "rejected:generation_changed"}
    assert actual["4"] == {"J": "reread"}
    assert actual["2"]["J"].startswith("rejected:")


# --- the demo -----------------------------------------------------------------------------------


def test_demo__the_customer_admin_queues_its_sheet_rows_task(
    customer: Customer, admin_client: Any
) -> None:
    from project.customers.tasks import refresh_sheet_rows

    response = admin_client.post(
        "/admin/customers/customer/",
        {"action": "refresh_sheet_rows", "_selected_action": [customer.pk]},
        follow=True,
    )
    assert response.status_code == 200
    job = Job.objects.get(handler=refresh_sheet_rows.handler_name)
    assert f"job {job.pk}" in response.content.decode()
    assert run(job).status == "succeeded"
    row = SheetRow.objects.get(customer=customer)
    assert row.synced_version == customer.version
    assert len(row.name_hash) == 16
    assert refresh_sheet_rows.get_result(str(job.pk)).status == SUCCESSFUL


def test_run_after__the_job_waits_until_it_is_due(customer: Customer) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from tests.jobkit import make_due

    later = timezone.now() + timedelta(hours=1)
    result = tasks.touch.using(run_after=later).enqueue(customer)
    job = job_of(result)
    assert job.run_after >= later - timedelta(seconds=1)
    assert run(job).status == "queued"  # not due: the worker leaves it
    assert tasks.seen == []
    make_due(job)
    assert finish(result).status == SUCCESSFUL
    assert len(tasks.seen) == 1


# --- the signals cost no query per job (issue 34) -----------------------------------------------


def test_signals__a_task_that_ran_costs_its_signals_no_query(
    customer: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    """task_started and task_finished of a task that ran at its first claim are built from the
    claim's row and the outcome's UPDATE: no SELECT of the job or its events per job; and what
    task_finished carries is what get_result() reads afterwards."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    result = tasks.touch.enqueue(customer)
    with caught(task_finished) as got:
        with (
            CaptureQueriesContext(connection) as ran,
            django_capture_on_commit_callbacks() as callbacks,
        ):
            run(job_of(result))
        with CaptureQueriesContext(connection) as sent:
            for callback in callbacks:
                callback()
    reads = [
        q["sql"] for q in ran if q["sql"].startswith("SELECT") and "tombstones_jobevent" in q["sql"]
    ]
    assert reads == []
    assert [q["sql"] for q in sent if "tombstones_job" in q["sql"]] == []
    [done] = got
    stored = tasks.touch.get_backend().get_result(result.id)
    fields = ("status", "enqueued_at", "started_at", "finished_at", "last_attempted_at")
    assert [getattr(done, name) for name in fields] == [getattr(stored, name) for name in fields]
    assert (done.worker_ids, done.args, done.errors) == (stored.worker_ids, stored.args, [])
    assert done.status == SUCCESSFUL


def test_signals__task_finished_carries_the_return_value_and_leaves_the_running_result(
    customer: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    """task_finished's result of a plain success is the one the task ran with, ended: a copy
    (the result the task and task_started were given stays RUNNING), with the status, end,
    errors and return value get_result() reads."""
    result = tasks.returns.enqueue(customer, "counts")
    with (
        caught(task_started) as started,
        caught(task_finished) as got,
        django_capture_on_commit_callbacks(execute=True),
    ):
        run(job_of(result))
    [running], [done] = started, got
    stored = tasks.returns.get_backend().get_result(result.id)
    assert done is not running
    assert running.status == RUNNING
    assert running.finished_at is None
    assert done.status == SUCCESSFUL
    fields = ("id", "status", "enqueued_at", "started_at", "finished_at", "last_attempted_at")
    assert [getattr(done, name) for name in fields] == [getattr(stored, name) for name in fields]
    assert (done.args, done.kwargs, done.worker_ids) == (
        stored.args,
        stored.kwargs,
        stored.worker_ids,
    )
    assert done.errors == stored.errors == []
    assert done.return_value == stored.return_value
    assert done.return_value is not None


def test_signals__a_failed_task_carries_the_row_as_its_outcome_left_it(
    customer: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    """A task that raised: task_finished, built without reading the ledger, carries the error,
    the erased arguments and the times get_result() reads."""
    result = tasks.broken.enqueue(customer)
    with caught(task_finished) as got, django_capture_on_commit_callbacks(execute=True):
        run(job_of(result))
    [done] = got
    stored = tasks.broken.get_backend().get_result(result.id)
    assert done.status == FAILED == stored.status
    assert (done.finished_at, done.started_at, done.last_attempted_at) == (
        stored.finished_at,
        stored.started_at,
        stored.last_attempted_at,
    )
    assert done.worker_ids == stored.worker_ids
    assert done.args == stored.args == []
    assert [e.exception_class_path for e in done.errors] == [
        e.exception_class_path for e in stored.errors
    ]
    assert done.errors[0].traceback == stored.errors[0].traceback


def test_enqueue__a_validated_task_is_not_validated_again_unless_its_handler_left(
    customer: Customer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation (a signature read, a registration) runs once per task, not per enqueue; a
    handler unregistered since (as tests do, or a reload) is validated and registered again."""
    backend = tasks.touch.get_backend()
    tasks.touch.enqueue(customer)  # validated (at its definition, or here)
    calls: list[Any] = []
    original = backend.validate_task
    monkeypatch.setattr(backend, "validate_task", lambda task: (calls.append(task), original(task)))
    tasks.touch.enqueue(customer)
    assert calls == []
    registry.unregister(tasks.touch.handler_name)
    result = tasks.touch.enqueue(customer)
    assert calls == [tasks.touch]
    assert registry.registered_as(tasks.touch.handler_name) is not None
    assert job_of(result).status == "queued"


# --- coalescing -----------------------------------------------------------------------------------


def test_coalesce__a_tasks_newest_call_for_a_record_runs_the_others_are_superseded(
    customer: Customer,
) -> None:
    from tombstones.exceptions import JobSuperseded

    older = tasks.sync_crm_newest.enqueue(customer)
    newest = tasks.sync_crm_newest.enqueue(customer)
    assert finish(newest).status == SUCCESSFUL
    ended = tasks.sync_crm_newest.get_backend().get_result(older.id)
    assert ended.status == FAILED
    assert ended.errors[0].exception_class is JobSuperseded
    assert "superseded: coalesced" in ended.errors[0].traceback
    assert [s["coalesced_run"] for s in tasks.seen if "coalesced_run" in s] == [newest.id]


def test_coalesce__a_tasks_call_without_its_record_is_refused(customer: Customer) -> None:
    from tombstones.exceptions import MissingFence

    with pytest.raises((MissingFence, TypeError), match=r"no record|coalesces"):
        tasks.sync_crm_newest.enqueue(None)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"coalesce": True, "debounce": timedelta(seconds=1)}, "max_delay"),
        ({"edge": "leading"}, "need coalesce"),
    ],
)
def test_coalesce__bad_task_options_are_refused_at_definition(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidTask, match=message):
        fenced_task(**options)(_plain)
