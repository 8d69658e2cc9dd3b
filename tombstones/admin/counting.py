"""Counts and distinct values that do not read the whole ledger.

The job and event tables grow by millions of rows a day; Django's changelist counts its whole
queryset for the paginator (``SELECT COUNT(*)``), and ``AllValuesFieldListFilter`` asks for every
distinct value (``SELECT DISTINCT``): both read every row. Here a count stops at
``COUNT_CAP`` rows and, past it, takes PostgreSQL's own estimate; distinct values of an indexed
column, and the years, months and days of the date hierarchy, are read by a skip scan (one
index probe per value).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections, models
from django.db.models import Min
from django.utils import timezone

# Beyond this many rows a list's count is PostgreSQL's estimate (never less than the cap).
COUNT_CAP = 10_000


class LedgerPaginator(Paginator):
    """A paginator whose count reads at most ``COUNT_CAP + 1`` rows.

    Exact up to the cap; past it, on PostgreSQL, the planner's estimate of the rows (the table's
    ``reltuples`` for an unfiltered list). SQLite has no estimate and counts fast: exact there.
    """

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, models.QuerySet):
            return super().count
        return count(queryset)


def count(queryset: models.QuerySet[Any]) -> int:
    """Exact up to ``COUNT_CAP`` rows; past it, on PostgreSQL, the planner's estimate (never
    below the cap). SQLite has no estimate and counts fast: exact there."""
    if connections[queryset.db].vendor != "postgresql":
        return queryset.count()
    capped = queryset.order_by()[: COUNT_CAP + 1].count()
    if capped <= COUNT_CAP:
        return capped
    return max(COUNT_CAP + 1, estimate(queryset))


def estimate(queryset: models.QuerySet[Any]) -> int:
    """PostgreSQL's estimate of the rows ``queryset`` returns (its plan's top row count)."""
    sql, params = queryset.order_by().query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        found = cursor.fetchone()[0]
    plan = json.loads(found) if isinstance(found, str) else found
    return int(plan[0]["Plan"]["Plan Rows"])


def distinct_values(model: type[models.Model], column: str, *, using: str = "default") -> list[Any]:
    """The distinct non-null values of an indexed column, by a skip scan: one probe of its index
    per value (a recursive query), instead of ``SELECT DISTINCT`` over every row."""
    connection = connections[using]
    quote = connection.ops.quote_name
    field_obj = model._meta.get_field(column)
    if not isinstance(field_obj, models.Field):
        raise TypeError(f"{model._meta.label}.{column} is not a column")
    table, field = quote(model._meta.db_table), quote(str(field_obj.column))
    sql = (
        f"WITH RECURSIVE found(value) AS ("
        f" SELECT MIN({field}) FROM {table}"
        f" UNION ALL"
        f" SELECT (SELECT MIN({field}) FROM {table} WHERE {field} > found.value)"
        f" FROM found WHERE found.value IS NOT NULL"
        f") SELECT value FROM found WHERE value IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [row[0] for row in cursor.fetchall()]


# --- the date hierarchy --------------------------------------------------------------------------

# The most moments one probe series reads (a month has 31 days; years are few).
MAX_PROBES = 400


class ProbedDates:
    """A queryset mixin for Django's date hierarchy: ``datetimes(field, kind)`` reads each year,
    month or day by one probe of the field's index (the first row at or after the previous
    one's end), not a ``DISTINCT`` over every row."""

    def datetimes(self, field_name: str, kind: str, *args: Any, **kwargs: Any) -> Any:
        if kind not in ("year", "month", "day"):
            return super().datetimes(field_name, kind, *args, **kwargs)  # type: ignore[misc]
        found: list[datetime] = []
        lowest = self.aggregate(first=Min(field_name))["first"]  # type: ignore[attr-defined]
        while lowest is not None and len(found) < MAX_PROBES:
            start = _truncate(lowest, kind)
            found.append(start)
            after = self.filter(**{f"{field_name}__gte": _next(start, kind)})  # type: ignore[attr-defined]
            lowest = after.aggregate(first=Min(field_name))["first"]
        return found


def _truncate(moment: datetime, kind: str) -> datetime:
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    start = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind in ("month", "year"):
        start = start.replace(day=1)
    if kind == "year":
        start = start.replace(month=1)
    return start


def _next(start: datetime, kind: str) -> datetime:
    if kind == "day":
        naive = start.replace(tzinfo=None) + timedelta(days=1)
    elif kind == "month":
        year, month = divmod(start.month, 12)
        naive = start.replace(tzinfo=None, year=start.year + year, month=month + 1)
    else:
        naive = start.replace(tzinfo=None, year=start.year + 1)
    return timezone.make_aware(naive) if timezone.is_aware(start) else naive


_probed: dict[type, type] = {}


def with_probed_dates(queryset: models.QuerySet[Any]) -> models.QuerySet[Any]:
    """``queryset``, its class given :class:`ProbedDates` (its rows are unchanged)."""
    cls = type(queryset)
    probed = _probed.get(cls)
    if probed is None:
        probed = _probed[cls] = type(f"Probed{cls.__name__}", (ProbedDates, cls), {})
    clone = queryset.all()
    clone.__class__ = probed
    return clone


class LedgerChangeList(ChangeList):
    """Django's changelist, its date hierarchy probing dates (see :class:`ProbedDates`)."""

    def get_queryset(self, request: Any, exclude_parameters: Any = None) -> Any:
        return with_probed_dates(super().get_queryset(request, exclude_parameters))
