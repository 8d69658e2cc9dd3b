"""Django's tasks framework (``@task`` through ``tombstones.tasks.TombstoneBackend``) against a
real qcluster (PostgreSQL + Redis, or SQLite + the ORM broker), with no sweep:

- the seed's four race cases and its worked example, each read back through ``get_result``;
- lane order through ``apply.enqueue(entity)``: each record's writes in enqueue order, the lanes
  in parallel;
- result statuses as the web side sees them while the cluster runs;
- no personal value in the job's params, its events, django-q2's rows and messages, the
  TaskResult or the cluster's log; a personal value passed as an argument is refused at enqueue.

Cases 2 and 4 need the record changed after the worker's check read it and before the task
writes: the cluster is started with ``TASKS_HOLD_DIR`` (see tests/tasks.py), which stops a worker
right after its check's read of a customer the test names, until the test releases it. They are
also played with the worker stopped inside the task, its act transaction open (``held``): there
PostgreSQL lets the change land before the write, and SQLite's write lock orders it after the job.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import F
from django_q.models import Failure, OrmQ, Success, Task

from project.customers.models import Customer, SheetRow
from project.stress.models import AppliedWrite, StressEntity
from tests import tasks
from tests.factories import CustomerFactory, SheetRowFactory
from tombstones.exceptions import InvalidParams
from tombstones.models import Job, JobEvent
from tombstones.tasks.compat import TaskResult, TaskResultStatus

from .helpers_cluster import (
    assert_lane_order,
    broker_cluster,
    entity,
    finished,
    quiet_queue,
    wait_for,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.tasks,
    pytest.mark.django_db(transaction=True),
]

Status, Reason = Job.Status, Job.Reason
READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED
EXC = "tombstones.exceptions."


def _job(result: TaskResult) -> Job:
    return Job.objects.get(pk=int(result.id))


def _done(*results: TaskResult) -> bool:
    return finished(*(_job(r) for r in results))


def _failed(result: TaskResult, exception: str, status: str, reason: str) -> None:
    """FAILED with one TaskError naming ``exception`` and the job's status and reason code."""
    assert result.status == FAILED
    assert [e.exception_class_path for e in result.errors] == [EXC + exception]
    assert f"{status}: {reason}" in result.errors[0].traceback
    assert result.finished_at is not None


