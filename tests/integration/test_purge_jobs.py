"""purge_jobs: finished jobs past their retention go with their events, in bounded batches; the
unfinished and the young stay; the dry run says what the real run does; the dashboard's charts
draw the same figures after a purge; the daily schedule."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import Schedule

import tombstones
from tests.factories import CustomerFactory
from tests.jobkit import rollup_counts, run, run_together, succeeded
from tombstones import worker
from tombstones.admin import dashboard
from tombstones.jobs import retention
from tombstones.jobs.ledger import purge as ledger_purge
from tombstones.jobs.ledger import rollup
from tombstones.jobs.models import OutcomeRollup
from tombstones.models import Job, JobEvent

pytestmark = pytest.mark.django_db

Status = Job.Status
Reason = Job.Reason
HANDLER = "customers.update_sheet_row"
DAY = timedelta(days=1)
# A reason per final status, as the engine writes them (the roll-up keeps the reason).
REASONS = {
    Status.SUCCEEDED: Reason.NONE,
    Status.CANCELLED: Reason.CANCELLED_BY_STAFF,
    Status.EXPIRED: Reason.QUEUE_EXPIRED,
    Status.REJECTED: Reason.SOURCE_DELETED,
    Status.FAILED: Reason.HANDLER_ERROR,
    Status.UNCERTAIN: Reason.OUTCOME_UNKNOWN,
    Status.SUPERSEDED: Reason.OUTCOME_UNKNOWN,
    Status.ESCALATED: Reason.RECORD_MISSING,
}


@pytest.fixture(autouse=True)
def _retention(settings: Any) -> None:
    settings.TOMBSTONES_JOB_RETENTION = timedelta(days=30)
    settings.TOMBSTONES_AUDIT_RETENTION = timedelta(days=365)


def _job(
    status: str,
    *,
    finished: datetime | None = None,
    events: int = 2,
    customer: Any = None,
) -> Job:
    """A job in ``status`` (finished at ``finished``), with ``events`` events of its own."""
    customer = customer or CustomerFactory()
    job = tombstones.enqueue(HANDLER, customer)
    created = min(finished, timezone.now()) if finished else timezone.now()
    Job.objects.filter(pk=job.pk).update(
        status=status,
        reason=REASONS.get(status, Reason.NONE),
        finished_at=finished,
        created_at=created - timedelta(minutes=1),
    )
    JobEvent.objects.bulk_create(
        JobEvent(
            job_id=job.pk,
            content_type_id=job.content_type_id,
            object_id=job.object_id,
            event=JobEvent.Event.CLAIMED,
        )
        for _ in range(events)
    )
    job.refresh_from_db()
    return job


def _purge(*args: str) -> str:
    out = StringIO()
    call_command("purge_jobs", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def ledger() -> dict[str, set[int]]:
    """Every final status old (past its retention) and young; the audit trail also between the
    two retentions; unfinished jobs enqueued and due long ago."""
    now = timezone.now()
    gone: set[int] = set()
    kept: set[int] = set()
    for status in retention.KINDS[retention.JOBS]:
        gone.add(_job(status, finished=now - 31 * DAY).pk)
        kept.add(_job(status, finished=now - 29 * DAY).pk)
    for status in retention.KINDS[retention.AUDIT]:
        gone.add(_job(status, finished=now - 366 * DAY).pk)
        kept.add(_job(status, finished=now - 364 * DAY).pk)
        kept.add(_job(status, finished=now - 31 * DAY).pk)  # past the jobs' retention only
    unfinished = {_job(status).pk for status in Job.UNFINISHED}
    Job.objects.filter(pk__in=unfinished).update(
        created_at=now - 400 * DAY, run_after=now - 400 * DAY, queued_at=now - 400 * DAY
    )
    return {"gone": gone, "kept": kept | unfinished}


def _numbers(text: str, pattern: str) -> tuple[int, ...]:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in {text!r}"
    return tuple(int(n) for n in found.groups())


# --- what goes, what stays -------------------------------------------------------------------


def test_purge_jobs__removes_exactly_the_old_finished_jobs_and_their_events(
    ledger: dict[str, set[int]],
) -> None:
    text = _purge("--noinput")

    assert set(Job.objects.values_list("pk", flat=True)) == ledger["kept"]
    assert set(JobEvent.objects.values_list("job_id", flat=True).distinct()) == ledger["kept"]
    assert JobEvent.objects.count() == 2 * len(ledger["kept"])
    lines = text.splitlines()
    assert lines[0] == (
        "finished jobs (succeeded, cancelled, expired; kept 30 days): 3 past retention; "
        "kept 3 younger"
    )
    assert lines[1] == (
        "audit trail (rejected, failed, uncertain, superseded, escalated; kept 365 days): "
        "5 past retention; kept 10 younger"
    )
    assert "kept 4 unfinished job(s)" in text
    # The audit trail's jobs of 366 days ago finished in a roll-up period past its retention:
    # summed into the totals, which a purge never lowers.
    assert (
        "Removed 8 job(s) and 16 event(s) in 8 batch(es); 1 roll-up period(s) summed into the "
        "totals." in text
    )


def test_purge_jobs__a_dry_run_says_what_the_real_run_does(ledger: dict[str, set[int]]) -> None:
    before = (Job.objects.count(), JobEvent.objects.count())
    dry = _purge("--dry-run", "-v", "2")
    assert (Job.objects.count(), JobEvent.objects.count()) == before

    real = _purge("--noinput", "-v", "2")

    would = _numbers(dry, r"Would remove (\d+) job\(s\) and (\d+) event\(s\)")
    removed = _numbers(real, r"Removed (\d+) job\(s\) and (\d+) event\(s\)")
    assert would == removed == (8, 16)
    assert before[0] - Job.objects.count() == would[0]
    assert before[1] - JobEvent.objects.count() == would[1]
    # The same plan, line by line (per status at -v 2).
    assert dry.splitlines()[:-1] == real.splitlines()[:-1]
    assert "  rejected: 1" in dry


def test_purge_jobs__nothing_to_remove(ledger: dict[str, set[int]]) -> None:
    _purge("--noinput")
    assert _purge("--noinput").endswith("Nothing to remove.\n")
    assert _purge("--noinput", "-v", "0") == ""


def test_purge_jobs__keeps_a_finished_job_without_a_finish_time() -> None:
    """A hand-edited row (a final status, no finished_at) cannot be aged: kept, and said so."""
    job = _job(Status.SUCCEEDED)
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - 400 * DAY)
    text = _purge("--noinput")
    assert "kept 1 finished job(s) without a finish time" in text
    assert text.endswith("Nothing to remove.\n")
    assert Job.objects.filter(pk=job.pk).exists()


def test_purge_jobs__asks_unless_noinput(
    ledger: dict[str, set[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def answer(prompt: str) -> str:
        asked.append(prompt)
        return "no"

    monkeypatch.setattr("builtins.input", answer)
    with pytest.raises(CommandError, match="Purge cancelled"):
        _purge()
    assert asked == ["Remove 8 job(s) and 16 event(s) permanently? Type 'yes' to continue: "]
    assert Job.objects.filter(pk__in=ledger["gone"]).count() == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--database", "nope"), "Unknown database 'nope'"),
        (("--batch-size", "0"), "must be between 1 and 10000, not 0"),
        (("--batch-size", "many"), "must be an integer"),
    ],
)
def test_purge_jobs__refuses_bad_options(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        _purge("--noinput", *args)


def test_purge_jobs__a_lane_needs_none_of_its_finished_jobs(settings: Any) -> None:
    """A finished job placed after an unfinished one of its lane (cancelled behind a paused
    head) goes too: lanes, the claim and the sweep read unfinished jobs only."""
    customer = CustomerFactory()
    old = timezone.now() - 40 * DAY
    earlier = [_job(Status.SUCCEEDED, finished=old, customer=customer) for _ in range(3)]
    head = _job(Status.QUEUED, customer=customer)
    behind = _job(Status.CANCELLED, finished=old, customer=customer)
    Job.objects.filter(pk=behind.pk).update(queued_at=head.queued_at + timedelta(seconds=1))
    nxt = tombstones.enqueue(HANDLER, customer)

    _purge("--noinput")

    assert set(Job.objects.values_list("pk", flat=True)) == {head.pk, nxt.pk}
    assert not Job.objects.filter(pk__in=[j.pk for j in earlier]).exists()
    assert run(head).status == Status.SUCCEEDED
    assert run(nxt).status == Status.SUCCEEDED


# --- bounded batches -------------------------------------------------------------------------


def _deletes(queries: list[dict[str, Any]], table: str) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].startswith(f'DELETE FROM "{table}"')]


def test_purge_jobs__deletes_in_batches_of_the_size_asked() -> None:
    old = timezone.now() - 40 * DAY
    jobs = [_job(Status.SUCCEEDED, finished=old + timedelta(minutes=i)) for i in range(10)]

    with CaptureQueriesContext(connection) as captured:
        text = _purge("--noinput", "--batch-size", "3")

    job_deletes = _deletes(captured.captured_queries, "tombstones_job")
    event_deletes = _deletes(captured.captured_queries, "tombstones_jobevent")
    assert len(job_deletes) == len(event_deletes) == 4  # 3 + 3 + 3 + 1
    for sql in job_deletes + event_deletes:
        ids = re.search(r"IN \(([^)]*)\)", sql)  # each statement names its batch's ids
        assert ids is not None
        assert len(ids.group(1).split(",")) <= 3
    assert "Removed 10 job(s) and 20 event(s) in 4 batch(es)." in text
    assert not Job.objects.filter(pk__in=[j.pk for j in jobs]).exists()


def test_purge__a_batch_is_chosen_on_the_finished_index() -> None:
    """The batch's statement can use ``tombstones_job_finished`` (a partial index: SQLite's
    planner must see its condition implied). On PostgreSQL with sequential scans off: on a
    small table the planner would rightly prefer one."""
    before = timezone.now() - 30 * DAY
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL enable_seqscan = off")
        plan = ledger_purge.oldest_finished("default", Status.SUCCEEDED, before, 10).explain()
    assert "tombstones_job_finished" in plan


def test_purge__a_slow_batch_halves_the_next_ones_and_pauses_then_they_grow_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = timezone.now() - 40 * DAY
    for i in range(30):
        _job(Status.SUCCEEDED, finished=old + timedelta(minutes=i), events=1)
    asked: list[int] = []
    real_batch = ledger_purge.purge_batch

    def batch(db: str, status: str, before: datetime, limit: int, *args: Any) -> tuple[int, int]:
        asked.append(limit)
        return real_batch(db, status, before, limit, *args)

    monkeypatch.setattr(retention, "purge_batch", batch)
    ticks = iter([0.0, 2.0, 2.0, 4.0] + [4.0] * 100)  # the first two batches take 2 s
    slept: list[float] = []
    purged = retention.purge(
        batch_size=8, min_batch=2, clock=lambda: next(ticks), sleep=slept.append
    )

    # Two slow batches halve it; five fast ones in a row double it back (the other final
    # statuses are asked once each, after these).
    assert asked[:10] == [8, 4, 2, 2, 2, 2, 2, 4, 4, 4]
    assert len(asked) == 10 + len(Job.TERMINAL) - 1
    assert (purged.slow_batches, purged.smallest_batch) == (2, 2)
    assert slept == [retention.PAUSE_SECONDS] * 2
    assert purged.total == 30
    assert not Job.objects.exists()


def test_purge__after_its_time_stops_at_the_end_of_a_batch() -> None:
    old = timezone.now() - 40 * DAY
    for i in range(5):
        _job(Status.SUCCEEDED, finished=old + timedelta(minutes=i), events=1)
    ticks = iter([0.0] + [10.0] * 100)

    purged = retention.purge(batch_size=2, seconds=5, clock=lambda: next(ticks))

    assert (purged.total, purged.batches, purged.done) == (2, 1, False)
    assert Job.objects.count() == 3
    assert retention.purge(batch_size=2).done is True
    assert not Job.objects.exists()


def test_purge__two_purges_at_once_remove_and_count_each_job_once(
    transactional_db: None,
) -> None:
    """Committed rows and two real connections: each batch locks its rows (SKIP LOCKED on
    PostgreSQL, the write lock on SQLite) and the roll-up's counts add up."""
    old = timezone.now() - 40 * DAY
    for i in range(30):
        _job(Status.SUCCEEDED, finished=old + timedelta(seconds=i), events=1)
    now = timezone.now()
    events = JobEvent.objects.count()  # the jobs ran (committed: sync mode), with their events

    results = succeeded(
        run_together(
            lambda: retention.purge(now=now, batch_size=4),
            lambda: retention.purge(now=now, batch_size=4),
        )
    )

    assert sum(r.total for r in results) == 30
    assert sum(r.events for r in results) == events
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()
    assert sum(OutcomeRollup.objects.values_list("jobs", flat=True)) == 30


