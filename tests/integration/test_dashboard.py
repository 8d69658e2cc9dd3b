"""The dashboard's figures, each checked against real rows: why each waiting job waits, blocked
lanes (a delayed head included), the oldest due job's age, the next sweep, throughput, outcomes
over time by hour and by day."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from tests.factories import CustomerFactory
from tests.jobkit import STAFF_CODENAMES, claim, run
from tests.jobkit import record as record_outcome
from tombstones.admin import dashboard
from tombstones.admin.display import format_duration
from tombstones.conf import tombstone_settings
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job

pytestmark = pytest.mark.django_db

Status = Job.Status
HANDLER = "customers.update_sheet_row"


@pytest.fixture
def staff_client() -> Client:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="tombstones", codename__in=STAFF_CODENAMES
        )
    )
    client = Client()
    client.force_login(user)
    return client


def _page(client: Client) -> tuple[Any, str]:
    response = client.get(reverse("admin:tombstones_job_dashboard"))
    assert response.status_code == 200
    return response.context, response.content.decode()


def _finished(minutes_ago: float, *, rejected: bool = False) -> Job:
    """A finished job (succeeded or rejected), its finish back-dated."""
    customer = CustomerFactory()
    job = enqueue(HANDLER, customer)
    if rejected:
        customer.delete()
    job = run(job)
    assert job.status == (Status.REJECTED if rejected else Status.SUCCEEDED)
    Job.objects.filter(pk=job.pk).update(
        finished_at=timezone.now() - timedelta(minutes=minutes_ago)
    )
    return job


def _finished_at(moment: datetime, *, rejected: bool = False) -> Job:
    """A job written finished at ``moment``: the roll-up counts an outcome in the period it was
    written (a later edit of ``finished_at`` moves nothing), so the row is inserted finished."""
    queued = enqueue(HANDLER, CustomerFactory())
    Job.objects.filter(pk=queued.pk).delete()  # unfinished: never counted
    job = queued
    job.pk = None
    job.status = Status.REJECTED if rejected else Status.SUCCEEDED
    job.reason = Job.Reason.SOURCE_DELETED if rejected else Job.Reason.NONE
    job.finished_at = moment
    job.save(force_insert=True)
    return job


def _retry_waiting_head(delay: timedelta) -> tuple[Job, Any]:
    """A lane head waiting to retry (a delayed head), due again after ``delay``."""
    customer = CustomerFactory()
    head = enqueue(HANDLER, customer)
    record_outcome(claim(head), Status.RETRY_WAIT, Job.Reason.TRANSIENT, retry_in=delay)
    head.refresh_from_db()
    assert head.status == Status.RETRY_WAIT
    return head, customer


def test_dashboard__says_why_each_waiting_job_waits(staff_client: Client) -> None:
    now = timezone.now()
    delayed = enqueue(HANDLER, CustomerFactory(), run_after=now + timedelta(hours=1))
    head, customer = _retry_waiting_head(timedelta(minutes=10))
    behind = [enqueue(HANDLER, customer) for _ in range(4)]
    overdue = enqueue(HANDLER, CustomerFactory())
    late = now - 3 * tombstone_settings.LEASE
    Job.objects.filter(pk=overdue.pk).update(run_after=late, queued_at=late, created_at=late)
    fresh = enqueue(HANDLER, CustomerFactory())

    context, html = _page(staff_client)
    why = {w.job.pk: w for w in context["waiting_jobs"]}
    assert context["waiting_total"] == 8
    assert (why[delayed.pk].kind, why[delayed.pk].at) == ("delayed", delayed.run_after)
    assert why[head.pk].kind == "delayed"  # its retry is due later
    assert why[head.pk].text == "retry due at"
    for job in behind:
        assert why[job.pk].kind == "behind"
        assert why[job.pk].blocker.pk == head.pk
    assert why[overdue.pk].kind == "overdue"
    assert why[fresh.pk].kind == "due"
    # The page says it in words, with a link to the job in front.
    assert f'data-job="{behind[0].pk}" data-why="behind"' in html
    assert (
        f'behind job <a href="{reverse("admin:tombstones_job_change", args=(head.pk,))}">' in html
    )
    assert f'data-job="{delayed.pk}" data-why="delayed"' in html
    assert "overdue: no worker took it" in html


def test_dashboard__a_delayed_head_with_jobs_behind_is_a_blocked_lane(
    staff_client: Client,
) -> None:
    head, customer = _retry_waiting_head(timedelta(minutes=10))
    for _ in range(4):
        enqueue(HANDLER, customer)
    enqueue(HANDLER, CustomerFactory())  # a lone fresh job blocks nothing

    context, html = _page(staff_client)
    lanes = context["blocked_lanes"]
    assert [(lane.head.pk, lane.behind) for lane in lanes] == [(head.pk, 4)]
    assert "No lane is blocked" not in html


def test_dashboard__a_queued_delayed_head_blocks_only_when_jobs_wait_behind_it(
    staff_client: Client,
) -> None:
    now = timezone.now()
    customer = CustomerFactory()
    head = enqueue(HANDLER, customer, run_after=now + timedelta(minutes=5))
    assert dashboard.blocked_lanes() == []  # alone: just delayed
    later = enqueue(HANDLER, customer, run_after=now + timedelta(minutes=6))
    lanes = dashboard.blocked_lanes()
    assert [(lane.head.pk, lane.behind) for lane in lanes] == [(head.pk, 1)]
    context, _ = _page(staff_client)
    assert {w.job.pk: w.kind for w in context["waiting_jobs"]} == {
        head.pk: "delayed",
        later.pk: "delayed",
    }


def test_dashboard__oldest_due_job_and_its_age(staff_client: Client) -> None:
    context, html = _page(staff_client)
    assert context["oldest_due"] is None
    assert "none is due" in html

    newer = enqueue(HANDLER, CustomerFactory())
    older = enqueue(HANDLER, CustomerFactory())
    ten = timezone.now() - timedelta(minutes=10)
    Job.objects.filter(pk=older.pk).update(run_after=ten, queued_at=ten)
    enqueue(HANDLER, CustomerFactory(), run_after=timezone.now() + timedelta(hours=1))  # not due

    context, html = _page(staff_client)
    oldest = context["oldest_due"]
    assert oldest["job"].pk == older.pk
    assert timedelta(minutes=10) <= oldest["age"] < timedelta(minutes=11)
    assert format_duration(oldest["age"]).startswith("10 min")
    assert f"#{older.pk}</a>, due since" in html
    assert newer.pk != older.pk


def test_dashboard__next_sweep_from_the_schedule(staff_client: Client) -> None:
    Schedule.objects.filter(name=dashboard.SWEEP_SCHEDULE).delete()
    context, html = _page(staff_client)
    assert context["next_sweep"] is None
    assert "no schedule" in html

    at = timezone.now() + timedelta(seconds=42)
    Schedule.objects.create(
        name=dashboard.SWEEP_SCHEDULE,
        func="tombstones.worker.run_sweep",
        schedule_type=Schedule.MINUTES,
        minutes=3,
        repeats=-1,
        next_run=at,
    )
    context, html = _page(staff_client)
    assert context["next_sweep"] == {"next_run": at, "minutes": 3}
    assert "(every 3 min)" in html
    assert timezone.localtime(at).strftime("%H:%M:%S") in html
    assert "overdue" not in html.split('id="next-sweep"')[1].split("</div>")[0]

    Schedule.objects.filter(name=dashboard.SWEEP_SCHEDULE).update(
        next_run=timezone.now() - timedelta(minutes=5)
    )
    _, html = _page(staff_client)
    assert "overdue" in html.split('id="next-sweep"')[1].split("</div>")[0]


def test_dashboard__throughput_in_the_last_minute_and_hour(staff_client: Client) -> None:
    _finished(0.2)
    _finished(30)
    _finished(30, rejected=True)
    _finished(90)
    enqueue(HANDLER, CustomerFactory())  # unfinished: not counted
    context, html = _page(staff_client)
    assert context["throughput"] == {"minute": 1, "hour": 3}
    assert '<div class="tg-card" id="throughput-hour"><span class="n">3</span>' in html


def test_dashboard__outcomes_by_hour_and_by_day_by_status(staff_client: Client) -> None:
    now = timezone.localtime()
    hour = now.replace(minute=0, second=0, microsecond=0)
    noon = now.replace(hour=12, minute=0, second=0, microsecond=0)
    three_hours_ago = hour - timedelta(hours=3) + timedelta(minutes=1)
    for moment, rejected in (
        (hour, False),  # this hour
        (hour, True),
        (three_hours_ago, False),
        (noon - timedelta(days=3), False),  # three days ago: in the daily chart only
        (noon - timedelta(days=20), False),  # beyond both charts
    ):
        _finished_at(moment, rejected=rejected)

    context, html = _page(staff_client)
    hourly, daily = context["outcomes_by_hour"], context["outcomes_by_day"]
    assert len(hourly["bars"]) == dashboard.CHART_HOURS
    assert len(daily["bars"]) == dashboard.CHART_DAYS
    assert hourly["total"] == 3
    assert daily["total"] == 4
    current = hourly["bars"][-1]
    assert {s["status"]: s["n"] for s in current["segments"]} == {"succeeded": 1, "rejected": 1}
    assert hourly["bars"][-4]["total"] == 1
    assert hourly["bars"][-4]["label"] == three_hours_ago.strftime("%H")
    assert daily["bars"][-1]["total"] == (3 if three_hours_ago.date() == now.date() else 2)
    assert daily["bars"][-4]["total"] == 1
    assert '<svg class="tg-svg" id="outcomes-by-hour"' in html
    assert '<svg class="tg-svg" id="outcomes-by-day"' in html
    assert 'data-status="rejected" data-count="1"' in html
    # Bars stack: a bar's segments sum to its total.
    for bar in hourly["bars"] + daily["bars"]:
        assert sum(s["n"] for s in bar["segments"]) == bar["total"]


def test_dashboard__the_charts_read_the_rollup_never_the_ledger() -> None:
    """The outcome charts are a few hundred roll-up rows whatever the ledger holds: they read
    the ledger's finished jobs (615 ms of a 638 ms dashboard at a million jobs, 4.3 s at ten
    million: a date filter no index could serve)."""
    for minutes in (1, 90, 60 * 30):
        _finished_at(timezone.now() - timedelta(minutes=minutes))
    now = timezone.now()
    with CaptureQueriesContext(connection) as captured:
        hourly = dashboard.outcomes_by_hour(now)
        daily = dashboard.outcomes_by_day(now)
    assert sum(sum(c.values()) for _, c in hourly) == 2
    assert sum(sum(c.values()) for _, c in daily) == 3
    assert captured.captured_queries, "the charts read nothing?"
    ledger = [q["sql"] for q in captured.captured_queries if "tombstones_job" in q["sql"]]
    assert ledger == []


def test_dashboard__live_workers_and_the_metrics_link_for_who_may_read_it(
    staff_client: Client,
) -> None:
    from tombstones.jobs import beats, queues

    context, html = _page(staff_client)
    assert context["live_workers"] == 0
    assert "is a qcluster running?" in html
    assert context["metrics_url"] is None  # staff without view_metrics
    assert 'id="metrics-link"' not in html

    beats.beat(queues.home_cluster(), name="host-a:1")
    beats.beat(queues.home_cluster(), name="host-a:2")
    user = User.objects.get(username="operator")
    user.user_permissions.add(Permission.objects.get(codename="view_metrics"))
    staff_client.force_login(user)
    context, html = _page(staff_client)
    assert context["live_workers"] == 2
    assert f'<a href="{reverse("tombstones:metrics")}" id="metrics-link">' in html
    assert staff_client.get(reverse("tombstones:metrics")).status_code == 200
