"""A ledger full of finished jobs, written in SQL (the ORM would take hours for ten million).

    from bench.ledger import seed_finished
    seed_finished(1_000_000)            # jobs, and three events each, on the default database

Each finished job looks like the engine's (no lane hint: ``ready_at`` is NULL, as an outcome
leaves it; the column's default would give every seeded job one): 90% succeeded, 5% rejected
(source_deleted), 3% failed (handler_error), 2% expired; claimed -> checked -> outcome events;
created over the last 30 days; lanes over 50,000 records of ``customers.customer``. Rows are
marked ``owner='seed'``.
Used by bench/ledger_scale.py and by the tests that pin the engine's plans (tests/integration/
test_ledger_plans.py).
"""

from __future__ import annotations

import time
from typing import Any

from django.db import connections

# status, reason by the job's number modulo 100
_STATUS = (
    "CASE WHEN {g} % 100 < 90 THEN 'succeeded' WHEN {g} % 100 < 95 THEN 'rejected' "
    "WHEN {g} % 100 < 98 THEN 'failed' ELSE 'expired' END"
)
_REASON = (
    "CASE WHEN {g} % 100 < 90 THEN '' WHEN {g} % 100 < 95 THEN 'source_deleted' "
    "WHEN {g} % 100 < 98 THEN 'handler_error' ELSE 'queue_expired' END"
)
RECORDS = 50_000
SPAN_SECONDS = 30 * 24 * 3600

_COLUMNS = (
    "handler, content_type_id, object_id, generation, version, lane, status, reason, "
    "error_class, params, attempts, rereads, external, created_at, run_after, queued_at, "
    "started_at, finished_at, lease_expires_at, owner, claim_token, sending_at, sent_at, "
    "found_generation, found_version, ready_at"
)
_EVENT_COLUMNS = (
    "job_id, content_type_id, object_id, event, reason, expected_generation, expected_version, "
    "found_generation, found_version, worker, created_at"
)


def _escaped(sql: str) -> str:
    """Literal ``%`` (modulo, strftime) doubled; ``%s`` placeholders kept."""
    return sql.replace("%", "%%").replace("%%s", "%s")


def _content_type_id(using: str) -> int:
    from django.contrib.contenttypes.models import ContentType

    from project.customers.models import Customer

    return ContentType.objects.db_manager(using).get_for_model(Customer).pk


def seed_finished(
    n: int, *, using: str = "default", chunk: int = 500_000, events: bool = True
) -> float:
    """Insert ``n`` finished jobs (and their events); return the seconds it took."""
    started = time.monotonic()
    ct = _content_type_id(using)
    conn = connections[using]
    # Millions of rows on PostgreSQL: the secondary indexes built once at the end, not row by
    # row (43 minutes for ten million with them in place).
    rebuild = _drop_indexes(conn) if conn.vendor == "postgresql" and n >= 1_000_000 else []
    # The outcome roll-up's triggers would count the seed row by row: off, then one count.
    counting = _rollup()
    if counting is not None:
        counting.uninstall(using)
    with conn.cursor() as cursor:
        cursor.execute("SELECT COALESCE(MAX(id), 0) FROM tombstones_job")
        first = cursor.fetchone()[0]
    done = 0
    while done < n:
        size = min(chunk, n - done)
        with conn.cursor() as cursor:
            cursor.execute("SELECT COALESCE(MAX(id), 0) FROM tombstones_job")
            low = cursor.fetchone()[0]
            if conn.vendor == "postgresql":
                _jobs_pg(cursor, ct, done, size)
            else:
                _jobs_sqlite(cursor, ct, done, size)
            if events:
                _events(cursor, conn.vendor, low)
        done += size
    if rebuild:
        with conn.cursor() as cursor:
            cursor.execute("SET maintenance_work_mem = '1GB'")
            for create in rebuild:
                cursor.execute(create)
            cursor.execute("RESET maintenance_work_mem")
    if counting is not None:
        counting.count_ledger(using, "owner = 'seed' AND id > %s", [first])
        counting.install(using)
    analyze(using)
    return time.monotonic() - started


def _rollup() -> Any:
    """The outcome roll-up's module (None on a release before it)."""
    try:
        from tombstones.jobs.ledger import rollup
    except ImportError:
        return None
    return rollup


