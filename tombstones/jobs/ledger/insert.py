"""Enqueue's statement: one INSERT, and the job row is also the audit record of the enqueue.

Here so that every statement on the job table is the ledger's; :mod:`tombstones.jobs.enqueue`
keeps the checks before it and the wake-up after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import connections, models, transaction
from django.db.models import Value
from django.db.models.expressions import DatabaseDefault
from django.db.models.functions import Greatest, Now
from django.utils import timezone

from .. import tracing
from ..models import PLAIN_LANE_PREFIX, Job
from . import lanes


def insert_job(
    db: str,
    *,
    handler: str,
    content_type: ContentType | None,
    object_id: str,
    generation: int | None,
    version: int | None,
    lane: str,
    params: dict[str, Any],
    external: bool,
    run_after: datetime | None = None,
    priority: int = 0,
    queue: str = "default",
    coalesce_key: str | None = None,
    window_started_at: Any = None,
    due: Any = None,
) -> Job:
    """Insert a queued job (in the caller's transaction if there is one, so a rolled-back request
    leaves no job); see :meth:`.models.Job.enqueued_event`.

    Its lane's row is held from before the INSERT until the commit (:mod:`.lanes`), so that
    its place (the INSERT's time) is behind every job of the lane a claim may have taken.

    ``due``: an expression of the database's clock for when it is due (a debounced job,
    :mod:`.coalesce`), placed as a delayed job is; ``window_started_at`` likewise.
    """
    fields: dict[str, Any] = {
        "handler": handler,
        "content_type": content_type,
        "object_id": object_id,
        "generation": generation,
        "version": version,
        "lane": lane,
        "params": params,
        "external": external,
        "priority": priority,
        "queue": queue,
        "traceparent": tracing.traceparent(),
    }
    if coalesce_key is not None:
        fields["coalesce_key"] = coalesce_key
        fields["window_started_at"] = window_started_at
    if due is not None:
        fields["run_after"] = fields["queued_at"] = fields["ready_at"] = Greatest(due, Now())
    elif run_after is not None:
        # A delayed job takes its place in its lane when it is due; never before now, so that it
        # cannot overtake the jobs queued before it.
        placed = Greatest(Value(run_after, output_field=models.DateTimeField()), Now())
        fields["run_after"] = fields["queued_at"] = fields["ready_at"] = placed
    if not lanes.guarded(db) or lane.startswith(PLAIN_LANE_PREFIX):
        # A plain job's lane is its own: no other enqueue can be placed before or after it.
        job = Job.objects.using(db).create(**fields)
    elif run_after is None and coalesce_key is None and lanes.known(db, lane):
        job = _insert_in_lane(db, fields)
    else:  # a lane's first job here (or a delayed one): its row first, then the job
        with transaction.atomic(using=db, savepoint=False):
            lanes.hold(db, lane)
            job = Job.objects.using(db).create(**fields)
    if due is not None or isinstance(window_started_at, models.Expression):
        job.refresh_from_db(fields=["run_after", "queued_at", "ready_at", "window_started_at"])
    elif run_after is not None:  # the row holds the database's answer; this is close to it
        job.run_after = job.queued_at = max(run_after, timezone.now())
    return job


def _insert_in_lane(db: str, fields: dict[str, Any]) -> Job:
    """One statement (PostgreSQL): the INSERT names its lane through the lane's row, held from
    before the row is formed until the commit (:func:`.lanes.guard_sql`), and takes its place
    once it holds it, behind every job of the lane another session can see."""
    conn = connections[db]
    job = Job(**fields)
    columns, values, params = [], [], []
    for field in Job._meta.local_concrete_fields:
        if field.primary_key:
            continue
        value = field.pre_save(job, add=True)
        columns.append(conn.ops.quote_name(str(field.column)))
        if isinstance(value, DatabaseDefault):
            values.append("DEFAULT")
            continue
        values.append("COALESCE((SELECT key FROM guard), %s)" if field.name == "lane" else "%s")
        params.append(field.get_db_prep_save(value, conn))
    # Its place: once the lane's row is held (a statement's own time is taken before it waits).
    place = columns.index(conn.ops.quote_name("queued_at"))  # a DEFAULT: no parameter of its own
    values[place] = "COALESCE((SELECT clock_timestamp() FROM guard), clock_timestamp())"
    sql = (
        f"WITH {lanes.guard_sql()} INSERT INTO {conn.ops.quote_name(Job._meta.db_table)} "
        f"({', '.join(columns)}) VALUES ({', '.join(values)}) "
        "RETURNING *, (SELECT count(*) FROM guard) AS guarded"
    )
    (inserted,) = Job.objects.db_manager(db).raw(sql, [fields["lane"], *params])
    if not inserted.guarded:  # type: ignore[attr-defined]
        # Its row was gone (the transaction that made it rolled back): made and held now.
        lanes.remember(db, fields["lane"], exists=False)
        lanes.hold(db, fields["lane"])
    inserted.content_type = fields["content_type"]
    return inserted


def insert_jobs(
    db: str, rows: Sequence[dict[str, Any]], *, run_after: datetime | None = None
) -> list[Job]:
    """Insert many queued jobs in one statement (a bulk enqueue), each as :func:`insert_job`
    would: the lanes' rows held first (:func:`.lanes.hold_many`), so that every job's place is
    behind every job of its lane that committed; within a lane, the jobs in the order given
    (one statement's time, then ids in order). Call inside the caller's transaction."""
    if not rows:
        return []
    trace = tracing.traceparent()
    jobs = [Job(**{"traceparent": trace, **fields}) for fields in rows]
    with transaction.atomic(using=db, savepoint=False):
        lanes.hold_many(db, [job.lane for job in jobs])
        if connections[db].vendor == "postgresql":
            made = _insert_unnest(db, jobs, run_after)
        else:
            if run_after is not None:  # as insert_job: its place when due, never before now
                due = Greatest(Value(run_after, output_field=models.DateTimeField()), Now())
                for job in jobs:
                    job.run_after = job.queued_at = job.ready_at = due
            made = Job.objects.using(db).bulk_create(jobs)
    if run_after is not None:  # the row holds the database's answer; this is close to it
        for job in made:
            job.run_after = job.queued_at = max(run_after, timezone.now())
    return made


# Placed by their due time (a delayed bulk enqueue), never before the statement's time.
_TIMED = ("run_after", "queued_at", "ready_at")


def _insert_unnest(db: str, jobs: Sequence[Job], run_after: datetime | None) -> list[Job]:
    """One ``INSERT ... SELECT FROM unnest(...)``: one array per column, so the statement and
    its parameters stay the same size whatever the number of jobs (Django's bulk INSERT
    compiles and binds one parameter per column and row)."""
    conn = connections[db]
    columns, arrays, casts = [], [], []
    for field in Job._meta.local_concrete_fields:
        if field.primary_key or (run_after is not None and field.name in _TIMED):
            continue
        values = [field.pre_save(job, add=True) for job in jobs]
        if all(isinstance(value, DatabaseDefault) for value in values):
            continue  # the column's default, for every row alike
        columns.append(conn.ops.quote_name(str(field.column)))
        arrays.append([field.get_db_prep_save(value, conn) for value in values])
        casts.append(f"%s::{field.db_type(conn)}[]")
    names = [f"c{n}" for n in range(len(columns))]
    picked = [f"u.{name}" for name in names]
    params: list[Any] = list(arrays)
    if run_after is not None:
        for name in _TIMED:
            columns.append(conn.ops.quote_name(name))
            picked.append("GREATEST(%s::timestamptz, STATEMENT_TIMESTAMP())")
            params.append(run_after)
        # The parameters in the statement's order: the SELECT list's come before unnest's.
        params = params[len(arrays) :] + params[: len(arrays)]
    sql = (
        f"INSERT INTO {conn.ops.quote_name(Job._meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(picked)} FROM unnest({', '.join(casts)}) "
        f"WITH ORDINALITY AS u({', '.join(names)}, n) ORDER BY u.n RETURNING *"
    )
    made = sorted(Job.objects.db_manager(db).raw(sql, params), key=lambda job: job.pk)
    for job, given in zip(made, jobs, strict=True):
        job.content_type = given.content_type
    return made
