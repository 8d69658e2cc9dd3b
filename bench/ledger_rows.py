"""Rows and bytes a succeeded job leaves behind: the job row, its events, django-q2's rows.

    .venv/bin/python bench/ledger_rows.py --jobs 1000 --mix many

Runs ``bench/run.py`` (one fenced ordered backlog drain on a real qcluster, PostgreSQL + Redis,
one worker) into a scratch database of its own, then counts what the drain left there: rows of
``tombstones_job``, ``tombstones_jobevent`` and django-q2's ``django_q_task``/``django_q_ormq``,
the bytes of those rows (``pg_column_size``) and of the tables with their indexes
(``pg_total_relation_size``), each per succeeded job. Run it from another checkout (same
virtualenv) to measure other code in the same session.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path.cwd()
TABLES = ("tombstones_job", "tombstones_jobevent", "django_q_task", "django_q_ormq")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--mix", choices=["many", "bursty"], default="many")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/bench_rows")
    args = parser.parse_args()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "--db", "postgres", "--workers", "1", "--mix", args.mix, "--reps", "1",
            "--jobs", str(args.jobs), "--variants", "ordered", "--backlog", "--pgbench", "no",
            "--pg-url", args.pg_url,
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )  # fmt: skip
    import psycopg

    with psycopg.connect(args.pg_url, autocommit=True) as conn:
        jobs = conn.execute(
            "SELECT COUNT(*) FROM tombstones_job WHERE status = 'succeeded'"
        ).fetchone()[0]
        conn.execute("VACUUM ANALYZE")
        found: dict[str, dict[str, float]] = {}
        for table in TABLES:
            rows, row_bytes = conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(pg_column_size(t.*)), 0) FROM {table} t"
            ).fetchone()
            total = conn.execute("SELECT pg_total_relation_size(%s)", [table]).fetchone()[0]
            found[table] = {
                "rows_per_job": round(rows / max(jobs, 1), 3),
                "row_bytes_per_job": round(row_bytes / max(jobs, 1), 1),
                "table_and_index_bytes_per_job": round(total / max(jobs, 1), 1),
            }
    print(json.dumps({"mix": args.mix, "succeeded": jobs, "tables": found}))


if __name__ == "__main__":
    main()
