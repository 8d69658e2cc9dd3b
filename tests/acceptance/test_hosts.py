"""More than one host (issue 21), PostgreSQL + Redis: real ``qcluster`` processes, each as if on
a host of its own.

- three clusters with one cluster name (host-a from the start, host-b killed with SIGKILL
  midway while it holds leases, host-c started late) run the race harness: 0 anomalies, no job
  run twice, none lost, and the dead host's jobs are taken back by the other hosts;
- a cluster named through ``Q_CLUSTER_NAME=jobs`` (jobs routed there with
  ``TOMBSTONES_Q_OPTIONS = {"cluster": "jobs"}``) runs every schedule tombstones installs.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import redis
from django.core.management.sql import emit_post_migrate_signal
from django.db import connection
from django.test.utils import override_settings
from django.utils import timezone
from django_q.models import Schedule, Task

from project.stress import harness
from project.stress.cluster import Cluster
from project.stress.hosts import Host, host_of, run_on_hosts
from tests.jobkit import redis_broker, redis_client, redis_url

from .helpers_cluster import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

LEASE = 4.0  # seconds: the dead host's jobs come back a few seconds after it died
NAMED_DB = 13  # the Redis database of the named cluster


@pytest.fixture(autouse=True)
def _cluster_mode(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}


def test_hosts__three_clusters_one_killed_one_late_no_anomaly(postgres_only: None) -> None:
    client = redis_client()
    Schedule.objects.all().delete()  # no sweep: the live hosts' own timers take the leases back
    plan = harness.Plan(entities=30, messages=360, seed=21)
    hosts = [
        Host("host-a", workers=2),
        Host("host-b", workers=2, kill_at=90),
        Host("host-c", workers=2, start_at=40),
    ]
    env = {"REDIS_URL": redis_url(), "TOMBSTONES_LEASE_SECONDS": str(LEASE)}
    name = f"hosts-{uuid.uuid4().hex[:8]}"  # one cluster name for the three hosts
    run = run_on_hosts(
        plan,
        hosts,
        name=name,
        settings_module="tests.acceptance.cluster_settings",
        env=env,
        broker=redis_broker(client, name),
        timeout=120,
    )
    report = run.report
    detail = run.as_dict()
    assert report.completed, detail
    assert report.anomalies == 0, detail
    assert report.breakdown["duplicated_jobs"] == 0
    assert report.breakdown["lost_jobs"] == 0
    assert sum(report.outcomes.values()) == plan.messages
    # host-b died holding leases; each of those jobs was taken back by a live host and ended.
    assert any("host-b killed" in line for line in run.timeline), detail
    assert run.held_at_kill, detail
    assert set(run.rescued_by) == set(run.held_at_kill), detail
    assert {host_of(w) for w in run.rescued_by.values()} <= {"host-a", "host-c"}, detail
    assert set(run.ended_after.values()) <= {
        "succeeded",
        "rejected",
        "uncertain",
        "superseded",
    }, detail
    # Every host delivered, the late one included.
    assert set(run.delivered) == {"host-a", "host-b", "host-c"}, detail


# --- a named cluster ------------------------------------------------------------------------


def test_hosts__a_cluster_named_by_q_cluster_name_runs_every_tombstones_schedule(
    postgres_only: None, tmp_path: Path
) -> None:
    """``Q_CLUSTER_NAME=jobs manage.py qcluster`` with the jobs routed to ``jobs``: django-q2's
    scheduler there fires every schedule whose func is tombstones' (the sweep; the purge when
    installed), and that cluster runs them. A schedule without the cluster's name would never
    fire there (django-q2 fires a schedule without a cluster on the default-named one only)."""
    redis_client()  # skipped without a Redis server
    # A Redis database of its own: another run's tests may use the queue "jobs" on the default
    # one (test_sweep's scheduler test reads it), and this cluster would take their messages.
    url = urlparse(redis_url())._replace(path=f"/{NAMED_DB}").geturl()
    client = redis.Redis.from_url(url)
    prefix = f"named-{uuid.uuid4().hex[:8]}"  # Q_CLUSTER's name: the signing salt of the site
    queue = "jobs"
    with override_settings(TOMBSTONES_Q_OPTIONS={"cluster": queue}):
        Schedule.objects.all().delete()
        emit_post_migrate_signal(0, False, connection.alias)  # what migrate installs
        ours = Schedule.objects.filter(func__startswith="tombstones.")
        funcs = sorted(ours.values_list("func", flat=True))
        assert "tombstones.worker.run_sweep" in funcs
        assert set(ours.values_list("cluster", flat=True)) == {queue}
        ours.update(next_run=timezone.now() - timedelta(seconds=1))
    cluster = Cluster(
        1,
        name=prefix,
        settings_module="tests.acceptance.cluster_settings",
        env={
            "REDIS_URL": url,
            "Q_CLUSTER_NAME": queue,
            "TOMBSTONES_Q_CLUSTER": queue,
        },
        log_path=str(tmp_path / "qcluster.log"),
    )
    key = f"django_q:{queue}:q"
    for suffix in ("", ":tombstones:gate", ":tombstones:helper"):
        client.delete(f"{key}{suffix}")
    cluster.launch()
    try:
        # django-q2's scheduler runs about every 30 s in the cluster's sentinel.
        done = wait_for(lambda: _alive(cluster) and _ran(funcs, queue), timeout=90, every=0.5)
    except TimeoutError:
        pytest.fail(f"schedules did not run on {queue!r}:\n{cluster.log_tail(40)}")
    finally:
        cluster.stop()
        for suffix in ("", ":tombstones:gate", ":tombstones:helper"):
            client.delete(f"{key}{suffix}")
        client.close()
    assert sorted(done) == funcs
    log = Path(cluster.log_path).read_text(errors="replace")
    assert "BadSignature" not in log
    assert "KeyError" not in log


def _alive(cluster: Cluster) -> bool:
    assert cluster.process is not None
    if cluster.process.poll() is not None:
        raise AssertionError(f"qcluster exited:\n{cluster.log_tail(40)}")
    return True


def _ran(funcs: list[str], queue: str) -> list[str] | None:
    """Each func's successful task, run by the cluster ``queue``, or None while one is missing."""
    found = {}
    for func, cluster, ok in Task.objects.filter(func__in=funcs).values_list(
        "func", "cluster", "success"
    ):
        assert cluster == queue, (func, cluster)
        assert ok, func
        found[func] = True
    return sorted(found) if len(found) == len(funcs) else None
