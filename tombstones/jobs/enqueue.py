"""Enqueue: check, then one INSERT (the ledger's) snapshots (record, generation, version) in the
caller's transaction, then wake a worker once it commits."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import connections, models, router, transaction

from . import ledger, queues
from .ledger import insert_job, insert_jobs
from .models import PLAIN_LANE_PREFIX, Job
from .queues import DEFAULT
from .validation import (
    Checked,
    check_enqueue,
    check_lane,
    check_plain_enqueue,
    check_priority,
)
from .wakeups import wake, wake_soon

__all__ = ["default_lane", "enqueue", "enqueue_many", "enqueue_plain", "wake", "wake_soon"]


def default_lane(record: models.Model) -> str:
    """The default ordering key: ``app_label.model:pk``."""
    return f"{record._meta.label_lower}:{record.pk}"


def enqueue(
    handler: str,
    record: models.Model,
    *,
    params: dict[str, Any] | None = None,
    ordering_key: str | None = None,
    run_after: datetime | None = None,
    using: str | None = None,
    priority: int = 0,
    queue: str = DEFAULT,
) -> Job:
    """Queue a fenced job for ``record`` and wake a worker once the caller's transaction commits.

    Every check runs before any SQL (:mod:`tombstones.validation`), so a refusal leaves the
    caller's transaction usable: UnknownHandler, NotATombstoneModel, MissingFence, RecordDeleted,
    InvalidOrderingKey, InvalidRunAfter, InvalidParams, InvalidPriority, UnknownQueue.

    ``priority`` (-100 to 100): among due lanes, a claim looks first at those with a job of a
    higher priority; a lane's own order never changes. ``queue``: a named queue
    (:mod:`.queues`), run by the workers that serve it; the record's lane there is the queue's
    own.
    """
    checked = check_enqueue(
        handler, record, params=params, ordering_key=ordering_key, run_after=run_after
    )
    check_priority(priority)
    lane = check_lane(queue, ordering_key or default_lane(record))
    db = using or router.db_for_write(Job)
    fields = _job_fields(db, record, checked, lane, priority, queue)  # refused before any SQL
    coalescing = checked.handler.coalescing
    if coalescing is None:
        job = insert_job(db, run_after=run_after, **fields)
    else:
        job = ledger.coalesce.insert_newest(db, coalescing, run_after=run_after, **fields)
    wake_after_commit(db, job.pk, queue)
    return job


def _job_fields(
    db: str, record: models.Model, checked: Checked, lane: str, priority: int, queue: str
) -> dict[str, Any]:
    """A checked fenced job's columns, its coalescing key included (InvalidParams for a key
    function that returns no str: before any SQL)."""
    found = checked.handler
    fields: dict[str, Any] = {
        "handler": found.name,
        "content_type": ContentType.objects.db_manager(db).get_for_model(record),
        "object_id": str(checked.pk),
        "generation": checked.generation,
        "version": checked.version,
        "lane": lane,
        "params": checked.params,
        "external": found.external,
        "priority": priority,
        "queue": queue,
    }
    if found.coalescing is not None:
        fields["coalesce_key"] = found.coalescing.key_for(checked.params)
    return fields


def enqueue_plain(
    handler: str,
    *,
    params: dict[str, Any] | None = None,
    run_after: datetime | None = None,
    using: str | None = None,
    priority: int = 0,
    queue: str = DEFAULT,
) -> Job:
    """Queue a plain job: for no record, so no fence, and a lane of its own (it runs in
    parallel with every other job of its queue); the same leases, retries, retention and
    privacy rules. Its handler must run plain jobs (a task's does); MissingFence otherwise."""
    found, clean = check_plain_enqueue(handler, params=params, run_after=run_after)
    check_priority(priority)
    queues.check(queue)
    db = using or router.db_for_write(Job)
    job = insert_job(
        db,
        handler=found.name,
        content_type=None,
        object_id="",
        generation=None,
        version=None,
        lane=plain_lane(),
        params=clean,
        external=found.external,
        run_after=run_after,
        priority=priority,
        queue=queue,
    )
    wake_after_commit(db, job.pk, queue)
    return job


def plain_lane() -> str:
    """A plain job's lane: its own (no other job shares it, so nothing waits on it)."""
    return f"{PLAIN_LANE_PREFIX}{uuid.uuid4().hex}"


def wake_after_commit(db: str, job_id: int, queue: str = DEFAULT) -> None:
    """Wake a worker of ``queue``'s cluster once the caller's transaction commits: one wake-up
    per transaction and cluster, not per job (each is a broker round trip).

    A wake-up already registered serves this job too (told of its queue), and moves to the
    end of the callbacks (with the savepoints it was registered in). Django drops a callback
    only when a savepoint it was registered in rolls back; each of those is still open around
    this call, or was released into one that is: either way its rollback drops this job as
    well.
    """
    conn = connections[db]
    if conn.in_atomic_block:
        pending = conn.run_on_commit
        for n, entry in enumerate(pending):
            if isinstance(entry[1], _Wake):
                entry[1].queues.setdefault(queue, job_id)
                # Last, after what this enqueue's caller registered before it (a task's
                # task_enqueued): every job of the transaction is announced before one runs.
                pending.append(pending.pop(n))
                return
    transaction.on_commit(_Wake({queue: job_id}), using=db)


class _Wake:
    """The after-commit callback of an enqueue (a class: :func:`wake_after_commit` finds it):
    a wake-up for each cluster the transaction's queues go to, named by its first job. The
    clusters are read here, once per transaction, not at each enqueue."""

    def __init__(self, first: dict[str, int]) -> None:
        self.queues = first  # each queue of the transaction's jobs, and its first job

    def __call__(self) -> None:
        clusters: dict[str, int] = {}
        for queue, job_id in self.queues.items():
            clusters.setdefault(queues.cluster_of(queue), job_id)
        for cluster, job_id in clusters.items():
            wake_soon(job_id, cluster=cluster)


def enqueue_many(
    handler: str,
    records: Iterable[models.Model],
    *,
    params: dict[str, Any] | None = None,
    ordering_key: str | None = None,
    run_after: datetime | None = None,
    using: str | None = None,
    priority: int = 0,
    queue: str = DEFAULT,
) -> list[Job]:
    """Queue one fenced job per record, as :func:`enqueue` would queue each in turn, in one
    INSERT, with one wake-up once the caller's transaction commits.

    The same snapshots, lanes and refusals: every record is checked before any SQL, and one
    refusal refuses them all (nothing is queued). Jobs of one lane (the same record twice, or an
    ``ordering_key`` shared by all) take their places in the order given. ``params`` go to
    every job, checked against each record.
    """
    check_priority(priority)
    queues.check(queue)
    db = using or router.db_for_write(Job)
    rows: list[dict[str, Any]] = []
    coalescing = None
    for record in records:
        checked = check_enqueue(
            handler, record, params=params, ordering_key=ordering_key, run_after=run_after
        )
        lane = check_lane(queue, ordering_key or default_lane(record))
        rows.append(_job_fields(db, record, checked, lane, priority, queue))
        coalescing = checked.handler.coalescing
    if not rows:
        return []
    if coalescing is None:
        jobs = insert_jobs(db, rows, run_after=run_after)
    else:
        # Each job supersedes the ones before it, those of this call included: one at a time.
        with transaction.atomic(using=db, savepoint=False):
            jobs = [
                ledger.coalesce.insert_newest(db, coalescing, run_after=run_after, **fields)
                for fields in rows
            ]
    wake_after_commit(db, jobs[0].pk, queue)
    return jobs
