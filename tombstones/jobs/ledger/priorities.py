"""Priorities: among due lanes, a claim looks first at those with a due job of a priority above 0,
highest first. Read with the claim's scan of the hints, in the same statement, from an index of
those jobs only (:class:`~tombstones.jobs.models.Job`'s ``tombstones_job_priority``): no round
trip of its own, and one probe of an empty index when no job has a priority. A lane's own order
never changes: the claim takes a lane's head, whatever job of it has the priority.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from django.db import connections
from django.db.models import BooleanField, DateTimeField, F, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from ..models import Job
from ..states import CLAIMABLE
from . import reading

_PRIORITY_INDEX = "tombstones_job_priority"
_TOP, _HINT = 1, 0  # the parts of a look: a queue's jobs of a priority, a queue's hints


def prioritized(db: str, queue: str) -> Any:
    """The due jobs of ``queue`` of a priority above 0, highest first: a claim looks at their
    lanes before the lanes its hints name. Read from an index of those jobs only: one probe of
    an empty index when no job has a priority."""
    quote = connections[db].ops.quote_name
    column = f"{quote(Job._meta.db_table)}.{{}}".format
    waiting = ", ".join(f"'{status}'" for status in CLAIMABLE)
    # The index's own condition, as literals: SQLite uses a partial index only for a query
    # that repeats its condition, and a parameter never matches.
    indexed = RawSQL(
        f"({column(quote('priority'))} > 0 AND {column(quote('status'))} IN ({waiting}))",
        (),
        output_field=BooleanField(),
    )
    return (
        Job.objects.using(db)
        .filter(indexed, queue=queue, run_after__lte=Now())
        .order_by("-priority", "run_after", "id")
    )


@dataclass(frozen=True)
class Look:
    """A claim's look as one statement, compiled once per shape (:func:`compile_look`): its
    text and parameters, and the expressions of its hint parts' columns (their converters)."""

    sql: str
    params: tuple[Any, ...]
    select: tuple[Any, ...]
    width: int  # the caller's columns, first in each row
    utc: tuple[int, ...] = ()  # the positions of datetimes read as UTC without a zone


def compile_look(
    db: str, scans: Mapping[str, Any], columns: tuple[str, ...], limit: int, first: bool
) -> Look:
    """The statement of :func:`read`: the first ``limit`` rows of ``columns`` of the hint scans
    (one per queue, ``scans``), and with ``first`` the due jobs of a priority of the same
    queues. Each part keeps its own plan (an index range of its queue), joined by UNION ALL,
    columns telling them apart and ordering them across queues."""
    conn = connections[db]
    parts, params = [], []
    tops = [(prioritized(db, queue), _TOP) for queue in scans] if first else []
    select: tuple[Any, ...] = ()
    # PostgreSQL: the datetimes as UTC without a zone (see .reading); read() makes them aware.
    utc = conn.vendor == "postgresql"
    names = [_utc_name(c) if utc and c in reading.DATETIMES else c for c in columns]
    for n, (part, mark) in enumerate([*tops, *((scan, _HINT) for scan in scans.values())]):
        if mark == _TOP:
            order = {"rank": -F("priority"), "at": _at(conn, "run_after", utc)}
            if "due" in columns:
                order["due"] = Value(True)
        else:
            order = {"rank": Value(0), "at": _at(conn, "ready_at", utc)}
        own = {_utc_name(c): _at(conn, c, utc) for c in columns if utc and c in reading.DATETIMES}
        sliced = part.annotate(part=Value(mark), **order, **own)
        rows = sliced.values_list(*names, "rank", "at", "id", "part")[:limit]
        compiler = rows.query.get_compiler(db)
        sql, more = compiler.as_sql()
        if mark == _TOP and conn.vendor == "sqlite":
            # Without statistics SQLite reads the due jobs through another index and sorts
            # them: the whole backlog, for none of it has a priority.
            table = conn.ops.quote_name(Job._meta.db_table)
            sql = sql.replace(f"FROM {table}", f"FROM {table} INDEXED BY {_PRIORITY_INDEX}", 1)
        parts.append(f"SELECT * FROM ({sql}) AS scan_{n}")
        params += list(more)
        if mark == _HINT:
            select = tuple(column for column, _, _ in compiler.select)
    width = len(columns)
    at = (width + 1,) if utc else ()
    positions = tuple(n for n, c in enumerate(columns) if utc and c in reading.DATETIMES) + at
    return Look(" UNION ALL ".join(parts), tuple(params), select, width, positions)


def _utc_name(column: str) -> str:
    return f"{column}__utc"


def _at(conn: Any, column: str, utc: bool) -> Any:
    """A datetime column, as UTC without a zone when ``utc``."""
    if not utc:
        return F(column)
    quote = conn.ops.quote_name
    sql = reading.utc_sql(f"{quote(Job._meta.db_table)}.{quote(column)}")
    return RawSQL(sql, (), output_field=DateTimeField())


def read(
    db: str, look: Look, params: Sequence[Any], limit: int, first: list[str] | None
) -> list[Any]:
    """Run ``look`` with ``params``: the first ``limit`` hint rows of its columns, oldest hint
    first; with ``first``, the lanes of :func:`prioritized` put there, highest priority first.
    One statement (one round trip a look)."""
    conn = connections[db]
    with conn.cursor() as cursor:
        cursor.execute(look.sql, list(params))
        found = cursor.fetchall()
    if look.utc:
        found = [_aware(row, look.utc) for row in found]
    # Across queues: by priority, then due time (the top parts); by hint (the scans). Each part
    # came in that order already: a stable sort keeps it.
    width = look.width
    key = itemgetter(width, width + 1, width + 2)
    if first is not None:
        first += [row[0] for row in sorted((r for r in found if r[-1] == _TOP), key=key)]
    hints = _converted([row for row in found if row[-1] == _HINT], look.select, conn)
    return [tuple(row[:width]) for row in sorted(hints, key=key)[:limit]]


def _aware(row: Sequence[Any], positions: tuple[int, ...]) -> list[Any]:
    out = list(row)
    for pos in positions:
        out[pos] = reading.as_utc(out[pos])
    return out


def _converted(rows: list[Any], select: Sequence[Any], conn: Any) -> list[Any]:
    """The rows as their queryset would give them (SQLite's datetimes made aware): the
    converters of each column, for this thread's connection (as Django's compiler finds and
    applies them)."""
    converters = []
    for pos, expression in enumerate(select):
        found = conn.ops.get_db_converters(expression) + expression.get_db_converters(conn)
        if found:
            converters.append((pos, found, expression))
    if not converters:
        return rows
    out = []
    for row in map(list, rows):
        for pos, found, expression in converters:
            value = row[pos]
            for converter in found:
                value = converter(value, expression, conn)
            row[pos] = value
        out.append(row)
    return out
