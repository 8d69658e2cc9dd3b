"""SQLite's own indexes for the engine.

On PostgreSQL the engine reads the job table through partial indexes over unfinished jobs only
(``tombstones_job_lane_place``, ``tombstones_job_unfinished``), so finished jobs cost it nothing.
SQLite's planner uses a partial index only when the query repeats the index's condition word for
word, never for ``status IN (...)`` given as parameters, as Django gives them: without these it
scans the whole table, once more for each lane it looks into. They are created after every
``migrate`` (post_migrate), since SQLite rebuilds a table, without them, whenever a migration
alters one of its columns. A database where SQLite serves one host keeps a small ledger anyway
(``purge_jobs``).
"""

from __future__ import annotations

from typing import Any

from django.db import connections

INDEXES = {
    # (status, id) in effect: SQLite appends the rowid, so a status's jobs come in id order.
    "tombstones_job_sqlite_status": "tombstones_job (status)",
    "tombstones_job_sqlite_due": "tombstones_job (status, run_after)",
    "tombstones_job_sqlite_lane": "tombstones_job (lane, status, queued_at)",
}


def ensure(using: str) -> None:
    """Create the indexes on an SQLite database that has the job table (no-op elsewhere)."""
    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        if "tombstones_job" not in connection.introspection.table_names(cursor):
            return
        for name, columns in INDEXES.items():
            cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {columns}")


def after_migrate(using: str = "default", **kwargs: Any) -> None:
    """post_migrate receiver."""
    ensure(using)
