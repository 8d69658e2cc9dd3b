"""The outcome roll-up: every job that finishes, counted by the quarter hour (UTC) it finished
in, its status and its reason, in :class:`~tombstones.jobs.models.OutcomeRollup`.

A trigger on the job table counts: a job counts when its ``finished_at`` is set (an outcome the
engine, the sweep or a staff action wrote, or a row inserted finished; a later edit of the time
alone moves nothing), in the transaction that sets it, whatever the code path, old workers of a
deploy included. It appends one row (one job); :func:`fold` (the sweep's, every minute) adds a
key's rows up into one. A count is always the sum of its key's rows, folded or not, so readers
never wait for a fold, and two folds running at once count each row once (the rows they fold are
locked, then deleted).

Nothing takes a count away: ``purge_jobs`` deletes jobs, not counts, and :func:`prune` moves the
periods past the roll-up's retention into one row per status and reason at :data:`EPOCH`, so the
totals (Prometheus counters) never go down. A job finished twice (an uncertain outcome that staff
resolved, a requeued job) counts each outcome.

Quarter hours, not days: every time zone's offset is a multiple of 15 minutes, so a local hour or
day is a whole number of periods. Triggers rather than a statement in the engine: a deploy's old
workers and hand-written rows count too, and the migration that installs them counts the ledger
under a lock, so no job is missed or counted twice. On SQLite, Django rebuilds a table without
its triggers when a migration alters a column: :func:`install` runs after every ``migrate``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Sum

from ..models import OutcomeRollup
from ..states import TERMINAL

PERIOD_MINUTES = 15
# Where pruned periods go: before every chart, still in the totals.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

TABLE = "tombstones_outcomerollup"
_PERIOD_PG = "date_bin('15 minutes', {at}, TIMESTAMPTZ '2000-01-01 00:00:00+00')"
# Django stores SQLite datetimes as 'YYYY-MM-DD HH:MM:SS[.ffffff]' text, naive UTC.
_PERIOD_SQLITE = (
    "strftime('%Y-%m-%d %H:', {at}) || "
    "printf('%02d', CAST(strftime('%M', {at}) AS INTEGER) / 15 * 15) || ':00'"
)
# An outcome written: a finish time where there was none, or another final status with a new
# one (staff resolving an uncertain job). A hand edit of a finish time alone moves no count.
_FINISHED_NOW = (
    "NEW.finished_at IS NOT NULL AND (OLD.finished_at IS NULL OR "
    "(NEW.status IS DISTINCT FROM OLD.status AND NEW.finished_at IS DISTINCT FROM OLD.finished_at))"
)
_SQLITE_FINISHED_NOW = _FINISHED_NOW.replace("IS DISTINCT FROM", "IS NOT")


def period_of(moment: datetime) -> datetime:
    """The start of the quarter hour (UTC) ``moment`` falls in: the roll-up's period."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    minute = moment.minute - moment.minute % PERIOD_MINUTES
    return moment.replace(minute=minute, second=0, microsecond=0)


def _pg_statements() -> list[str]:
    row = f"({_PERIOD_PG.format(at='NEW.finished_at')}, NEW.status, NEW.reason, 1)"
    return [
        f"""
        CREATE OR REPLACE FUNCTION tombstones_count_outcome() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {TABLE} (period, status, reason, jobs) VALUES {row};
            RETURN NULL;
        END $$
        """,
        "DROP TRIGGER IF EXISTS tombstones_job_finished ON tombstones_job",
        "DROP TRIGGER IF EXISTS tombstones_job_inserted_finished ON tombstones_job",
        f"""
        CREATE TRIGGER tombstones_job_finished AFTER UPDATE OF finished_at ON tombstones_job
        FOR EACH ROW WHEN ({_FINISHED_NOW}) EXECUTE FUNCTION tombstones_count_outcome()
        """,
        """
        CREATE TRIGGER tombstones_job_inserted_finished AFTER INSERT ON tombstones_job
        FOR EACH ROW WHEN (NEW.finished_at IS NOT NULL)
        EXECUTE FUNCTION tombstones_count_outcome()
        """,
    ]


def _sqlite_statements() -> list[str]:
    insert = (
        f"INSERT INTO {TABLE} (period, status, reason, jobs) "
        f"VALUES ({_PERIOD_SQLITE.format(at='NEW.finished_at')}, NEW.status, NEW.reason, 1);"
    )
    return [
        f"""
        CREATE TRIGGER IF NOT EXISTS tombstones_job_finished
        AFTER UPDATE OF finished_at ON tombstones_job
        FOR EACH ROW WHEN {_SQLITE_FINISHED_NOW} BEGIN {insert} END
        """,
        f"""
        CREATE TRIGGER IF NOT EXISTS tombstones_job_inserted_finished
        AFTER INSERT ON tombstones_job
        FOR EACH ROW WHEN NEW.finished_at IS NOT NULL BEGIN {insert} END
        """,
    ]


def install(using: str = "default") -> None:
    """Create (or re-create) the counting triggers on ``using``; a no-op where the job table or
    the roll-up table does not exist yet."""
    conn = connections[using]
    with conn.cursor() as cursor:
        tables = set(conn.introspection.table_names(cursor))
        if not {"tombstones_job", TABLE} <= tables:
            return
        if conn.vendor == "postgresql":
            statements = _pg_statements()
        elif conn.vendor == "sqlite":
            statements = _sqlite_statements()
        else:  # the system checks refuse other databases
            return
        for sql in statements:
            cursor.execute(sql)


