"""The engine as users and attackers found it (issue 19), each point against the real database:

1. a deletion job's params (a contact address) are gone from every table once the job ends, in
   any status and on every crash path (only rejections and successes erased them);
2. a handler that swallows a database error is failed with its own reason, never paused or
   retried; a paused job counts against TOMBSTONES_MAX_ATTEMPTS (one looped past it);
3. a raising ``job_claimed`` receiver is logged once and the job runs (the pump spun);
4. a tick that woke a due job looks again while that job waits (the timers had no next moment);
5. ``superseded`` only when the later job will really send what the record became;
6. handler names are checked when they are registered;
7. an unknown handler is a deploy: the job waits uncharged, and staff re-queue escalated ones;
8. a failed handler's traceback frames reach the worker log, its message only when allowed.

Point 4: a due job whose wake-up went nowhere is looked at again (here); a job due during a
database outage runs within 2 s of its return (tests/acceptance/test_outage.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, OperationalError, connection
from django.db.models import Value
from django.db.models.functions import Now
from django.utils import timezone

import tombstones
from project.customers.models import Customer
from project.stress.models import DownstreamRecord
from tests.factories import CustomerFactory
from tests.jobkit import events, make_due, run, temp_handler
from tombstones import signals
from tombstones.admin.dashboard import why_waiting
from tombstones.jobs import ledger, staff_actions, wakeups
from tombstones.jobs.engine import alarms, check, runner
from tombstones.jobs.engine.sweep import sweep
from tombstones.models import Job

pytestmark = pytest.mark.django_db

Status, Reason = Job.Status, Job.Reason

PLANTED = "forget-me-7731@pii.example"


def _every_table() -> str:
    """Every row of every table of the database, as text (what a pg_dump would show)."""
    dump = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            dump.append(repr(cursor.fetchall()))
    return "\n".join(dump)


@pytest.fixture
def queued(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}


# --- 1. deletion jobs leave no personal data ----------------------------------------------------


def _deletion_job(handler: str) -> Job:
    """ "Tell the CRM to forget this customer": a tombstone handler's job carrying an address."""
    customer = CustomerFactory()
    customer.delete()
    job = tombstones.enqueue(handler, customer, params={"contact": PLANTED})
    assert PLANTED in _every_table()
    return job


def _raises(ctx: Any) -> None:
    raise ValueError("the CRM refused")


def _end_failed(job: Job) -> None:
    run(job)


def _end_uncertain(job: Job) -> None:
    run(job)


def _end_cancelled(job: Job) -> None:
    assert staff_actions.cancel(job, Status.QUEUED, by="staff:1")