# --- the dashboard keeps its figures ---------------------------------------------------------


def _figures() -> dict[str, Any]:
    context = dashboard.context()
    return {
        name: [(b["label"], b["title"], b.get("total", b.get("n"))) for b in context[name]["bars"]]
        for name in ("outcomes_by_hour", "outcomes_by_day", "rejection_chart")
    }


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "Asia/Kolkata"])
def test_purge_jobs__the_dashboard_draws_the_same_charts_after_a_purge(
    settings: Any, zone: str
) -> None:
    settings.TOMBSTONES_JOB_RETENTION = timedelta(hours=2)
    settings.TOMBSTONES_AUDIT_RETENTION = timedelta(hours=5)
    now = timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    # Finishes on either side of local hours and days: Kolkata's start at :30 UTC (18:30 for
    # its midnight), Paris's midnight is 23:00 UTC in winter, 22:00 in summer.
    finishes = [now - timedelta(minutes=10)]  # kept
    finishes += [hour - timedelta(hours=h) + timedelta(minutes=m) for h, m in ((3, 7), (23, 59))]
    finishes += [hour - timedelta(hours=6) + timedelta(minutes=m) for m in (14, 29, 31, 44)]
    for days in (2, 3, 9, 13):
        day = now - days * DAY
        finishes += [day.replace(hour=h, minute=m) for h, m in ((18, 20), (18, 40), (22, 50))]
        finishes += [day.replace(hour=23, minute=10)]
    finishes.append(now - 20 * DAY)  # beyond both charts
    statuses = list(REASONS)
    for i, finished in enumerate(finishes):
        for status in statuses[i % 3 :: 3]:
            _job(status, finished=finished, events=1)
    created = Job.objects.count()
    with timezone.override(zone):
        before = _figures()
        removed = _numbers(_purge("--noinput"), r"Removed (\d+) job")[0]
        after = _figures()
        again = _purge("--noinput")

    assert removed > created - 8
    assert Job.objects.count() == created - removed
    assert after == before
    assert sum(total for _, _, total in before["outcomes_by_day"]) > 0
    assert sum(total for _, _, total in before["rejection_chart"]) > 0
    assert again.endswith("Nothing to remove.\n")
    assert OutcomeRollup.objects.exists()


