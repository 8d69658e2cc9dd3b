"""The SQL-only ceiling: ``pgbench`` running bench/pgbench_cycle.sql against a scratch database.

    .venv/bin/python bench/pgbench_ceiling.py [--pg-url postgres://postgres@127.0.0.1:5432/bench]
        [--clients 1,2,4] [--seconds 10] [--jobs 150000]

The scratch database is ``<name>_pgbench`` next to the benchmark's database; it gets the project's
schema (``manage.py migrate``), then, before each client count, ``--jobs`` customers and one
queued ``bench.touch`` job each. Every transaction of the script is one job: claim, fenced write,
complete. The result is checked against the rows: succeeded jobs must equal the cycles pgbench
reports.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "pgbench_cycle.sql"

SEED = """
TRUNCATE tombstones_jobevent, tombstones_job, customers_sheetrow, customers_customer
    RESTART IDENTITY CASCADE;
INSERT INTO customers_customer (reference, name, email, phone, generation, version)
SELECT 'P' || lpad(i::text, 8, '0'), 'Bench', 'bench@example.invalid', '', 1, 1
  FROM generate_series(1, %(jobs)s) AS i;
INSERT INTO tombstones_job (handler, content_type_id, object_id, generation, version, lane,
    status, reason, error_class, params, attempts, rereads, external, owner, claim_token)
SELECT 'bench.touch', ct.id, c.id::text, 1, 1, 'customers.customer:' || c.id,
       'queued', '', '', '{}', 0, 0, false, '', ''
  FROM customers_customer AS c,
       (SELECT id FROM django_content_type
         WHERE app_label = 'customers' AND model = 'customer') AS ct
 ORDER BY c.id;
DROP SEQUENCE IF EXISTS bench_pgbench_next_job;
CREATE SEQUENCE bench_pgbench_next_job;
"""


def scratch_url(url: str) -> tuple[str, str]:
    parts = urlparse(url)
    name = parts.path.lstrip("/") + "_pgbench"
    return parts._replace(path=f"/{name}").geturl(), name


def prepare(url: str) -> str:
    """Create and migrate the scratch database; return its URL."""
    import psycopg

    scratch, name = scratch_url(url)
    admin = urlparse(url)._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "DATABASE_URL": scratch,
        "REDIS_URL": "",
    }
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--verbosity", "0"],
        cwd=str(ROOT),
        env=env,
        check=True,
    )
    return scratch


def seed(url: str, jobs: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED % {"jobs": int(jobs)})
        conn.execute("VACUUM ANALYZE tombstones_job")
        conn.execute("VACUUM ANALYZE customers_customer")


def count_succeeded(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM tombstones_job WHERE status = 'succeeded'"
        ).fetchone()
        return int(row[0]) if row else 0


def pgbench(url: str, clients: int, seconds: int) -> dict[str, Any]:
    parts = urlparse(url)
    cmd = [
        "pgbench",
        "-n",
        "-f",
        str(SCRIPT),
        "-c",
        str(clients),
        "-j",
        str(clients),
        "-T",
        str(seconds),
        "-h",
        parts.hostname or "127.0.0.1",
        "-p",
        str(parts.port or 5432),
        "-U",
        parts.username or "postgres",
        parts.path.lstrip("/"),
    ]
    env = {**os.environ}
    if parts.password:
        env["PGPASSWORD"] = parts.password
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    out = proc.stdout + proc.stderr
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    latency = re.search(r"latency average = ([\d.]+) ms", out)
    return {
        "clients": clients,
        "seconds": seconds,
        "tps": float(tps.group(1)) if tps else 0.0,
        "transactions": int(done.group(1)) if done else 0,
        "failed": int(failed.group(1)) if failed else 0,
        "latency_avg_ms": float(latency.group(1)) if latency else None,
        "returncode": proc.returncode,
        "output_tail": "" if proc.returncode == 0 else out[-2000:],
    }


def run(url: str, *, clients: list[int], seconds: int = 10, jobs: int = 150_000) -> dict[str, Any]:
    scratch = prepare(url)
    rows = []
    for c in clients:
        seed(scratch, jobs)
        row = pgbench(scratch, c, seconds)
        row["succeeded_rows"] = count_succeeded(scratch)
        row["ran_out_of_jobs"] = row["succeeded_rows"] >= jobs
        rows.append(row)
        print(
            f"  pgbench -c {c}: {row['tps']:.0f} cycles/s, {row['transactions']} cycles, "
            f"{row['succeeded_rows']} jobs succeeded",
            flush=True,
        )
    version = subprocess.run(
        ["pgbench", "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "script": "bench/pgbench_cycle.sql",
        "database": urlparse(scratch).path.lstrip("/"),
        "pgbench": version,
        "runs": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/bench"),
    )
    p.add_argument("--clients", default="1,2,4")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--jobs", type=int, default=150_000)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    result = run(args.pg_url, clients=clients, seconds=args.seconds, jobs=args.jobs)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
