"""Helpers for job tests: throwaway handlers and a way to run one job through the real worker."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection, transaction
from django.db.models import Value
from django.db.models.functions import Now

from tombstones import worker
from tombstones.jobs import ledger, registry
from tombstones.models import Job

# What an operator (staff with every job action) is granted in the tombstones app.
STAFF_CODENAMES = (
    "view_job",
    "view_jobevent",
    "view_rejection",
    "view_dashboard",
    "resolve_job",
    "resume_job",
    "cancel_job",
    "skip_lane_head",
)


JOIN_TIMEOUT = 30  # seconds: a hung race fails instead of hanging the suite


def run_together(*actions: Callable[[], Any]) -> list[Any]:
    """Run each action in its own thread (its own connection), released together by a barrier.

    Returns each action's result, or the exception it raised; a thread still running after
    JOIN_TIMEOUT fails the test.
    """
    barrier = threading.Barrier(len(actions), timeout=JOIN_TIMEOUT)
    results: list[Any] = [None] * len(actions)

    def worker(index: int, action: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[index] = action()
        except Exception as exc:  # noqa: BLE001 - handed back to the test, which asserts on it
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i, a)) for i, a in enumerate(actions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a racing thread hung"
    return results


def succeeded(results: list[Any]) -> list[Any]:
    """The results of run_together, re-raising the first exception an action raised."""
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


@contextmanager
def temp_handler(
    name: str, func: Callable[[Any], Any], **options: Any
) -> Iterator[Callable[[Any], Any]]:
    registry.handler(name, **options)(func)
    try:
        yield func
    finally:
        registry.unregister(name)


@contextmanager
def caught(signal: Any) -> Iterator[list[Any]]:
    """The ``task_result`` of each ``signal`` sent while the block runs, in order."""
    got: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        got.append(task_result)

    signal.connect(receiver)
    try:
        yield got
    finally:
        signal.disconnect(receiver)


def run(job: Job) -> Job:
    """Run the production worker task (it runs every due lane head, this job's if it is due)
    and reload the job."""
    worker.run(job.pk)
    job.refresh_from_db()
    return job


def job_of(result: Any) -> Job:
    """The job behind a task's result (its id is the job's)."""
    return Job.objects.get(pk=int(result.id))


def make_due(job: Job) -> None:
    """Back-date run_after instead of sleeping through a backoff (and its lane's hint, which
    comes due with it: a retry's ``ready_at`` is its ``run_after``)."""
    from datetime import timedelta

    back = Now() - Value(timedelta(seconds=1))
    Job.objects.filter(pk=job.pk).update(run_after=back, ready_at=back)


def events(job: Job) -> list[str]:
    """The job's trail as the ledger holds it now (a plain success keeps it in its row)."""
    job.refresh_from_db()
    return [ev.event for ev in job.history()]


def redis_url() -> str:
    from django.conf import settings

    return getattr(settings, "REDIS_URL", "") or "redis://127.0.0.1:6379/0"


def redis_client() -> Any:
    """A client of the Redis server the suite uses (skipped without one, failed in CI)."""
    import os

    import pytest
    import redis

    url = redis_url()
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.RedisError:
        if os.environ.get("CI"):
            raise  # CI starts Redis: its absence is a failure there, not a skip
        pytest.skip(f"needs a Redis server at {url}")
    return client


def redis_broker(client: Any, name: str) -> Any:
    """django-q2's Redis broker for queue ``name`` on this client (not Conf.REDIS's)."""
    from django_q.brokers.redis_broker import Redis

    broker = Redis.__new__(Redis)
    broker.connection, broker.list_key, broker._info = client, f"django_q:{name}:q", None
    return broker


def try_claim(job: Job, *, using: str | None = None) -> ledger.Claim | None:
    """Claim this one job through the production claim; None when it is not claimable now."""
    found = ledger.claim(1, ids=[job.pk], using=using)
    return found if found is not None and found.jobs else None


def claim(job: Job, *, using: str | None = None) -> ledger.Claim:
    """Claim this one job through the production claim (it must be claimable now)."""
    found = try_claim(job, using=using)
    assert found is not None, "not claimable"
    assert [j.pk for j in found.jobs] == [job.pk]
    return found


def record(claim: ledger.Claim, status: str, reason: str = "", **fields: Any) -> None:
    """Record an outcome for a claimed job as the worker does (one transaction)."""
    with transaction.atomic(using=claim.using):
        ledger.write_outcomes(claim, [ledger.Outcome(claim.jobs[0], status, reason, **fields)])


def rollup_counts() -> dict[tuple[Any, str, str], int]:
    """The outcome roll-up's counts by (period, status, reason), its rows folded or not."""
    from tombstones.jobs.models import OutcomeRollup

    counts: dict[tuple[Any, str, str], int] = {}
    for period, status, reason, n in OutcomeRollup.objects.values_list(
        "period", "status", "reason", "jobs"
    ):
        counts[period, status, reason] = counts.get((period, status, reason), 0) + n
    return counts


def seed_queued(n: int, prefix: str = "backlog", hinted_at: str = "NOW()") -> None:
    """``n`` queued jobs of their own lanes (``prefix:1`` ...), hinted as an enqueue leaves them
    or at ``hinted_at`` (an SQL expression of ``g``, the job's number): SQL, fast. PostgreSQL."""
    from django.contrib.contenttypes.models import ContentType

    from project.customers.models import Customer

    ct = ContentType.objects.get_for_model(Customer).pk
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tombstones_job (handler, content_type_id, object_id, generation, version, "
            "lane, status, reason, error_class, params, attempts, rereads, external, owner, "
            "claim_token, ready_at) SELECT 'bench.touch', %s, g::text, 1, 1, %s || ':' || g, "
            f"'queued', '', '', '{{}}'::jsonb, 0, 0, false, '', '', {hinted_at} "
            "FROM generate_series(1, %s) AS g",
            [ct, prefix, n],
        )