def test_purge__the_rollup_counts_by_quarter_hour_status_and_reason() -> None:
    base = timezone.now().replace(minute=0, second=0, microsecond=0) - 40 * DAY
    for minutes in (0, 7, 14, 15, 44):
        _job(Status.SUCCEEDED, finished=base + timedelta(minutes=minutes, seconds=30))
    _job(Status.CANCELLED, finished=base + timedelta(minutes=1))
    quarter = timedelta(minutes=15)
    counted = {
        (base, Status.SUCCEEDED, "", 3),
        (base + quarter, Status.SUCCEEDED, "", 1),
        (base + 2 * quarter, Status.SUCCEEDED, "", 1),
        (base, Status.CANCELLED, Reason.CANCELLED_BY_STAFF, 1),
    }
    assert {(*key, n) for key, n in rollup_counts().items()} == counted  # counted as they finished

    retention.purge()

    assert not Job.objects.filter(finished_at__isnull=False).exists()
    assert {(*key, n) for key, n in rollup_counts().items()} == counted  # the purge took nothing
    # A later finish adds to its period's count.
    _job(Status.SUCCEEDED, finished=base + timedelta(minutes=3))
    retention.purge()
    assert rollup_counts()[base, Status.SUCCEEDED, ""] == 4


def test_purge__the_rollup_keeps_periods_as_long_as_the_audit_trail(settings: Any) -> None:
    now = timezone.now()
    keep = OutcomeRollup.objects.create(
        period=rollup.period_of(now - 364 * DAY), status=Status.SUCCEEDED, jobs=3
    )
    OutcomeRollup.objects.create(
        period=rollup.period_of(now - 366 * DAY), status=Status.SUCCEEDED, jobs=3
    )
    OutcomeRollup.objects.create(
        period=rollup.period_of(now - 367 * DAY), status=Status.SUCCEEDED, jobs=2
    )
    text = _purge("--noinput")
    assert "2 roll-up period(s) past the audit retention, to be summed into the totals" in text
    assert "; 2 roll-up period(s) summed into the totals." in text
    # The old periods are one row at the epoch: out of every chart, still in the totals.
    assert rollup_counts() == {
        (keep.period, Status.SUCCEEDED, ""): 3,
        (rollup.EPOCH, Status.SUCCEEDED, ""): 5,
    }
    assert rollup.totals() == {(Status.SUCCEEDED, ""): 8}
    # Never less than the dashboard's charts need, whatever the audit retention.
    settings.TOMBSTONES_AUDIT_RETENTION = timedelta(days=2)
    recent = OutcomeRollup.objects.create(
        period=rollup.period_of(now - 20 * DAY), status=Status.SUCCEEDED, jobs=1
    )
    retention.purge()
    assert rollup_counts() == {
        (recent.period, Status.SUCCEEDED, ""): 1,
        (rollup.EPOCH, Status.SUCCEEDED, ""): 8,
    }
    assert rollup.totals() == {(Status.SUCCEEDED, ""): 9}


