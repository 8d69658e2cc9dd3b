"""Priorities: among due lanes, a claim looks first at those with a due job of a priority above 0,
highest first. Read with the claim's scan of the hints, in the same statement, from an index of
those jobs only (:class:`~tombstones.jobs.models.Job`'s ``tombstones_job_priority``): no round
trip of its own, and one probe of an empty index when no job has a priority. A lane's own order
never changes: the claim takes a lane's head, whatever job of it has the priority.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import BooleanField, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from ..models import Job
from ..states import CLAIMABLE

_PRIORITY_INDEX = "tombstones_job_priority"


def prioritized(db: str) -> Any:
    """The due jobs of a priority above 0, highest first: a claim looks at their lanes before
    the lanes its hints name. Read from an index of those jobs only: one probe of an empty
    index when no job has a priority."""
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
        .filter(indexed, run_after__lte=Now())
        .order_by("-priority", "run_after", "id")
    )


def read(
    db: str, query: Any, columns: tuple[str, ...], limit: int, first: list[str] | None
) -> list[Any]:
    """``query``'s first ``limit`` rows of ``columns``; with ``first``, the lanes of
    :func:`prioritized` put there, read in the same statement (one round trip a look, as
    before priorities): each part keeps its own plan, joined by UNION ALL, a column telling
    them apart."""
    if first is None:
        return list(query.values_list(*columns)[:limit])
    top = prioritized(db)
    if "due" in columns:
        top = top.annotate(due=Value(True))
    conn = connections[db]
    parts, params = [], []
    for n, (part, mark) in enumerate(((top, 1), (query, 0))):
        sliced = part.annotate(part=Value(mark)).values_list(*columns, "part")[:limit]
        compiler = sliced.query.get_compiler(db)
        sql, more = compiler.as_sql()
        if mark and conn.vendor == "sqlite":
            # Without statistics SQLite reads the due jobs through another index and sorts
            # them: the whole backlog, for none of it has a priority.
            table = conn.ops.quote_name(Job._meta.db_table)
            sql = sql.replace(f"FROM {table}", f"FROM {table} INDEXED BY {_PRIORITY_INDEX}", 1)
        parts.append(f"SELECT * FROM ({sql}) AS scan_{n}")
        params += list(more)
    with conn.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        found = cursor.fetchall()
    first += [row[0] for row in found if row[-1] == 1]  # the caller keeps each lane once
    # The scan's rows as its queryset would give them (SQLite's datetimes made aware): the
    # converters of its own compiler, the last one compiled.
    converters = compiler.get_converters([column for column, _, _ in compiler.select])
    rows = compiler.apply_converters((row for row in found if row[-1] == 0), converters)
    return [tuple(row[:-1]) for row in rows]