class Hold:
    """Stops the cluster's next check of a customer right after its read (see tests/tasks.py)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def arm(self, customer: Customer) -> None:
        (self.folder / f"hold-{customer.pk}").write_text("hold")

    def reached(self, customer: Customer) -> bool:
        return (self.folder / f"reached-{customer.pk}").exists()

    def release(self, customer: Customer) -> None:
        (self.folder / f"release-{customer.pk}").write_text("go")


@pytest.fixture
def hold(tmp_path: Path) -> Hold:
    return Hold(tmp_path)


# --- 1. the seed's race cases ----------------------------------------------------------------


def test_tasks_cluster__the_four_race_cases_and_the_worked_example(hold: Hold) -> None:
    rows = {case: SheetRowFactory() for case in ("1", "2", "3", "4", "worked")}
    customers = {case: row.customer for case, row in rows.items()}
    with broker_cluster(2, TASKS_HOLD_DIR=str(hold.folder)):
        # 1: job queued, record deleted, job starts.
        with transaction.atomic():  # the cluster sees both at commit: the job runs after
            one = tasks.sync_sheet.enqueue(customers["1"])
            customers["1"].delete()

        # 2: the job passes the check, the record is deleted, the job writes.
        hold.arm(customers["2"])
        two = tasks.sync_sheet.enqueue(customers["2"])
        wait_for(lambda: hold.reached(customers["2"]))
        Customer.objects.get(pk=customers["2"].pk).delete()
        hold.release(customers["2"])

        # 3: record deleted and re-created with the same business key before the old job runs.
        with transaction.atomic():
            three = tasks.sync_sheet.enqueue(customers["3"])
            customers["3"].delete()
            Customer.all_objects.recreate(
                reference=customers["3"].reference, name="Again", email="again@example.test"
            )

        # 4: the job passes the check, the record is updated, the job writes.
        hold.arm(customers["4"])
        four = tasks.sync_sheet.enqueue(customers["4"])
        wait_for(lambda: hold.reached(customers["4"]))
        Customer.objects.filter(pk=customers["4"].pk).update(phone="+15550000004")
        hold.release(customers["4"])

        # The worked example: J2 from generation 1, J3 from generation 2, one lane.
        with transaction.atomic():
            j2 = tasks.sync_sheet.enqueue(customers["worked"])
            customers["worked"].delete()
            revived = Customer.all_objects.recreate(
                reference=customers["worked"].reference, name="Two", email="two@example.test"
            )
            j3 = tasks.sync_sheet.enqueue(revived)

        wait_for(lambda: _done(one, two, three, four, j2, j3), timeout=60)

    for case in ("1", "2", "3"):
        # A rejection wrote nothing: neither the sheet row nor the record.
        assert SheetRow.all_objects.get(pk=rows[case].pk).synced_version is None, case
        assert Customer.all_objects.get(pk=customers[case].pk).synced_at is None, case

    result = tasks.sync_sheet.get_result(one.id)
    _failed(result, "RecordDeleted", "rejected", "source_deleted")
    job = _job(one)
    assert (job.status, job.reason, job.found_generation) == (
        Status.REJECTED,
        Reason.SOURCE_DELETED,
        1,
    )
    assert not job.events.filter(event=JobEvent.Event.CHECKED).exists()  # stopped at the check

    result = tasks.sync_sheet.get_result(two.id)
    _failed(result, "RecordDeleted", "rejected", "source_deleted")
    job = _job(two)
    assert (job.status, job.reason) == (Status.REJECTED, Reason.SOURCE_DELETED)
    # It passed the check on the live record (g1/v1); its write found the tombstone (v2).
    checked = job.events.get(event=JobEvent.Event.CHECKED)
    assert (checked.found_generation, checked.found_version) == (1, 1)
    assert (job.found_generation, job.found_version) == (1, 2)
    assert result.worker_ids == [job.owner]

    result = tasks.sync_sheet.get_result(three.id)
    _failed(result, "GenerationChanged", "rejected", "generation_changed")
    job = _job(three)
    assert (job.status, job.reason, job.generation, job.found_generation) == (
        Status.REJECTED,
        Reason.GENERATION_CHANGED,
        1,
        2,
    )
    revived3 = Customer.objects.get(pk=customers["3"].pk)
    assert (revived3.generation, revived3.version, revived3.synced_at) == (2, 1, None)

    result = tasks.sync_sheet.get_result(four.id)
    assert (result.status, result.errors) == (SUCCESSFUL, [])
    job = _job(four)
    assert (job.status, job.rereads) == (Status.SUCCEEDED, 1)
    assert job.events.filter(event=JobEvent.Event.REREAD).count() == 1
    customer = Customer.objects.get(pk=customers["4"].pk)
    assert customer.synced_at is not None
    assert customer.version == 3  # the update (2), then the task's write on what it re-read
    assert SheetRow.objects.get(pk=rows["4"].pk).synced_version == 2

    result = tasks.sync_sheet.get_result(j2.id)
    _failed(result, "GenerationChanged", "rejected", "generation_changed")
    result = tasks.sync_sheet.get_result(j3.id)
    assert (result.status, result.errors) == (SUCCESSFUL, [])
    assert (_job(j2).generation, _job(j3).generation) == (1, 2)
    assert _job(j2).lane == _job(j3).lane
    assert _job(j2).sequence < _job(j3).sequence  # J2 was its lane's head
    # Exactly one write: generation 2's, once.
    customer = Customer.objects.get(pk=customers["worked"].pk)
    assert (customer.generation, customer.version) == (2, 2)
    assert customer.synced_at is not None
    assert SheetRow.objects.get(pk=rows["worked"].pk).synced_version == 1


def _in_a_thread(action: Any) -> threading.Thread:
    """``action`` in a thread of its own (its own connection, committed), started now."""

    def target() -> None:
        try:
            with transaction.atomic():
                action()
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread


@pytest.mark.parametrize("change", ["delete", "update"])
def test_tasks_cluster__a_change_while_the_task_runs_before_its_write(
    change: str, tmp_path: Path
) -> None:
    """Cases 2 and 4 with the worker inside the task (its act transaction open), before its write.

    PostgreSQL: nothing is held before the write, so the change lands at once; the write then
    finds a tombstone (rejected) or a newer version (re-read, then written). SQLite: the act
    transaction holds the database's write lock, so the change waits for the job's commit and
    lands after it: never between the check and the write.
    """
    signal, release = tmp_path / "reached", tmp_path / "release"
    customer = CustomerFactory()
    actions = {
        "delete": lambda: Customer.objects.get(pk=customer.pk).delete(),
        "update": lambda: Customer.objects.filter(pk=customer.pk).update(phone="+15550000009"),
    }
    with broker_cluster(1):
        result = tasks.held.enqueue(customer, str(signal), str(release))
        wait_for(signal.exists)
        thread = _in_a_thread(actions[change])
        thread.join(2)
        waited = thread.is_alive()
        release.write_text("go")
        thread.join(30)
        assert not thread.is_alive()
        wait_for(lambda: _done(result), timeout=30)
    job = _job(result)
    result = tasks.held.get_result(result.id)
    after = Customer.all_objects.get(pk=customer.pk)
    if connection.vendor != "postgresql":
        assert waited
        assert (result.status, job.rereads, after.version) == (SUCCESSFUL, 0, 3)
        assert after.is_tombstone == (change == "delete")
        return
    assert not waited
    if change == "delete":
        _failed(result, "RecordDeleted", "rejected", "source_deleted")
        assert (job.found_version, after.synced_at, after.version) == (2, None, 2)
    else:
        assert (result.status, job.rereads, after.version) == (SUCCESSFUL, 1, 3)
        assert after.synced_at is not None


# --- 2. lane order ---------------------------------------------------------------------------


def test_tasks_cluster__each_record_s_tasks_run_in_enqueue_order_and_records_in_parallel() -> None:
    lanes, per_lane = 4, 5
    with broker_cluster(2):
        records = [entity(f"T{i}") for i in range(lanes)]
        # 200 ms each, slow enough that the two workers share the lanes (see test_lanes); the
        # first record's first task 1.5 s: its record's next tasks would overtake it unless they
        # wait for it.
        results = [
            tasks.apply.enqueue(records[i % lanes], delay_ms=1500 if i == 0 else 200)
            for i in range(lanes * per_lane)
        ]
        wait_for(lambda: _done(*results), timeout=90, every=0.2)
    jobs = [_job(r) for r in results]
    assert {j.handler for j in jobs} == {"task:tests.tasks.apply"}
    assert {tasks.apply.get_result(r.id).status for r in results} == {SUCCESSFUL}
    assert AppliedWrite.objects.count() == lanes * per_lane
    assert_lane_order(records, jobs)
    assert Job.objects.filter(attempts__gt=1).count() == 0
    for record in records:
        assert StressEntity.objects.get(pk=record.pk).version == 1 + per_lane
    if connection.vendor == "postgresql":
        # Two workers shared the lanes, and two lanes ran at the same time (on SQLite one
        # worker may run them all: see test_lanes__a_cluster_runs_each_lane_in_order...).
        assert len({j.owner for j in jobs}) >= 2
        spans = [(j.started_at, j.finished_at, j.lane) for j in jobs]
        assert any(a[2] != b[2] and a[0] < b[1] and b[0] < a[1] for a in spans for b in spans)
    assert not Job.objects.filter(finished_at__lt=F("started_at")).exists()


# --- 3. result statuses, seen from the web side ----------------------------------------------


def test_tasks_cluster__result_statuses_as_the_web_side_sees_them(tmp_path: Path) -> None:
    signal, release = tmp_path / "reached", tmp_path / "release"
    customer, other, gone = CustomerFactory(), CustomerFactory(), CustomerFactory()
    with broker_cluster(1):
        with transaction.atomic():
            running = tasks.held.enqueue(customer, str(signal), str(release))
            behind = tasks.touch.enqueue(customer)
            assert running.status == behind.status == READY
            assert tasks.held.get_result(running.id).status == READY
        wait_for(signal.exists)
        # The first task runs, held inside; the one behind it in its lane waits.
        now = tasks.held.get_result(running.id)
        assert (now.status, now.finished_at, now.errors) == (RUNNING, None, [])
        assert now.started_at is not None
        assert now.worker_ids == [_job(running).owner]
        waiting = tasks.touch.get_result(behind.id)
        assert (waiting.status, waiting.started_at, waiting.worker_ids) == (READY, None, [])
        assert _job(behind).status == Status.QUEUED
        release.write_text("go")

        broken = tasks.broken.enqueue(other)
        awaited = tasks.async_touch.enqueue(other)  # an async task, on the cluster's worker
        with transaction.atomic():
            rejected = tasks.touch.enqueue(gone)
            gone.delete()
        wait_for(lambda: _done(running, behind, broken, rejected, awaited), timeout=60)
        # Read while the cluster still runs, through refresh() as a view would.
        running.refresh()
        behind.refresh()

    for result in (running, behind):
        assert (result.status, result.errors) == (SUCCESSFUL, [])
        assert result.finished_at is not None
        assert result.started_at is not None
        assert result.finished_at >= result.started_at >= result.enqueued_at
    assert _job(behind).started_at >= _job(running).finished_at

    result = tasks.broken.get_result(broken.id)
    assert result.status == FAILED
    assert result.errors[0].exception_class is ValueError  # what the task raised
    assert "failed: handler_error" in result.errors[0].traceback
    assert ", in broken\n" in result.errors[0].traceback  # its frames, from the worker
    assert "\nbuiltins.ValueError\n" in result.errors[0].traceback  # the class, not the message
    assert "ValueError: a bug" not in result.errors[0].traceback
    assert (_job(broken).status, _job(broken).reason) == (Status.FAILED, Reason.HANDLER_ERROR)

    result = tasks.async_touch.get_result(awaited.id)
    assert (result.status, result.return_value) == (SUCCESSFUL, {"written": 1, "rows": 0})
    assert result.worker_ids == [_job(awaited).owner]  # a cluster worker ran it

    result = tasks.touch.get_result(rejected.id)
    _failed(result, "RecordDeleted", "rejected", "source_deleted")
    # A rejection is never SUCCESSFUL: every result agrees with its job's status.
    for job in Job.objects.all():
        shown = tasks.touch.get_backend().get_result(job.pk)
        assert (shown.status == SUCCESSFUL) == (job.status == Status.SUCCEEDED), job.pk
        ended_otherwise = job.status in Job.TERMINAL and job.status != Status.SUCCEEDED
        assert (shown.status == FAILED) == ended_otherwise, job.pk
    assert not Task.objects.filter(func="tombstones.worker.run", success=False).exists()


@pytest.mark.usefixtures("postgres_only")
def test_tasks_cluster__plain_tasks_run_beside_a_held_lane(tmp_path: Path) -> None:
    """Tasks for no record run on the same cluster, each in a lane of its own: they finish while
    a record's task is held inside its worker and the task behind it in its lane still waits.
    (PostgreSQL: on SQLite the held task's transaction holds the one write lock.)"""
    signal, release = tmp_path / "reached", tmp_path / "release"
    customer = CustomerFactory()
    with broker_cluster(2):
        running = tasks.held.enqueue(customer, str(signal), str(release))
        behind = tasks.touch.enqueue(customer)
        wait_for(signal.exists)
        plain = [
            tasks.digest.enqueue(41, period="day"),
            tasks.ping.enqueue(),
            tasks.plain_call_out.enqueue(1),
            tasks.plain_context.enqueue(-1),  # its fenced write refuses: NoRecord
        ]
        wait_for(lambda: _done(*plain), timeout=60)
        # All four ended while the record's lane stayed held.
        assert _job(running).status == Status.RUNNING
        assert _job(behind).status == Status.QUEUED
        release.write_text("go")
        wait_for(lambda: _done(running, behind), timeout=60)

    backend = tasks.digest.get_backend()
    digest, ping, call_out, refused = (backend.get_result(r.id) for r in plain)
    assert (digest.status, digest.return_value) == (SUCCESSFUL, {"sent_to": 41, "period": "day"})
    assert (ping.status, ping.return_value) == (SUCCESSFUL, "pong")
    assert call_out.status == SUCCESSFUL
    trail = [e.event for e in JobEvent.objects.filter(job_id=call_out.id)]
    assert trail[-3:] == ["sending", "sent", "succeeded"]
    assert refused.status == FAILED
    assert refused.errors[-1].exception_class_path == EXC + "NoRecord"
    for result in plain:
        job = _job(result)
        assert job.is_plain
        assert job.lane.startswith("plain:")
        assert job.owner  # a cluster worker ran it
    assert _job(behind).started_at >= _job(running).finished_at


# --- 4. no personal data ---------------------------------------------------------------------

# A distinctive value in each personal field of the customer.
PLANTED = {
    "name": "Quorvath Ylzendrax",
    "email": "ylzendrax.7731@pii.test",
    "phone": "+15550177331",
}


def _planted_in(text: str) -> list[str]:
    low = text.lower()
    found = [f for f, value in PLANTED.items() if value.lower() in low]
    if "ylzendrax" in low:  # a part of any of them
        found.append("part")
    return found


def _messages(payloads: Iterator[Any]) -> list[str]:
    """django-q2 broker messages (signed pickles) as text."""
    from django_q.signing import SignedPackage

    texts = []
    for payload in payloads:
        raw = payload.decode() if isinstance(payload, bytes) else str(payload)
        try:
            texts.append(repr(SignedPackage.loads(raw)))
        except Exception:  # noqa: BLE001 - another cluster's signature: searched as it is
            texts.append(raw)
    return texts


def _redis_values() -> list[str]:
    from tests.jobkit import redis_client

    client = redis_client()
    texts = []
    for key in client.scan_iter("django_q:*"):
        kind = client.type(key).decode()
        if kind == "list":
            texts += _messages(iter(client.lrange(key, 0, -1)))
        elif kind == "string":
            texts.append(repr(client.get(key)))
        elif kind == "hash":
            texts.append(repr(client.hgetall(key)))
        elif kind == "zset":
            texts.append(repr(client.zrange(key, 0, -1)))
        elif kind == "set":
            texts.append(repr(client.smembers(key)))
    return texts


def _a_message_in_flight(personal: dict[str, str]) -> list[str]:
    """The wake-up message of a task for a customer holding ``personal``, sent through this run's
    broker (Redis with PostgreSQL, else the ORM) to a queue no cluster reads, as text."""
    from tests.jobkit import redis_broker, redis_client
    from tombstones.jobs import wakeups

    with quiet_queue() as name:
        client = redis_client() if connection.vendor == "postgresql" else None
        key = (os.getpid(), name)
        if client is not None:  # after quiet_queue's override_settings, which forgets brokers
            wakeups._brokers[key] = redis_broker(client, name)
        try:
            with transaction.atomic():
                tasks.touch.enqueue(CustomerFactory(reference="C-SPARE", **personal))
            if client is None:
                return _messages(OrmQ.objects.filter(key=name).values_list("payload", flat=True))
            return _messages(iter(client.lrange(f"django_q:{name}:q", 0, -1)))
        finally:
            wakeups._brokers.pop(key, None)
            if client is not None:
                for suffix in ("", ":tombstones:gate", ":tombstones:helper"):
                    client.delete(f"django_q:{name}:q{suffix}")


def test_tasks_cluster__no_personal_value_in_params_events_q_rows_results_or_logs() -> None:
    live = SheetRowFactory(customer__name="Other", customer__email="o@example.test")
    customer = CustomerFactory(**PLANTED)
    row = SheetRowFactory(customer=customer)
    doomed = CustomerFactory(reference="C-DOOMED", **PLANTED)
    with broker_cluster(2, TOMBSTONES_LOG_LEVEL="DEBUG") as cluster:
        results = [
            tasks.sync_sheet.enqueue(customer, note="weekly"),
            tasks.touch.enqueue(customer),
            tasks.link_row.enqueue(row, customer=customer),
            tasks.call_out.enqueue(customer),
        ]
        wait_for(lambda: _done(*results), timeout=60)
        # link_row is fenced on its customer, the row an argument read fresh.
        link = _job(results[2])
        assert (link.content_type.model, link.object_id) == ("customer", str(customer.pk))
        assert {tasks.touch.get_backend().get_result(r.id).status for r in results} == {SUCCESSFUL}
        # Not vacuous: django-q2 stores a wake-up whose jobs all succeeded (only those).
        wait_for(lambda: Task.objects.filter(func="tombstones.worker.run").exists())
        results.append(tasks.broken.enqueue(customer))
        results.append(tasks.sync_sheet.enqueue(live.customer))
        with transaction.atomic():
            rejected = [tasks.sync_sheet.enqueue(doomed), tasks.call_out.enqueue(doomed)]
            doomed.delete()
        results += rejected
        wait_for(lambda: _done(*results), timeout=60)
    log = Path(cluster.log_path).read_text(errors="replace")

    statuses = [r.status for r in (tasks.touch.get_backend().get_result(r.id) for r in results)]
    assert statuses == [SUCCESSFUL] * 4 + [FAILED, SUCCESSFUL, FAILED, FAILED]
    assert {_job(r).status for r in rejected} == {Status.REJECTED}
    # Not vacuous: the log and django-q2's rows record these jobs.
    assert f"job {rejected[0].id} rejected reason=source_deleted" in log

    in_flight = _a_message_in_flight(PLANTED)
    assert any("tombstones.worker.run" in text for text in in_flight)

    places: dict[str, str] = {
        "job params": repr(list(Job.objects.values_list("pk", "params"))),
        "job rows": repr(list(Job.objects.values())),
        "job events": repr(list(JobEvent.objects.values())),
        "q tasks": repr(list(Task.objects.values())),
        "q successes": repr(list(Success.objects.values())),
        "q failures": repr(list(Failure.objects.values())),
        "q queue": repr(_messages(OrmQ.objects.values_list("payload", flat=True))),
        "messages in flight": repr(in_flight),
        "cluster log": log,
    }
    for result in results:
        shown = tasks.touch.get_backend().get_result(result.id)
        errors = [(e.exception_class_path, e.traceback) for e in shown.errors]
        places[f"result {result.id}"] = repr((shown.args, shown.kwargs, errors))
        places[f"enqueue result {result.id}"] = repr((result.args, result.kwargs))
    if connection.vendor == "postgresql":
        places["redis"] = repr(_redis_values())
    assert {where: _planted_in(text) for where, text in places.items() if _planted_in(text)} == {}

    # What the result does show: the record as a snapshot, the other arguments as given.
    shown = tasks.sync_sheet.get_result(results[0].id)
    assert shown.args == [
        {"model": "customers.customer", "pk": str(customer.pk), "generation": 1, "version": 1}
    ]
    assert shown.kwargs == {"note": "weekly"}
    # Pickled django-q2 task arguments hold ids only (not a pickled record).
    for args in Task.objects.values_list("args", flat=True):
        assert b"Customer" not in pickle.dumps(args)


def test_tasks_cluster__a_personal_value_as_an_argument_is_refused_naming_the_field() -> None:
    customer = CustomerFactory(**PLANTED)
    calls = {
        "email": lambda: tasks.sync_sheet.enqueue(customer, note=customer.email),
        "name": lambda: tasks.sync_sheet.enqueue(customer, customer.name),
        "phone": lambda: tasks.sync_sheet.enqueue(customer, note=f"call {customer.phone}"),
    }
    for field, call in calls.items():
        with pytest.raises(InvalidParams) as refused:
            call()
        message = str(refused.value)
        assert field in message
        assert _planted_in(message) == []
    assert not Job.objects.exists()