# --- the horizon and the schedule ------------------------------------------------------------


def test_horizon__the_oldest_finish_each_kind_keeps(settings: Any) -> None:
    now = timezone.now()
    assert retention.horizon("jobs", now) == now - timedelta(days=30)
    assert retention.horizon("audit", now) == now - timedelta(days=365)
    assert retention.horizon(Status.REJECTED, now) == now - timedelta(days=365)
    assert retention.horizon(Status.EXPIRED, now) == now - timedelta(days=30)
    settings.TOMBSTONES_AUDIT_RETENTION = timedelta(days=400)
    assert retention.horizon("audit", now) == now - timedelta(days=400)
    with pytest.raises(ValueError, match="never purged"):
        retention.horizon(Status.QUEUED)
    assert {s for statuses in retention.KINDS.values() for s in statuses} == set(Job.TERMINAL)


def test_schedule__migrate_installs_a_daily_purge() -> None:
    Schedule.objects.filter(name=retention.SCHEDULE_NAME).delete()
    call_command("migrate", "tombstones", verbosity=0)
    schedule = Schedule.objects.get(name=retention.SCHEDULE_NAME)
    assert (schedule.func, schedule.schedule_type, schedule.repeats, schedule.cluster) == (
        "tombstones.worker.run_purge",
        Schedule.DAILY,
        -1,
        None,
    )
    retention.install_schedule()
    assert Schedule.objects.filter(name=retention.SCHEDULE_NAME).count() == 1