def _drop_indexes(conn: Any) -> list[str]:
    """Drop the job and event tables' secondary indexes (those no constraint owns); return the
    statements that make them again."""
    with conn.cursor() as cursor:
        cursor.execute(
            """
            SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
            FROM pg_index i
            WHERE i.indrelid IN ('tombstones_job'::regclass, 'tombstones_jobevent'::regclass)
              AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
            """
        )
        found = cursor.fetchall()
        for name, _ in found:
            cursor.execute(f"DROP INDEX {name}")
    return [create for _, create in found]


def _jobs_pg(cursor: object, ct: int, offset: int, size: int) -> None:
    g = "g"
    at = f"now() - make_interval(secs => 3600 + ({g}::bigint * 7919) % {SPAN_SECONDS})"
    cursor.execute(  # type: ignore[attr-defined]
        _escaped(f"""
        INSERT INTO tombstones_job ({_COLUMNS})
        SELECT 'bench.touch', %s, ({g} % {RECORDS})::text, 1, 1,
               'customers.customer:' || ({g} % {RECORDS}),
               {_STATUS.format(g=g)}, {_REASON.format(g=g)}, '', '{{}}'::jsonb, 1, 0, false,
               {at}, {at}, {at}, {at} + interval '5 ms', {at} + interval '15 ms',
               NULL, 'seed', '', NULL, NULL, 1, 1, NULL
        FROM generate_series(%s, %s) AS {g}
        """),
        [ct, offset + 1, offset + size],
    )


def _jobs_sqlite(cursor: object, ct: int, offset: int, size: int) -> None:
    g = "x"
    ago = f"'-' || (3600 + ({g} * 7919) % {SPAN_SECONDS}) || ' seconds'"
    at = f"strftime('%Y-%m-%d %H:%M:%f', 'now', {ago})"
    later = at.replace("'now'", "'now', '+0.015 seconds'")
    cursor.execute(  # type: ignore[attr-defined]
        _escaped(f"""
        WITH RECURSIVE s(x) AS (SELECT %s UNION ALL SELECT x + 1 FROM s WHERE x < %s)
        INSERT INTO tombstones_job ({_COLUMNS})
        SELECT 'bench.touch', %s, CAST({g} % {RECORDS} AS TEXT), 1, 1,
               'customers.customer:' || ({g} % {RECORDS}),
               {_STATUS.format(g=g)}, {_REASON.format(g=g)}, '', '{{}}', 1, 0, 0,
               {at}, {at}, {at}, {at}, {later},
               NULL, 'seed', '', NULL, NULL, 1, 1, NULL
        FROM s
        """),
        [offset + 1, offset + size, ct],
    )


def _events(cursor: object, vendor: str, low: int) -> None:
    cursor.execute(  # type: ignore[attr-defined]
        _escaped(f"""
        INSERT INTO tombstones_jobevent ({_EVENT_COLUMNS})
        SELECT j.id, j.content_type_id, j.object_id,
               CASE e.n WHEN 1 THEN 'claimed' WHEN 2 THEN 'checked' ELSE j.status END,
               CASE e.n WHEN 3 THEN j.reason ELSE '' END,
               1, 1, 1, 1, 'seed',
               CASE e.n WHEN 1 THEN j.started_at ELSE j.finished_at END
        FROM tombstones_job j CROSS JOIN (SELECT 1 AS n UNION ALL SELECT 2 UNION ALL SELECT 3) e
        WHERE j.id > %s AND j.owner = 'seed'
        """),
        [low],
    )


def analyze(using: str = "default") -> None:
    """Fresh planner statistics, as autovacuum would give a table this size."""
    conn = connections[using]
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            cursor.execute("ANALYZE tombstones_job")
            cursor.execute("ANALYZE tombstones_jobevent")
        else:
            cursor.execute("ANALYZE")


def remove_seeded(using: str = "default") -> None:
    with connections[using].cursor() as cursor:
        cursor.execute(
            "DELETE FROM tombstones_jobevent WHERE job_id IN "
            "(SELECT id FROM tombstones_job WHERE owner = 'seed')"
        )
        cursor.execute("DELETE FROM tombstones_job WHERE owner = 'seed'")
