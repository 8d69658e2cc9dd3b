"""Operating a real cluster (issue 37): its worker processes beat, the metrics page counts them
and the jobs they ran, the health command passes while they live and names the problem once
they are killed with jobs due. PostgreSQL + Redis, or SQLite + the ORM broker."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from tombstones.jobs import beats
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job

from .helpers_cluster import broker_cluster, entity, finished, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

WORKERS = 2
JOBS = 30


def _metrics() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    client = Client()
    client.force_login(User.objects.create_superuser(f"m{time.monotonic_ns()}", password="x"))
    text = client.get(reverse("tombstones:metrics")).content.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _health(*args: str) -> tuple[int, dict[str, object]]:
    out = StringIO()
    try:
        call_command("tombstones_health", "--json", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, json.loads(out.getvalue())
    return 0, json.loads(out.getvalue())


def test_monitoring_cluster__beats_metrics_and_health_follow_the_workers() -> None:
    records = [entity(f"M{n}") for n in range(JOBS // 3)]
    with broker_cluster(WORKERS) as cluster:
        name = cluster.name
        # Each worker process beats from its start.
        wait_for(lambda: beats.live().get(name) == WORKERS, timeout=30)
        with transaction.atomic():
            jobs = [enqueue("stress.count", records[n % len(records)]) for n in range(JOBS)]
        wait_for(lambda: finished(*jobs), timeout=90)

        metrics = _metrics()
        assert metrics["tombstones_workers", (("cluster", name),)] == WORKERS
        beaten = [
            value
            for (family, labels), value in metrics.items()
            if family == "tombstones_worker_last_heartbeat_timestamp_seconds"
            and dict(labels)["cluster"] == name
        ]
        assert len(beaten) == WORKERS
        assert all(abs(time.time() - at) < 3 * beats.BEAT_SECONDS for at in beaten)
        succeeded = (("reason", ""), ("status", "succeeded"))
        assert metrics["tombstones_job_outcomes_total", succeeded] >= JOBS
        assert metrics["tombstones_jobs", (("queue", "default"), ("status", "queued"))] == 0
        assert metrics["tombstones_start_latency_jobs", ()] >= JOBS
        code, report = _health()
        assert code == 0, report
        assert report["workers"] == {name: WORKERS}
        # The cluster is gone; a job becomes due with nobody to run it.
        cluster.kill()
        killed_at = time.monotonic()
        with transaction.atomic():
            orphan = enqueue("stress.count", records[0])
        time.sleep(max(0.0, 1.5 - (time.monotonic() - killed_at)))
        # A silence shorter than the beat: the killed workers' last beats are older than it.
        code, report = _health("--worker-silence", "1")
        assert code == 1, report
        assert report["workers"] == {name: 0}
        assert [p["check"] for p in report["problems"]] == ["workers"]
        assert Job.objects.get(pk=orphan.pk).status == Job.Status.QUEUED