@pytest.mark.parametrize("cluster", [None, "jobs"])
def test_schedule__the_purge_fires_on_the_cluster_the_jobs_go_to(
    transactional_db: None, settings: Any, monkeypatch: pytest.MonkeyPatch, cluster: str | None
) -> None:
    """django-q2's own scheduler, run as the only cluster (named like the jobs' one), sends the
    purge (as the sweep's schedule: a transactional test, the scheduler closes connections)."""
    from django_q import scheduler as q_scheduler
    from django_q.brokers import get_broker
    from django_q.conf import Conf
    from django_q.signing import SignedPackage

    settings.TOMBSTONES_Q_OPTIONS = {"cluster": cluster} if cluster else {}
    name = cluster or Conf.PREFIX
    monkeypatch.setattr(Conf, "CLUSTER_NAME", name)
    Schedule.objects.all().delete()
    retention.install_schedule()
    assert Schedule.objects.get(name=retention.SCHEDULE_NAME).cluster == cluster
    Schedule.objects.update(next_run=timezone.now() - timedelta(seconds=1))
    broker = get_broker(name)
    broker.purge_queue()
    q_scheduler.scheduler(broker=broker)
    sent = [SignedPackage.loads(payload).get("func") for _, payload in broker.dequeue() or []]
    assert sent == ["tombstones.worker.run_purge"]


def test_run_purge__purges_and_hands_what_is_left_to_another_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = timezone.now() - 40 * DAY
    for i in range(3):
        _job(Status.SUCCEEDED, finished=old + timedelta(minutes=i), events=1)
    assert worker.run_purge() == {
        "jobs": 3,
        "by_status": {"succeeded": 3},
        "events": 3,
        "batches": 1,
        "slow_batches": 0,
        "rollups": 0,
        "done": True,
        "continued": False,
    }
    for i in range(3):
        _job(Status.SUCCEEDED, finished=old + timedelta(minutes=i), events=1)
    sent: list[str] = []
    monkeypatch.setattr("tombstones.jobs.retention.task_seconds", lambda: 0.0)
    monkeypatch.setattr(retention, "DEFAULT_BATCH", 2)
    monkeypatch.setattr(
        "django_q.tasks.async_task", lambda func, **options: sent.append(func) or "task-id"
    )
    result = worker.run_purge()
    assert (result["jobs"], result["done"], result["continued"]) == (2, False, True)
    assert sent == ["tombstones.worker.run_purge"]