def _end_expired(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(created_at=Now() - Value(timedelta(days=30)))
    assert sweep(dispatch=False)["expired"] == 1


def _end_crash_taken_back(job: Job) -> None:
    """Claimed its last allowed time, then its worker vanished: the take-back fails it."""
    Job.objects.filter(pk=job.pk).update(attempts=4)
    assert ledger.claim(1) is not None
    Job.objects.filter(pk=job.pk).update(lease_expires_at=Now() - Value(timedelta(seconds=1)))
    assert ledger.take_back_lapsed()["crashed"] == 1


def _end_crash_after_sending(job: Job) -> None:
    """An external call was sent, then its worker vanished: uncertain, for a tombstone."""
    assert ledger.claim(1) is not None
    Job.objects.filter(pk=job.pk).update(
        sending_at=Now(), lease_expires_at=Now() - Value(timedelta(seconds=1))
    )
    assert ledger.take_back_lapsed()["uncertain"] == 1


def _end_culprit_at_cap(job: Job) -> None:
    """Its handler exits the worker on its last allowed attempt: failed / crashed."""
    Job.objects.filter(pk=job.pk).update(attempts=4)
    with pytest.raises(SystemExit):
        runner.pump()


ENDINGS: dict[str, tuple[Callable[[Job], None], dict[str, Any], tuple[str, str]]] = {
    "failed": (_end_failed, {}, (Status.FAILED, Reason.HANDLER_ERROR)),
    "uncertain": (_end_uncertain, {"external": True}, (Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN)),
    "cancelled": (_end_cancelled, {}, (Status.CANCELLED, Reason.CANCELLED_BY_STAFF)),
    "expired": (_end_expired, {}, (Status.EXPIRED, Reason.QUEUE_EXPIRED)),
    "crash, taken back": (_end_crash_taken_back, {}, (Status.FAILED, Reason.CRASHED)),
    "crash after sending": (
        _end_crash_after_sending,
        {"external": True},
        (Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN),
    ),
    "exits at its cap": (_end_culprit_at_cap, {}, (Status.FAILED, Reason.CRASHED)),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_params__a_deletion_job_leaves_no_personal_data_however_it_ends(
    queued: None, ending: str
) -> None:
    end, options, expected = ENDINGS[ending]

    def exits(ctx: Any) -> None:
        raise SystemExit

    handler = exits if ending == "exits at its cap" else _raises
    with temp_handler("t.forget", handler, accepts_tombstones=True, **options):
        job = _deletion_job("t.forget")
        end(job)
    job.refresh_from_db()
    assert (job.status, job.reason) == expected
    assert job.params == {}
    assert PLANTED not in _every_table()


def test_params__an_uncertain_job_of_a_live_record_keeps_them_for_its_resend(queued: None) -> None:
    """Staff may resend it once: ids and options (enqueue refused personal values) stay."""
    with temp_handler("t.call", _raises, external=True):
        job = run(tombstones.enqueue("t.call", CustomerFactory(), params={"template": "w2"}))
    assert (job.status, job.params) == (Status.UNCERTAIN, {"template": "w2"})


# --- 2. a broken transaction is the handler's failure; paused is capped --------------------------


def _swallow_duplicate(key: str) -> None:
    DownstreamRecord.objects.create(key=key, payload="x", generation=1)
    with contextlib.suppress(IntegrityError):  # no savepoint: on PostgreSQL the transaction
        DownstreamRecord.objects.create(key=key, payload="x", generation=1)  # is now unusable


@pytest.mark.postgres
@pytest.mark.parametrize("then_write", [False, True], ids=["returns", "then a fenced write"])
def test_broken_transaction__is_the_handlers_failure(
    postgres_only: None, queued: None, then_write: bool
) -> None:
    def swallows(ctx: Any) -> None:
        _swallow_duplicate(f"dup-{ctx.job.pk}")
        if then_write:
            ctx.update(phone="+1")

    with temp_handler("t.swallows", swallows):
        job = run(tombstones.enqueue("t.swallows", CustomerFactory()))
    assert (job.status, job.reason, job.attempts) == (Status.FAILED, Reason.TRANSACTION_BROKEN, 1)
    assert job.error_class == "django.db.utils.IntegrityError"
    assert not DownstreamRecord.objects.exists()  # nothing of it committed


def test_paused__counts_against_the_attempts_cap(
    queued: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record that can never be read: paused, resumed by the sweep, and failed at the cap."""
    settings.TOMBSTONES_MAX_ATTEMPTS = 3

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("the table is locked")

    monkeypatch.setattr(check, "read_records", unreadable)
    job = tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    seen = []
    for _ in range(6):
        runner.pump()
        job.refresh_from_db()
        seen.append((job.status, job.attempts))
        if job.status in Job.TERMINAL:
            break
        sweep(dispatch=False)  # resumes the paused job
    assert seen == [(Status.PAUSED, 1), (Status.PAUSED, 2), (Status.FAILED, 3)]
    assert (job.reason, job.error_class) == (
        Reason.RETRIES_EXHAUSTED,
        "django.db.utils.OperationalError",
    )


# --- 3. a raising hook receiver ----------------------------------------------------------------


@pytest.fixture
def raising_claimed_receiver() -> Iterator[list[int]]:
    calls: list[int] = []

    def receiver(sender: Any, job: Job, **kwargs: Any) -> None:
        calls.append(job.pk)
        raise RuntimeError("a tracing hook with a bug")

    signals.job_claimed.connect(receiver)
    try:
        yield calls
    finally:
        signals.job_claimed.disconnect(receiver)


def test_hooks__a_raising_receiver_is_logged_and_the_job_runs(
    queued: None, raising_claimed_receiver: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    job = tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    with caplog.at_level(logging.ERROR, logger="tombstones"):
        runner.pump(seconds=2)  # bounded: the old road spun here
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.SUCCEEDED, 1)
    assert events(job).count("claimed") == 1
    assert raising_claimed_receiver == [job.pk]
    hooks = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(hooks) == 1
    assert "RuntimeError" in hooks[0].getMessage()
    assert "a tracing hook with a bug" not in caplog.text  # the class, never the message


# --- 4. a job already due is a next moment for the timers ----------------------------------------


@pytest.fixture
def timer_ticks(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A worker process's timers (as in a cluster worker), with the alarms they arm and the
    wake-ups they send recorded; the wake-ups go nowhere (a lost message, a stale gate)."""
    seen: dict[str, Any] = {"armed": [], "woken": [], "alarms": alarms.Alarms()}
    monkeypatch.setattr(alarms, "in_cluster_worker", lambda: True)
    monkeypatch.setattr(
        seen["alarms"], "ring_in", lambda delay: seen["armed"].append(delay) or True
    )
    monkeypatch.setattr(
        wakeups, "wake_soon", lambda job_id=None, **options: seen["woken"].append(job_id)
    )
    return seen


def test_timers__a_tick_that_woke_a_due_job_looks_again_while_it_waits(
    queued: None, timer_ticks: dict[str, Any]
) -> None:
    """A due job whose wake-up went nowhere was no next moment: no alarm, the sweep's to find
    (34 s after an outage). The tick now looks again a second later, for as long as that job
    waits; once another job is at the head the queue moves, and the looks stop."""
    first = tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    second = tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    for _ in range(3):  # its wake-ups go nowhere: looked at again each time
        assert timer_ticks["alarms"].tick()["woken"] == 1
        assert timer_ticks["armed"].count(alarms.AGAIN) == _ + 1
    assert timer_ticks["woken"][-3:] == [first.pk] * 3
    # The first job ran (the queue moved): the next tick wakes the second, without a re-look.
    # (As a claim leaves it: the hint it came with cleared by the claim that took it.)
    Job.objects.filter(pk=first.pk).update(status=Status.SUCCEEDED, ready_at=None)
    armed = len(timer_ticks["armed"])
    timer_ticks["alarms"].tick()
    assert timer_ticks["woken"][-1] == second.pk
    assert alarms.AGAIN not in timer_ticks["armed"][armed:]
    Job.objects.filter(pk=second.pk).update(status=Status.SUCCEEDED, ready_at=None)
    armed = len(timer_ticks["armed"])
    assert timer_ticks["alarms"].tick()["woken"] == 0
    assert timer_ticks["armed"][armed:] == []  # nothing due, nothing waits: no alarm


# --- 5. superseded only when a later job sends the newer state -----------------------------------


def _in_flight(change: Callable[[Customer], None], later: str) -> tuple[Job, Job]:
    """An external call during which the record is saved, a later job of the lane is queued
    (``later`` names its handler), and then ``change`` happens to the record."""
    jobs: list[Job] = []

    def call(ctx: Any) -> None:
        if ctx.job.pk != jobs[0].pk:
            return  # the later job's own call
        customer = Customer.objects.get(pk=ctx.record.pk)
        customer.phone = "+2"
        customer.save()
        jobs.append(tombstones.enqueue(later, customer))
        change(customer)

    with (
        temp_handler("t.call", call, external=True),
        temp_handler("t.forget_call", call, external=True, accepts_tombstones=True),
    ):
        jobs.append(tombstones.enqueue("t.call", CustomerFactory()))
        runner.pump()
    first, second = (Job.objects.get(pk=j.pk) for j in jobs)
    return first, second


def _delete(customer: Customer) -> None:
    customer.delete()


def _recreate(customer: Customer) -> None:
    customer.delete()
    fresh = Customer.all_objects.recreate(
        reference=customer.reference, name="Again", email="again@example.test"
    )
    tombstones.enqueue("t.call", fresh)


def test_superseded__not_when_the_later_job_will_be_rejected(queued: None) -> None:
    first, second = _in_flight(_delete, later="t.call")
    assert (first.status, first.reason) == (Status.UNCERTAIN, Reason.DELETED_DURING_SEND)
    assert (second.status, second.reason) == (Status.REJECTED, Reason.SOURCE_DELETED)


def test_superseded__when_a_later_job_sends_the_deletion(queued: None) -> None:
    first, second = _in_flight(_delete, later="t.forget_call")
    assert (first.status, first.reason) == (Status.SUPERSEDED, Reason.DELETED_DURING_SEND)
    assert second.status == Status.SUCCEEDED


def test_superseded__when_a_later_job_sends_the_recreated_record(queued: None) -> None:
    first, _ = _in_flight(_recreate, later="t.call")
    assert (first.status, first.reason) == (Status.SUPERSEDED, Reason.DELETED_DURING_SEND)
    newest = Job.objects.filter(generation=2).get()
    assert newest.status == Status.SUCCEEDED


# --- 6. handler names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("h" * 201, "at most 200 characters"),
        ("app.sync\x00", "control"),
        ("app.\u200bsync", "control or format"),
        (" app.sync", "whitespace"),
        ("", "non-empty"),
    ],
)
def test_handler_names__are_checked_at_registration(name: str, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        tombstones.handler(name)


def test_handler_names__of_200_characters_are_stored(queued: None) -> None:
    name = "h" * 200
    with temp_handler(name, lambda ctx: None):
        job = run(tombstones.enqueue(name, CustomerFactory()))
    assert (job.handler, job.status) == (name, Status.SUCCEEDED)


# --- 7. unknown handlers: a deploy, not a verdict ------------------------------------------------


def test_unknown_handler__runs_once_a_worker_knows_it(
    queued: None, caplog: pytest.LogCaptureFixture
) -> None:
    customer = CustomerFactory()
    with temp_handler("t.new_in_deploy", lambda ctx: ctx.update(phone="+9")):
        job = tombstones.enqueue("t.new_in_deploy", customer)
    with caplog.at_level(logging.WARNING, logger="tombstones"):
        job = run(job)  # an old worker: the handler is not registered here
    assert (job.status, job.reason, job.attempts) == (Status.RETRY_WAIT, Reason.HANDLER_UNKNOWN, 0)
    assert any("restart the workers" in r.getMessage() for r in caplog.records)
    waiting = why_waiting(job, timezone.now())
    assert "t.new_in_deploy" in waiting.text
    assert "deploy" in waiting.text
    behind = tombstones.enqueue("customers.update_sheet_row", customer)
    assert run(behind).status == Status.QUEUED  # its lane keeps its order
    with temp_handler("t.new_in_deploy", lambda ctx: ctx.update(phone="+9")):
        make_due(job)
        run(job)  # the new worker
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.SUCCEEDED, 1)
    assert run(behind).status == Status.SUCCEEDED
    customer.refresh_from_db()
    assert customer.phone == "+9"


def test_unknown_handler__staff_requeue_an_escalated_job_once_the_handler_exists(
    queued: None,
) -> None:
    customer = CustomerFactory()
    with temp_handler("t.renamed", lambda ctx: ctx.update(phone="+7")):
        job = tombstones.enqueue("t.renamed", customer)
        Job.objects.filter(pk=job.pk).update(
            status=Status.ESCALATED, reason=Reason.HANDLER_UNKNOWN, finished_at=Now()
        )
        job.refresh_from_db()
        action = staff_actions.ACTIONS["requeue"]
        assert action in staff_actions.available(job)
        assert staff_actions.requeue(job, Status.ESCALATED, by="staff:1")
        job = run(job)
    assert job.status == Status.SUCCEEDED
    assert "requeued" in events(job)
    other = Job.objects.create(
        handler="x",
        content_type=job.content_type,
        object_id=job.object_id,
        generation=1,
        version=1,
        lane="other",
        status=Status.ESCALATED,
        reason=Reason.RECORD_MISSING,
    )
    assert "unknown handler" in staff_actions.why_not(action, other)


# --- 8. a failed handler can be debugged --------------------------------------------------------


def _fails_deep(ctx: Any) -> None:
    raise ValueError(f"contact {PLANTED} refused")


@pytest.mark.parametrize("details", [None, True])
def test_handler_errors__log_their_frames_and_the_message_only_when_allowed(
    queued: None, settings: Any, caplog: pytest.LogCaptureFixture, details: bool | None
) -> None:
    settings.TOMBSTONES_LOG_ERROR_DETAILS = details
    with (
        temp_handler("t.fails_deep", _fails_deep),
        caplog.at_level(logging.ERROR, logger="tombstones"),
    ):
        job = run(tombstones.enqueue("t.fails_deep", CustomerFactory()))
    assert job.status == Status.FAILED
    record = next(r for r in caplog.records if "raised builtins.ValueError" in r.getMessage())
    frames = record.tombstones["frames"]  # type: ignore[attr-defined]
    assert any(__file__ in f and "in _fails_deep" in f for f in frames)
    assert f"{__file__}:" in record.getMessage()
    if details:
        assert PLANTED in record.getMessage()
        assert any("ctx" in frame for frame in record.tombstones["locals"])  # type: ignore[attr-defined]
    else:
        assert PLANTED not in record.getMessage()
        assert "error_message" not in record.tombstones  # type: ignore[attr-defined]
    assert PLANTED not in job.error_class
