"""Shared helpers of the acceptance tests that start real worker processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import override_settings

from project.stress.cluster import Cluster, database_url, queue_namespace
from project.stress.models import StressEntity
from tombstones.models import Job

ROOT = Path(settings.BASE_DIR)

__all__ = [
    "Cluster",
    "assert_lane_order",
    "backdate_lease",
    "broker_cluster",
    "entity",
    "finished",
    "kill",
    "queue_namespace",
    "quiet_queue",
    "start_worker",
    "wait_for",
]


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, every: float = 0.02) -> Any:
    """Poll until ``predicate()`` is truthy; bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"condition not met within {timeout}s")


def worker_env(queue: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.acceptance.cluster_settings",
            "DATABASE_URL": database_url(),
            "REDIS_URL": getattr(settings, "REDIS_URL", "") or "",
            "Q_NAME": queue,  # wake-ups a worker sends go to a queue no cluster reads
            "Q_SYNC": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def start_worker(
    job_id: int,
    *,
    queue: str,
    crash_at: str = "",
    marker: Path | None = None,
    release: Path | None = None,
) -> subprocess.Popen[str]:
    """A real worker process running one job (see crash_worker.py)."""
    extra = {"CRASH_AT": crash_at}
    if marker is not None:
        extra["CRASH_MARKER"] = str(marker)
    if release is not None:
        extra["CRASH_RELEASE"] = str(release)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.acceptance.crash_worker", str(job_id)],
        cwd=str(ROOT),
        env=worker_env(queue, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"worker exited {proc.returncode}:\n{err[-3000:]}")
    return out


def kill(proc: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
    if sig == signal.SIGKILL:
        proc.communicate(timeout=10)


def backdate_lease(*job_ids: int) -> int:
    """Expire leases without sleeping: move lease_expires_at into the past (database clock)."""
    return Job.objects.filter(pk__in=job_ids, status=Job.Status.RUNNING).update(
        lease_expires_at=Now() - timedelta(seconds=1)
    )


def entity(key: str) -> StressEntity:
    return StressEntity.all_objects.recreate(key=key, payload=f"{key}-initial")


@contextlib.contextmanager
def quiet_queue() -> Iterator[str]:
    """Wake-ups of this test go to a queue of their own that no cluster reads."""
    name = f"quiet-{uuid.uuid4().hex[:10]}"
    with queue_namespace(name), override_settings(TOMBSTONES_Q_OPTIONS={}):
        try:
            yield name
        finally:
            _drop_queue(name)


def _drop_queue(name: str) -> None:
    redis_url = getattr(settings, "REDIS_URL", "")
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        client.delete(f"django_q:{name}:q")
        client.close()
    else:
        from django_q.models import OrmQ

        with contextlib.suppress(Exception):  # the test database may already be flushed
            OrmQ.objects.filter(key=name).delete()


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def assert_lane_order(records: list[StressEntity], jobs: list[Job]) -> None:
    """Each record's writes (stress.apply's AppliedWrite rows) came in its jobs' id order."""
    from project.stress.models import AppliedWrite

    for record in records:
        order = list(
            AppliedWrite.objects.filter(key=record.key)
            .order_by("id")
            .values_list("job_id", flat=True)
        )
        assert order == sorted(j.pk for j in jobs if j.object_id == str(record.pk))


@contextlib.contextmanager
def broker_cluster(workers: int, **env: str) -> Iterator[Cluster]:
    """A real qcluster on this run's pair: PostgreSQL + Redis, or SQLite + the ORM broker.

    No sweep schedule: only wake-ups and timers can run the jobs. This process's wake-ups go to
    the cluster's queue, through the same kind of broker.
    """
    from django_q.models import Schedule

    from tests.jobkit import redis_broker, redis_client, redis_url
    from tombstones.jobs import wakeups

    Schedule.objects.all().delete()
    client = None
    if is_postgres():
        client = redis_client()
        env = {"REDIS_URL": redis_url(), **env}
    cluster = Cluster(workers, settings_module="tests.acceptance.cluster_settings", env=env)
    key = (os.getpid(), cluster.name)
    if client is not None:
        cluster.broker = redis_broker(client, cluster.name)
    try:
        with override_settings(TOMBSTONES_Q_OPTIONS={}), cluster, cluster.messages():
            if client is not None:  # after override_settings, which forgets the brokers
                wakeups._brokers[key] = cluster.broker
            yield cluster
    finally:
        wakeups._brokers.pop(key, None)
        if client is not None:
            for suffix in ("", ":tombstones:gate", ":tombstones:helper"):
                client.delete(f"{cluster.broker.list_key}{suffix}")


def finished(*jobs: Job) -> bool:
    return not Job.objects.filter(pk__in=[j.pk for j in jobs], status__in=Job.UNFINISHED).exists()
