"""Enqueue's coalescing (:mod:`tombstones.jobs.coalescing`): the new job inserted, the earlier
jobs it supersedes ended, and when the new one is due.

Run with the lane's row held (:func:`.lanes.hold`, the lane's bookkeeping; on SQLite the write
transaction itself), so that two enqueues for one record run one after the other: the second
sees the first's job and supersedes it, and exactly one survives. The hold is a statement of its
own: a statement's snapshot is taken before it waits for a lock, so the statement that reads the
earlier jobs must start once the lane is held. A job a claim took meanwhile is not superseded
(:data:`NOT_STARTED` no longer matches it): it runs, in its place, and the new job after it.

On PostgreSQL the rest is one statement: an ``UPDATE ... RETURNING`` of the earlier jobs, the
``INSERT`` of their events and the ``INSERT`` of the new job (its window read from the jobs it
supersedes), as data-modifying CTEs. SQLite has no such CTEs: the UPDATE, the INSERT and the
events' INSERT are three statements there (two when nothing is superseded).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import connections, models, transaction
from django.db.models import Q, Value
from django.db.models.expressions import DatabaseDefault
from django.db.models.functions import Greatest, Least, Now
from django.db.models.sql import UpdateQuery

from .. import tracing
from ..coalescing import Coalescing
from ..models import Job, JobEvent
from ..states import Event, Reason, Status
from . import lanes
from .insert import insert_job
from .outcomes import announce, event_row
from .params import EMPTY_PARAMS

# Not started: queued, never claimed (a retry, a crash's give-back, a staff resend all count as
# started), reserved by no claim, no external call begun.
NOT_STARTED = Q(
    status=Status.QUEUED, attempts=0, reason="", claim_token="", started_at=None, sending_at=None
)

# What a superseded job's row becomes: ended, its lane hinted, its params erased (as every job
# that ends other than by success, :func:`.params.params_after`).
_SUPERSEDED: dict[str, Any] = {
    "status": Status.SUPERSEDED,
    "reason": Reason.COALESCED,
    "finished_at": Now(),
    "lease_expires_at": None,
    "claim_token": "",
    "ready_at": Now(),
    "params": EMPTY_PARAMS,
}


@dataclass(frozen=True)
class Target:
    """The jobs a new one coalesces with: its lane, handler and coalescing key."""

    lane: str
    handler: str
    key: str

    def jobs(self, db: str) -> models.QuerySet[Job]:
        return Job.objects.using(db).filter(
            lane=self.lane, handler=self.handler, coalesce_key=self.key
        )


def insert_newest(
    db: str, options: Coalescing, *, run_after: datetime | None, **fields: Any
) -> Job:
    """Enqueue's insert for a coalescing handler: the lane held, then the earlier jobs that have
    not started superseded and the new job inserted; all in the caller's transaction (one of
    its own without one). ``fields`` are :func:`.insert.insert_job`'s, ``coalesce_key``
    included. Each superseded job is announced (log line, ``job_finished``) after commit."""
    target = Target(fields["lane"], fields["handler"], fields["coalesce_key"])
    with transaction.atomic(using=db, savepoint=False):
        lanes.hold(db, target.lane)
        if connections[db].vendor == "postgresql":
            job, earlier = _in_one_statement(db, options, target, run_after, fields)
        else:
            job, earlier = _in_statements(db, options, target, run_after, fields)
        for old in earlier:
            announce(old, Status.SUPERSEDED, Reason.COALESCED, (None, None))
    return job


def _supersede_sql(db: str, target: Target, *, due_only: bool) -> tuple[str, list[Any]]:
    """The UPDATE that ends the earlier jobs that have not started (``due_only``: only those
    not due yet, a window's waiting job), without its RETURNING."""
    sql, params = _supersede_template(db, due_only)
    return sql, [*params, target.lane, target.handler, target.key]


@functools.cache
def _supersede_template(db: str, due_only: bool) -> tuple[str, tuple[Any, ...]]:
    """:func:`_supersede_sql`'s text, compiled once per database: its lane, handler and key
    are its last three parameters (compiling the ORM's UPDATE took a millisecond)."""
    earlier = Job.objects.using(db).filter(NOT_STARTED)
    if due_only:
        earlier = earlier.filter(run_after__gt=Now())
    query = cast(UpdateQuery, earlier.query.chain(UpdateQuery))
    query.add_update_values(_SUPERSEDED)
    sql, params = query.get_compiler(db).as_sql()
    quote = connections[db].ops.quote_name
    mine = " AND ".join(f"{quote(column)} = %s" for column in ("lane", "handler", "coalesce_key"))
    return f"{sql} AND {mine}", tuple(params)


# --- PostgreSQL: one statement --------------------------------------------------------------


def _in_one_statement(
    db: str, options: Coalescing, target: Target, run_after: datetime | None, fields: Any
) -> tuple[Job, list[Job]]:
    conn = connections[db]
    quote = conn.ops.quote_name
    now = "STATEMENT_TIMESTAMP()"
    debounce, edge = options.debounce, options.edge
    ctes: list[str] = []
    params: list[Any] = []
    # Which earlier jobs are superseded, and the new job's window and due time (None: now).
    #   no window: every one not started; the new job runs now.
    #   trailing: those still waiting (a due job is left to run: superseding it would postpone
    #     its window's run at each edit, past max_delay); the new job joins their window (the
    #     earliest start), or opens one, and is due a debounce from now, max_delay at most
    #     from its window's start.
    #   leading: with no window open (no job of the key started one within a debounce), all,
    #     and the new job opens one and runs now; in an open window, those waiting, and the new
    #     job runs at the window's end.
    window: str | None = None
    due: str | None = None
    due_params: list[Any] = []
    trailing = debounce is not None and edge == "trailing"
    update, update_params = _supersede_sql(db, target, due_only=trailing)
    if debounce is not None and edge == "leading":
        ctes.append(
            f"opened AS MATERIALIZED (SELECT max({quote('window_started_at')}) AS at "
            f"FROM {quote(Job._meta.db_table)} WHERE {quote('lane')} = %s "
            f"AND {quote('handler')} = %s AND {quote('coalesce_key')} = %s "
            f"AND {quote('window_started_at')} > {now} - %s)"
        )
        params += [target.lane, target.handler, target.key, debounce]
        update += f" AND ({quote('run_after')} > {now} OR (SELECT at FROM opened) IS NULL)"
        window = f"COALESCE((SELECT at FROM opened), {now})"
        due, due_params = "(SELECT at FROM opened) + %s", [debounce]
    elif debounce is not None:
        window = f"COALESCE((SELECT min({quote('window_started_at')}) FROM earlier), {now})"
        due, due_params = f"LEAST({now} + %s, {window} + %s)", [debounce, options.max_delay]
    ctes.append(f"earlier AS ({update} RETURNING *)")
    params += update_params
    ctes.append(_events_sql(db))
    insert, insert_params = _insert_sql(db, fields, window, run_after, due, due_params)
    ctes.append(f"newest AS ({insert})")
    params += insert_params
    sql = (
        f"WITH {', '.join(ctes)} "
        "SELECT *, TRUE AS is_newest FROM newest UNION ALL SELECT *, FALSE FROM earlier"
    )
    rows = list(Job.objects.db_manager(db).raw(sql, params))
    (job,) = [row for row in rows if row.is_newest]  # type: ignore[attr-defined]
    job.content_type = fields["content_type"]
    return job, [row for row in rows if not row.is_newest]  # type: ignore[attr-defined]


def _events_sql(db: str) -> str:
    """The superseded jobs' events, from the ``earlier`` CTE's rows."""
    quote = connections[db].ops.quote_name
    columns = {
        "job_id": "id",
        "content_type_id": "content_type_id",
        "object_id": "object_id",
        "event": f"'{Event.SUPERSEDED}'",
        "reason": f"'{Reason.COALESCED}'",
        "expected_generation": "generation",
        "expected_version": "version",
        "worker": "''",
        "created_at": "STATEMENT_TIMESTAMP()",
    }
    names = ", ".join(quote(name) for name in columns)  # the columns are the fields' attnames
    picked = ", ".join(
        quote(value) if value.isidentifier() else value for value in columns.values()
    )
    return (
        f"events AS (INSERT INTO {quote(JobEvent._meta.db_table)} ({names}) "
        f"SELECT {picked} FROM earlier)"
    )


# Placed when due (a debounced or delayed job), never before the statement's time.
_TIMED = ("run_after", "queued_at", "ready_at")


def _insert_sql(
    db: str,
    fields: dict[str, Any],
    window: str | None,
    run_after: datetime | None,
    due: str | None,
    due_params: list[Any],
) -> tuple[str, list[Any]]:
    """The new job's INSERT: its columns as :func:`.insert.insert_job` writes them, its window
    and due time from the statement (GREATEST skips a NULL: no delay, no debounce)."""
    conn = connections[db]
    job = Job(**fields, traceparent=tracing.traceparent())
    columns, values, params = [], [], []
    for field in Job._meta.local_concrete_fields:
        if field.primary_key or field.name in _TIMED:
            continue
        column = conn.ops.quote_name(str(field.column))
        if field.name == "window_started_at" and window is not None:
            columns.append(column)
            values.append(window)
            continue
        value = field.pre_save(job, add=True)
        if isinstance(value, DatabaseDefault):
            continue
        columns.append(column)
        values.append("%s")
        params.append(field.get_db_prep_save(value, conn))
    placed = f"GREATEST(%s::timestamptz, {due or 'NULL'}, STATEMENT_TIMESTAMP())"
    for name in _TIMED:
        columns.append(conn.ops.quote_name(name))
        values.append(placed)
        params += [run_after, *(due_params if due else [])]
    sql = (
        f"INSERT INTO {conn.ops.quote_name(Job._meta.db_table)} ({', '.join(columns)}) "
        f"VALUES ({', '.join(values)}) RETURNING *"
    )
    return sql, params  # the window holds no placeholder: the parameters stay in column order


# --- SQLite (and any other database): the same steps, one statement each ----------------------


def _in_statements(
    db: str, options: Coalescing, target: Target, run_after: datetime | None, fields: Any
) -> tuple[Job, list[Job]]:
    debounce = options.debounce
    opened = None
    if debounce is not None and options.edge == "leading":
        opened = (
            target.jobs(db)
            .filter(window_started_at__gt=Now() - _duration(debounce))
            .order_by("-window_started_at")
            .values_list("window_started_at", flat=True)
            .first()
        )
    due_only = debounce is not None and (options.edge == "trailing" or opened is not None)
    update, params = _supersede_sql(db, target, due_only=due_only)
    earlier = list(Job.objects.db_manager(db).raw(f"{update} RETURNING *", params))
    window: Any = None
    due: Any = None
    if debounce is not None and opened is not None:  # leading, in an open window
        window = _at(opened)
        due = window + _duration(debounce)
    elif debounce is not None and options.edge == "leading":  # leading, opens a window
        window = Now()
    elif debounce is not None:  # trailing
        starts = [job.window_started_at for job in earlier if job.window_started_at is not None]
        window = _at(min(starts)) if starts else Now()
        due = Now() + _duration(debounce)
        if starts:
            due = Least(due, window + _duration(cast(timedelta, options.max_delay)))
    if run_after is not None and due is not None:  # the later of the two
        due, run_after = Greatest(_at(run_after), due), None
    job = insert_job(db, run_after=run_after, due=due, window_started_at=window, **fields)
    if earlier:
        JobEvent.objects.using(db).bulk_create(
            event_row(old, Event.SUPERSEDED, Reason.COALESCED) for old in earlier
        )
    return job, earlier


def _at(moment: datetime) -> Value:
    return Value(moment, output_field=models.DateTimeField())


def _duration(delta: timedelta) -> Value:
    return Value(delta, output_field=models.DurationField())
