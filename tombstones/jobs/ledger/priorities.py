"""Priorities: among due lanes, a claim looks first at those with a due job of a priority above 0,
highest first. Read with the claim's scan of the hints, in the same statement, from an index of
those jobs only (:class:`~tombstones.jobs.models.Job`'s ``tombstones_job_priority``): no round
trip of its own, and one probe of an empty index when no job has a priority. A lane's own order
never changes: the claim takes a lane's head, whatever job of it has the priority.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from django.db import connections
from django.db.models import BooleanField, F, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from ..models import Job
from ..states import CLAIMABLE

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


def read(
    db: str,
    scans: Mapping[str, Any],
    columns: tuple[str, ...],
    limit: int,
    first: list[str] | None,
) -> list[Any]:
    """The first ``limit`` rows of ``columns`` of the hint scans (one per queue, ``scans``),
    oldest hint first; with ``first``, the lanes of :func:`prioritized` of the same queues put
    there, highest priority first. One statement (one round trip a look, as before priorities
    and queues): each part keeps its own plan (an index range of its queue), joined by UNION
    ALL, columns telling them apart and ordering them across queues."""
    conn = connections[db]
    parts, params = [], []
    tops = [(prioritized(db, queue), _TOP) for queue in scans] if first is not None else []
    for n, (part, mark) in enumerate([*tops, *((scan, _HINT) for scan in scans.values())]):
        if mark == _TOP:
            order = {"rank": -F("priority"), "at": F("run_after")}
            if "due" in columns:
                order["due"] = Value(True)
        else:
            order = {"rank": Value(0), "at": F("ready_at")}
        sliced = part.annotate(part=Value(mark), **order)
        rows = sliced.values_list(*columns, "rank", "at", "id", "part")[:limit]
        compiler = rows.query.get_compiler(db)
        sql, more = compiler.as_sql()
        if mark == _TOP and conn.vendor == "sqlite":
            # Without statistics SQLite reads the due jobs through another index and sorts
            # them: the whole backlog, for none of it has a priority.
            table = conn.ops.quote_name(Job._meta.db_table)
            sql = sql.replace(f"FROM {table}", f"FROM {table} INDEXED BY {_PRIORITY_INDEX}", 1)
        parts.append(f"SELECT * FROM ({sql}) AS scan_{n}")
        params += list(more)
    with conn.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        found = cursor.fetchall()
    # Across queues: by priority, then due time (the top parts); by hint (the scans). Each part
    # came in that order already: a stable sort keeps it.
    width = len(columns)
    key = itemgetter(width, width + 1, width + 2)
    if first is not None:
        first += [row[0] for row in sorted((r for r in found if r[-1] == _TOP), key=key)]
    # The scans' rows as their querysets would give them (SQLite's datetimes made aware): the
    # converters of their own compiler, the last one compiled.
    converters = compiler.get_converters([column for column, _, _ in compiler.select])
    hints = compiler.apply_converters((row for row in found if row[-1] == _HINT), converters)
    return [tuple(row[:width]) for row in sorted(hints, key=key)[:limit]]
