"""Enqueue's statement: one INSERT, and the job row is also the audit record of the enqueue.

Here so that every statement on the job table is the ledger's; :mod:`tombstones.jobs.enqueue`
keeps the checks before it and the wake-up after it.
"""

from __future__ import annotations

import functools
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
from . import lanes, reading


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
    elif run_after is None and coalesce_key is None:
        job = _insert_in_lane(db, fields)
    else:  # a delayed job (its place is its due time): its lane's row first, then the job
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
    once it holds it, behind every job of the lane another session can see.

    A lane this process has not seen is made in the same statement (``made``: the row is ours,
    unseen by anyone until we commit, so nothing of the lane can be placed around our job). A
    row the statement cannot see (made by a session that committed after it began, or gone
    with a rolled-back transaction) inserts nothing: the row is then held (and made) on its
    own, and the job inserted behind it."""
    lane = fields["lane"]
    job = Job(**fields)
    sql, params, returned = _lane_insert_sql(db, job, make=not lanes.known(db, lane))
    conn = connections[db]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        if row is None:
            lanes.remember(db, lane, exists=False)
            lanes.hold(db, lane)
            sql, params, returned = _lane_insert_sql(db, job, make=False)
            cursor.execute(sql, params)
            row = cursor.fetchone()
    _set_returned(job, db, returned, row)
    lanes.remember(db, lane)
    return job


def _lane_insert_sql(
    db: str, job: Job, *, make: bool
) -> tuple[str, list[Any], list[models.Field[Any, Any]]]:
    """:func:`_insert_in_lane`'s statement, its parameters and the fields it returns: the
    primary key and the columns the database fills (only those: a row of every column through
    a raw queryset cost a fifth of an enqueue)."""
    conn = connections[db]
    given: list[tuple[models.Field[Any, Any], Any]] = []
    defaults: list[str] = []
    for field in Job._meta.local_concrete_fields:
        if field.primary_key or field.name in _PLACED:
            continue
        value = field.pre_save(job, add=True)
        if isinstance(value, DatabaseDefault):
            defaults.append(field.name)
        else:
            given.append((field, value))
    sql, returned = _lane_insert_template(db, make, tuple(defaults))
    params = [field.get_db_prep_save(value, conn) for field, value in given]
    return sql, [job.lane, *([job.lane] if make else []), *params], returned


# Written by the statement itself: the lane's key (from its held row) and the job's place.
_PLACED = ("lane", "queued_at")


@functools.cache
def _lane_insert_template(
    db: str, make: bool, defaults: tuple[str, ...]
) -> tuple[str, list[models.Field[Any, Any]]]:
    """The text of :func:`_lane_insert_sql`, made once per database, kind and set of columns
    left to their defaults (quoting and joining 30 columns took a quarter of an enqueue)."""
    quote = connections[db].ops.quote_name
    columns, values = [], []
    returned: list[models.Field[Any, Any]] = [Job._meta.pk]
    for field in Job._meta.local_concrete_fields:
        if field.primary_key:
            continue
        if field.name in defaults:  # DEFAULT is not allowed in a SELECT list: left out
            returned.append(field)
            continue
        columns.append(quote(str(field.column)))
        if field.name == "lane":
            values.append("held.key")
        elif field.name == "queued_at":
            # Its place: once the lane's row is held (the statement's own time is taken before
            # it waits; the row's values are formed after the lock).
            values.append("clock_timestamp()")
            returned.append(field)
        else:
            values.append("%s")
    ctes = [lanes.guard_sql()]
    held = "SELECT key FROM guard"
    if make:  # the lane's row made here when missing; our own, so none holds it but us
        ctes.append(lanes.make_sql())
        held += " UNION ALL SELECT key FROM made"
    names = ", ".join(quote(str(field.column)) for field in returned)
    sql = (
        f"WITH {', '.join(ctes)} INSERT INTO {quote(Job._meta.db_table)} "
        f"({', '.join(columns)}) SELECT {', '.join(values)} "
        f"FROM ({held}) AS held LIMIT 1 RETURNING {names}"
    )
    return sql, returned


def _set_returned(job: Job, db: str, returned: Sequence[models.Field[Any, Any]], row: Any) -> None:
    """The values an INSERT returned, converted as Django's own INSERT converts them, set on
    the (now saved) instance."""
    _fill(job, db, returned, reading.converters(connections[db], returned), row)


def _fill(
    job: Job,
    db: str,
    returned: Sequence[models.Field[Any, Any]],
    found: reading.Converters,
    row: Any,
) -> None:
    for field, value in zip(returned, reading.converted(row, found, connections[db]), strict=True):
        setattr(job, field.attname, value)
    job._state.adding = False
    job._state.db = db


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
    jobs = _instances([{"traceparent": trace, **fields} for fields in rows])
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
            if run_after is not None:  # the row holds the database's answer; this is close
                for job in made:
                    job.run_after = job.queued_at = job.ready_at = max(run_after, timezone.now())
    return made


def _instances(rows: Sequence[dict[str, Any]]) -> list[Job]:
    """``Job(**fields)`` for each of ``rows``, through the model's positional road (every
    column given in order: a third of the keyword road's time, which looks up each field's
    name and default per instance). The same values: a default that is not a constant (a
    callable's, the database's) is made per instance, as the keyword road makes it."""
    fields = Job._meta.concrete_fields
    keys = {key for row in rows for key in row}
    unknown = keys - {f.name for f in fields} - {f.attname for f in fields}
    if unknown:
        raise TypeError(f"Job got unexpected keyword arguments: {sorted(unknown)}")
    plan: list[tuple[str, str, Any]] = []  # per column: where its value comes from
    for field in fields:
        if field.is_relation and field.name in keys:
            plan.append(("related", field.name, field))
        elif field.name in keys or field.attname in keys:
            plan.append(("given", field.name if field.name in keys else field.attname, field))
        elif field.has_default() and not callable(field.default):
            plan.append(("constant", "", field.get_default()))
        else:
            plan.append(("default", "", field))
    jobs = []
    for row in rows:
        values: list[Any] = []
        related: list[tuple[Any, Any]] = []
        for how, name, found in plan:
            if how == "constant":
                values.append(found)
            elif how == "related" and name in row:
                target = row[name]
                key = found.target_field.attname
                values.append(None if target is None else getattr(target, key))
                related.append((found, target))
            elif how == "related" and found.attname in row:
                values.append(row[found.attname])
            elif how == "given" and name in row:
                values.append(row[name])
            else:
                values.append(found.get_default())
        job = Job(*values)  # type: ignore[misc]  # (positional: every column in order)
        for field, target in related:
            field.set_cached_value(job, target)  # as the keyword road sets it
        jobs.append(job)
    return jobs


# Placed by their due time (a delayed bulk enqueue), never before the statement's time.
_TIMED = ("run_after", "queued_at", "ready_at")


def _insert_unnest(db: str, jobs: Sequence[Job], run_after: datetime | None) -> list[Job]:
    """One ``INSERT ... SELECT FROM unnest(...)``: one array per column, so the statement and
    its parameters stay the same size whatever the number of jobs (Django's bulk INSERT
    compiles and binds one parameter per column and row)."""
    conn = connections[db]
    columns: list[str] = []
    picked: list[str] = []  # the SELECT list: a column of unnest, or one value for every row
    arrays: list[Any] = []
    casts: list[str] = []
    constants: list[Any] = []
    returned: list[models.Field[Any, Any]] = [Job._meta.pk]
    for field in Job._meta.local_concrete_fields:
        if field.primary_key:
            continue
        if run_after is not None and field.name in _TIMED:
            returned.append(field)
            continue
        values = [field.pre_save(job, add=True) for job in jobs]
        if all(isinstance(value, DatabaseDefault) for value in values):
            returned.append(field)
            continue  # the column's default, for every row alike
        columns.append(conn.ops.quote_name(str(field.column)))
        first = values[0]
        if all(type(value) is type(first) and value == first for value in values):
            # One value for every row (the handler, the queue, most defaults): one parameter,
            # prepared once, instead of an array of copies.
            picked.append(f"%s::{field.db_type(conn)}")
            constants.append(field.get_db_prep_save(first, conn))
            continue
        picked.append(f"u.c{len(arrays)}")
        arrays.append([field.get_db_prep_save(value, conn) for value in values])
        casts.append(f"%s::{field.db_type(conn)}[]")
    if run_after is not None:
        for name in _TIMED:
            columns.append(conn.ops.quote_name(name))
            picked.append("GREATEST(%s::timestamptz, STATEMENT_TIMESTAMP())")
            constants.append(run_after)
    if arrays:
        names = ", ".join(f"c{n}" for n in range(len(arrays)))
        rows_from = f"unnest({', '.join(casts)}) WITH ORDINALITY AS u({names}, n)"
    else:  # every job alike (one job; the same record twice in its lane)
        rows_from = "generate_series(1, %s) AS u(n)"
        arrays.append(len(jobs))
    # The parameters in the statement's order: the SELECT list's come before unnest's.
    params = [*constants, *arrays]
    # Only what the database decided comes back, set on the instances given (a raw queryset
    # of every column made a second instance per job).
    back = ", ".join(conn.ops.quote_name(str(field.column)) for field in returned)
    sql = (
        f"INSERT INTO {conn.ops.quote_name(Job._meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(picked)} FROM {rows_from} ORDER BY u.n RETURNING {back}"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        rows = sorted(cursor.fetchall(), key=lambda row: row[0])  # ids in the order given
    found = reading.converters(conn, returned)  # once per statement, not per row
    for job, row in zip(jobs, rows, strict=True):
        _fill(job, db, returned, found, row)
    return list(jobs)
