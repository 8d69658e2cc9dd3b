"""Operating it (issue 37): the Prometheus metrics read from the ledger and who may read them,
the health command's verdict on each problem, the fields of the engine's log lines, and no
planted personal value in any of it. SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db.models import Value
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import run, temp_handler
from tombstones.conf import tombstone_settings
from tombstones.jobs import beats, queues
from tombstones.jobs.states import TERMINAL
from tombstones.models import Job

pytestmark = pytest.mark.django_db

Status = Job.Status
HANDLER = "customers.update_sheet_row"
PLANTED = "Zq-Planted-7f3e"  # a personal value no output may carry
TOKEN = "s3cret-metrics-token-0123456789"
ROOT = Path(__file__).resolve().parents[2]


def _scrape(client: Client, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get(reverse("tombstones:metrics"), **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    text = response.content.decode()
    assert PLANTED not in text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def _value(metrics: dict[Any, float], name: str, **labels: str) -> float:
    return metrics[name, tuple(sorted(labels.items()))]


def _planted_customer(n: int = 0) -> Customer:
    return CustomerFactory(name=f"{PLANTED} {n}", email=f"{PLANTED.lower()}{n}@example.com")


def _backdate_hints(seconds: int) -> None:
    back = Now() - Value(timedelta(seconds=seconds))
    Job.objects.filter(status=Status.QUEUED).update(ready_at=back, run_after=back)


@pytest.fixture
def superuser_client(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("root-metrics", password="x"))
    return client


# --- the metrics page --------------------------------------------------------------------------


def test_metrics__match_the_ledger_after_real_jobs(
    superuser_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    customers = [_planted_customer(n) for n in range(5)]
    with django_capture_on_commit_callbacks(execute=True):
        ran = [tombstones.enqueue(HANDLER, c) for c in customers[:3]]
        Customer.objects.filter(pk=customers[0].pk).delete()  # its job is rejected
        for job in ran:
            run(job)
    # Two jobs left queued (no wake-up ran them), due a minute ago; one uncertain for staff.
    waiting = [tombstones.enqueue(HANDLER, c) for c in customers[3:]]
    _backdate_hints(60)
    Job.objects.filter(pk=waiting[1].pk).update(
        status=Status.UNCERTAIN, reason=Job.Reason.OUTCOME_UNKNOWN, finished_at=Now()
    )
    beats.beat(queues.home_cluster(), name="host-a:1")
    beats.beat(queues.home_cluster(), name="host-a:2")
    beats.beat("another-cluster", name="host-b:1")
    beats.WorkerBeat.objects.filter(name="host-b:1").update(
        beat_at=Now() - Value(timedelta(seconds=45))
    )

    metrics = _scrape(superuser_client)

    by_status = Counter(Job.objects.values_list("status", flat=True))
    for status in (*Job.UNFINISHED, Status.UNCERTAIN, Status.ESCALATED):
        assert (
            _value(metrics, "tombstones_jobs", queue="default", status=status) == by_status[status]
        ), status
    assert _value(metrics, "tombstones_jobs", queue="default", status="queued") == 1
    finished = Counter(Job.objects.filter(status__in=TERMINAL).values_list("status", "reason"))
    outcomes = {
        (dict(labels)["status"], dict(labels)["reason"]): value
        for (name, labels), value in metrics.items()
        if name == "tombstones_job_outcomes_total"
    }
    assert outcomes == finished
    assert outcomes[Status.REJECTED, Job.Reason.SOURCE_DELETED] == 1
    assert outcomes[Status.SUCCEEDED, ""] == 2
    assert 59 <= _value(metrics, "tombstones_oldest_due_seconds", queue="default") < 600
    assert _value(metrics, "tombstones_lanes", queue="default", status="queued") == 1
    assert _value(metrics, "tombstones_workers", cluster=queues.home_cluster()) == 2
    assert _value(metrics, "tombstones_workers", cluster="another-cluster") == 0
    assert _value(metrics, "tombstones_broker_up", cluster=queues.home_cluster()) == 1
    last = _value(
        metrics,
        "tombstones_worker_last_heartbeat_timestamp_seconds",
        cluster="another-cluster",
        worker="host-b:1",
    )
    newest = _value(
        metrics,
        "tombstones_worker_last_heartbeat_timestamp_seconds",
        cluster=queues.home_cluster(),
        worker="host-a:1",
    )
    assert 40 <= newest - last <= 60
    # The three jobs that ran, from due to start.
    assert _value(metrics, "tombstones_start_latency_jobs") == 3
    assert _value(metrics, "tombstones_start_latency_seconds", quantile="0.5") >= 0


def test_metrics__outcome_counters_stay_when_jobs_are_purged(
    superuser_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        run(tombstones.enqueue(HANDLER, CustomerFactory()))
    before = _value(
        _scrape(superuser_client), "tombstones_job_outcomes_total", status="succeeded", reason=""
    )
    Job.objects.all().delete()
    after = _scrape(superuser_client)
    assert before == 1
    assert _value(after, "tombstones_job_outcomes_total", status="succeeded", reason="") == 1
    assert _value(after, "tombstones_start_latency_jobs") == 0


def test_metrics__start_latency_counts_the_last_five_minutes_only(
    superuser_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        jobs = [run(tombstones.enqueue(HANDLER, CustomerFactory())) for _ in range(3)]
    # One waited 40 s from due to start; one finished ten minutes ago (out of the window).
    Job.objects.filter(pk=jobs[0].pk).update(run_after=Now() - Value(timedelta(seconds=40)))
    Job.objects.filter(pk=jobs[1].pk).update(finished_at=Now() - Value(timedelta(minutes=10)))
    metrics = _scrape(superuser_client)
    assert _value(metrics, "tombstones_start_latency_jobs") == 2
    assert 39 <= _value(metrics, "tombstones_start_latency_seconds", quantile="0.99") < 60
    assert _value(metrics, "tombstones_start_latency_seconds", quantile="0.5") < 39


def test_metrics__named_queues_have_their_own_series(
    superuser_client: Client, settings: Any
) -> None:
    settings.TOMBSTONES_QUEUES = {"reports": "reports-cluster"}
    tombstones.enqueue(HANDLER, CustomerFactory(), queue="reports")
    metrics = _scrape(superuser_client)
    assert _value(metrics, "tombstones_jobs", queue="reports", status="queued") == 1
    assert _value(metrics, "tombstones_jobs", queue="default", status="queued") == 0
    assert _value(metrics, "tombstones_workers", cluster="reports-cluster") == 0


def test_metrics__refused_to_anonymous_and_to_staff_without_the_permission(
    client: Client, settings: Any
) -> None:
    url = reverse("tombstones:metrics")
    anonymous = client.get(url)
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    assert b"tombstones_jobs" not in anonymous.content
    # No token configured: a bearer token reads nothing.
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 401

    staff = User.objects.create_user("staff-metrics", password="x", is_staff=True)
    client.force_login(staff)
    assert client.get(url).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_metrics"))
    client.force_login(User.objects.get(pk=staff.pk))  # a fresh permission cache
    assert client.get(url).status_code == 200
    client.logout()

    settings.TOMBSTONES_METRICS_TOKEN = TOKEN
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}x").status_code == 401
    assert client.get(url, HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401
    assert client.get(url).status_code == 401
    assert client.post(url, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


@pytest.mark.parametrize("token", ["short", "with a space in it, long enough", 12345678901234567])
def test_metrics__a_malformed_token_setting_is_a_clear_error(settings: Any, token: Any) -> None:
    settings.TOMBSTONES_METRICS_TOKEN = token
    with pytest.raises(ImproperlyConfigured, match="TOMBSTONES_METRICS_TOKEN"):
        tombstone_settings.METRICS_TOKEN  # noqa: B018 - the property validates
    assert any("METRICS_TOKEN" in error for error in tombstone_settings.validate())


# --- the health command ------------------------------------------------------------------------


def _health(*args: str) -> tuple[int, str]:
    from io import StringIO

    out = StringIO()
    try:
        call_command("tombstones_health", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_health__ok_with_a_live_worker_and_nothing_late() -> None:
    beats.beat(queues.home_cluster(), name="host-a:1")
    tombstones.enqueue(HANDLER, _planted_customer())  # due now, a worker is alive
    code, out = _health()
    assert code == 0, out
    assert out.startswith("ok: 1 live worker(s)")
    assert PLANTED not in out


def test_health__no_live_worker_while_jobs_are_due() -> None:
    tombstones.enqueue(HANDLER, CustomerFactory())
    beats.beat(queues.home_cluster(), name="host-a:1")
    beats.WorkerBeat.objects.update(beat_at=Now() - Value(timedelta(seconds=31)))
    code, out = _health()
    assert code == 1
    assert out.count("FAIL") == 1
    assert f"FAIL workers: no live worker in cluster '{queues.home_cluster()}'" in out
    # Nothing due: a silent cluster is no problem.
    Job.objects.all().delete()
    assert _health()[0] == 0


def test_health__the_oldest_due_job_past_the_threshold() -> None:
    beats.beat(queues.home_cluster(), name="host-a:1")
    tombstones.enqueue(HANDLER, CustomerFactory())
    _backdate_hints(400)
    code, out = _health()
    assert code == 1
    assert "FAIL oldest_due: queue 'default': the oldest due job has waited 40" in out
    assert out.count("FAIL") == 1
    assert _health("--max-wait", "600")[0] == 0


def test_health__jobs_waiting_for_staff(django_capture_on_commit_callbacks: Any) -> None:
    beats.beat(queues.home_cluster(), name="host-a:1")
    jobs = [tombstones.enqueue(HANDLER, CustomerFactory()) for _ in range(3)]
    Job.objects.filter(pk=jobs[0].pk).update(status=Status.UNCERTAIN, finished_at=Now())
    Job.objects.filter(pk=jobs[1].pk).update(status=Status.ESCALATED, finished_at=Now())
    Job.objects.filter(pk=jobs[2].pk).update(status=Status.SUCCEEDED, finished_at=Now())
    code, out = _health("--json")
    report = json.loads(out)
    assert code == 1
    assert report["healthy"] is False
    assert report["awaiting_staff"] == {"escalated": 1, "uncertain": 1}
    assert [p["check"] for p in report["problems"]] == ["awaiting_staff"]
    code, out = _health()
    assert "FAIL awaiting_staff: 1 escalated, 1 uncertain job(s) wait for staff" in out
    code, out = _health("--max-awaiting", "2")
    assert code == 0
    assert out.strip().endswith("2 job(s) wait for staff")


def test_health__the_broker_unreachable(
    monkeypatch: pytest.MonkeyPatch, superuser_client: Client
) -> None:
    from django_q.conf import Conf

    # A real Redis client to a port nothing listens on.
    monkeypatch.setattr(Conf, "BROKER_CLASS", "django_q.brokers.redis_broker.Redis")
    monkeypatch.setattr(Conf, "REDIS", "redis://127.0.0.1:9/0")
    monkeypatch.setattr(Conf, "DJANGO_REDIS", None)
    beats.beat(queues.home_cluster(), name="host-a:1")
    code, out = _health()
    assert code == 1
    assert f"FAIL broker: the broker of cluster '{queues.home_cluster()}' is unreachable" in out
    metrics = _scrape(superuser_client)
    assert _value(metrics, "tombstones_broker_up", cluster=queues.home_cluster()) == 0


@pytest.mark.parametrize(
    ("args", "error"),
    [(["--max-wait", "-1"], "--max-wait"), (["--max-awaiting", "x"], "--max-awaiting")],
)
def test_health__bad_options_are_refused(args: list[str], error: str) -> None:
    with pytest.raises(CommandError, match=error):
        call_command("tombstones_health", *args)


def test_health__the_database_unreachable_exits_non_zero() -> None:
    """The real command in a process of its own, its database a closed port."""
    env = {**os.environ, "DATABASE_URL": "postgres://postgres@127.0.0.1:9/none"}
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "tombstones_health", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert "database" in [p["check"] for p in report["problems"]]


# --- the engine's log lines --------------------------------------------------------------------


def test_logs__each_line_about_a_job_carries_its_fields(
    caplog: pytest.LogCaptureFixture, django_capture_on_commit_callbacks: Any
) -> None:
    caplog.set_level(logging.INFO, logger="tombstones")

    def broken(ctx: Any) -> None:
        raise RuntimeError(f"boom {PLANTED}")

    customer = _planted_customer()
    with temp_handler("t.broken", broken), django_capture_on_commit_callbacks(execute=True):
        failing = run(tombstones.enqueue("t.broken", customer))
        ok = run(tombstones.enqueue(HANDLER, customer))
    lines = [r for r in caplog.records if hasattr(r, "job_id")]
    by_job: dict[int, list[logging.LogRecord]] = {}
    for line in lines:
        by_job.setdefault(line.job_id, []).append(line)  # type: ignore[attr-defined]
    assert failing.status == Status.FAILED
    outcome = [r for r in by_job[failing.pk] if r.job_status == Status.FAILED]  # type: ignore[attr-defined]
    assert outcome, [r.getMessage() for r in by_job[failing.pk]]
    raised = [r for r in by_job[failing.pk] if r.job_reason == Job.Reason.HANDLER_ERROR]  # type: ignore[attr-defined]
    assert raised
    for line in by_job[failing.pk] + by_job[ok.pk]:
        assert line.job_queue == "default"  # type: ignore[attr-defined]
    assert {r.job_handler for r in by_job[failing.pk]} == {"t.broken"}  # type: ignore[attr-defined]
    assert [(r.job_status, r.job_reason) for r in by_job[ok.pk]] == [(Status.SUCCEEDED, "")]  # type: ignore[attr-defined]
    for line in caplog.records:
        rendered = line.getMessage() + json.dumps(vars(line), default=str)
        assert PLANTED not in rendered
        assert PLANTED.lower() not in rendered