def uninstall(using: str = "default") -> None:
    conn = connections[using]
    with conn.cursor() as cursor:
        for name in ("tombstones_job_finished", "tombstones_job_inserted_finished"):
            if conn.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON tombstones_job")
            else:
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
        if conn.vendor == "postgresql":
            cursor.execute("DROP FUNCTION IF EXISTS tombstones_count_outcome()")


def count_ledger(using: str = "default", where: str = "", params: Iterable[Any] = ()) -> None:
    """Count the ledger's finished jobs (``where`` narrows them) into the roll-up, in SQL: for
    the migration that installs the triggers, and for seeds made with them off."""
    conn = connections[using]
    period = _PERIOD_PG if conn.vendor == "postgresql" else _PERIOD_SQLITE
    period = period.format(at="finished_at")
    statuses = ", ".join(f"'{s}'" for s in TERMINAL)
    where = f" AND ({where})" if where else ""
    with conn.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {TABLE} (period, status, reason, jobs)
            SELECT {period}, status, reason, COUNT(*) FROM tombstones_job
            WHERE finished_at IS NOT NULL AND status IN ({statuses}){where}
            GROUP BY 1, 2, 3
            """.replace("%", "%%").replace("%%s", "%s"),
            list(params),
        )


def after_migrate(using: str = "default", **kwargs: Any) -> None:
    """post_migrate receiver (SQLite loses triggers when a migration rebuilds the job table)."""
    install(using)


def _key(row: tuple[Any, ...]) -> tuple[datetime, str, str]:
    return row[1], row[2], row[3]


def _merge(db: str, rows: list[tuple[Any, ...]], key: Any) -> int:
    """Replace ``rows`` (id, period, status, reason, jobs) by one row per ``key(row)``."""
    sums: dict[tuple[datetime, str, str], int] = defaultdict(int)
    for row in rows:
        sums[key(row)] += row[4]
    ids = [row[0] for row in rows]
    for start in range(0, len(ids), 1000):  # SQLite caps a statement's parameters
        OutcomeRollup.objects.using(db).filter(id__in=ids[start : start + 1000])._raw_delete(db)
    OutcomeRollup.objects.using(db).bulk_create(
        [
            OutcomeRollup(period=period, status=status, reason=reason, jobs=n)
            for (period, status, reason), n in sorted(sums.items())
        ]
    )
    return len(rows) - len(sums)


def _locked_rows(db: str, where: str, params: list[Any]) -> list[tuple[Any, ...]]:
    conn = connections[db]
    lock = " FOR UPDATE" if conn.features.has_select_for_update else ""
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT id, period, status, reason, jobs FROM {TABLE} WHERE {where} ORDER BY id{lock}",
            params,
        )
        rows = cursor.fetchall()
    column = OutcomeRollup._meta.get_field("period")
    convert = getattr(conn.ops, "convert_datetimefield_value", None)
    if convert is None:
        return rows
    return [(r[0], convert(r[1], column, conn), *r[2:]) for r in rows]


def fold(using: str | None = None) -> int:
    """Add each key's rows up into one row; returns how many rows it took away."""
    db = using or router.db_for_write(OutcomeRollup)
    keys = (
        f"SELECT period, status, reason FROM {TABLE} "
        "GROUP BY period, status, reason HAVING COUNT(*) > 1"
    )
    # A read first: with nothing to fold, no write transaction (on SQLite it would wait for,
    # and hold, the database's one write lock, every minute).
    with connections[db].cursor() as cursor:
        cursor.execute(f"{keys} LIMIT 1")
        if cursor.fetchone() is None:
            return 0
    where = f"(period, status, reason) IN ({keys})"
    with transaction.atomic(using=db):
        rows = _locked_rows(db, where, [])
        return _merge(db, rows, _key) if rows else 0


def prune(before: datetime, using: str | None = None) -> int:
    """Move the periods that started before ``before`` into :data:`EPOCH` (one row per status and
    reason); returns how many periods' rows it moved."""
    db = using or router.db_for_write(OutcomeRollup)
    with transaction.atomic(using=db):
        conn = connections[db]
        params = [
            conn.ops.adapt_datetimefield_value(EPOCH),
            conn.ops.adapt_datetimefield_value(before),
        ]
        rows = _locked_rows(db, "period > %s AND period < %s", params)
        if not rows:
            return 0
        _merge(db, rows, lambda row: (EPOCH, row[2], row[3]))
        return len({row[1] for row in rows})


def rows_since(since: datetime, using: str | None = None) -> list[tuple[datetime, str, int]]:
    """(period, status, jobs) of every period from ``since`` on, summed over reasons and over a
    key's unfolded rows."""
    db = using or router.db_for_read(OutcomeRollup)
    return list(
        OutcomeRollup.objects.using(db)
        .filter(period__gte=since)
        .values_list("period", "status")
        .annotate(n=Sum("jobs"))
        .order_by()
    )


def totals(using: str | None = None) -> dict[tuple[str, str], int]:
    """Every job ever finished, by (status, reason): counters that never go down."""
    db = using or router.db_for_read(OutcomeRollup)
    rows = (
        OutcomeRollup.objects.using(db)
        .values_list("status", "reason")
        .annotate(n=Sum("jobs"))
        .order_by()
    )
    return {(status, reason): n for status, reason, n in rows}


__all__ = [
    "EPOCH",
    "count_ledger",
    "fold",
    "install",
    "period_of",
    "prune",
    "rows_since",
    "totals",
    "uninstall",
]
