"""The metrics page and the health check against a large ledger (issue 37): the time of one
scrape and its queries, on an empty ledger and on one holding ``--ledger`` finished jobs, both
with the same backlog, in one run.

    .venv/bin/python bench/metrics_scrape.py --ledger 10000000 --backlog 20000
    .venv/bin/python bench/metrics_scrape.py --sqlite --ledger 1000000

Two scratch databases, ``<name>_empty`` and ``<name>_full`` (PostgreSQL, created when missing)
or two SQLite files under artifacts/. The full one holds ``--ledger`` finished jobs seeded in SQL
(bench/ledger.py, three events each, the outcome roll-up counted) and is reused while it does.
Each then gets, fresh: ``--backlog`` queued jobs due over the last minute (four per lane),
``--recent`` jobs finished in the last five minutes (what a drain leaves for the latency
quantiles) and four worker heartbeats. A scrape is the view itself (a request with the bearer
token; the middleware's cost is the project's), repeated ``--repeat`` times; prints a JSON line
per database and a table: median and slowest ms, queries, the page's size, full / empty.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

TOKEN = "bench-metrics-token-0123456789"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ledger", type=int, default=10_000_000)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--recent", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/bench_metrics")
    parser.add_argument("--sqlite", action="store_true", help="SQLite files instead")
    parser.add_argument("--json", help="write the results to this file too")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one database's scrapes
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    if args.child:
        os.environ["DATABASE_URL"] = args.child
        print(json.dumps(scrapes(args)), flush=True)
        return

    if args.sqlite:
        folder = ROOT / "artifacts"
        folder.mkdir(exist_ok=True)
        urls = {k: f"sqlite:///{folder / f'bench_metrics_{k}.sqlite3'}" for k in ("empty", "full")}
    else:
        os.environ["DATABASE_URL"] = args.pg_url + "_empty"
        from bench.run import ensure_pg_database

        urls = {k: f"{args.pg_url}_{k}" for k in ("empty", "full")}
        for url in urls.values():
            ensure_pg_database(url)
    results = {}
    for key, url in urls.items():
        env = {**os.environ, "DATABASE_URL": url}
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0", "--no-input"],
            check=True,
            env=env,
        )
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                url,
                "--ledger",
                str(args.ledger if key == "full" else 0),
                "--backlog",
                str(args.backlog),
                "--recent",
                str(args.recent),
                "--repeat",
                str(args.repeat),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results[key] = json.loads(out.strip().splitlines()[-1])
        print(json.dumps({"ledger": key, **results[key]}), flush=True)
    full, empty = results["full"], results["empty"]
    ratio = round(full["scrape_ms_median"] / empty["scrape_ms_median"], 2)
    vendor = "sqlite" if args.sqlite else "postgresql"
    print(f"\nmetrics page, {vendor}: backlog {args.backlog:,}, {args.recent:,} recent\n")
    print("| ledger | scrape ms (median) | slowest | queries | health ms | bytes |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in ("empty", "full"):
        r = results[key]
        print(
            f"| {r['finished_jobs']:,} finished | {r['scrape_ms_median']} | {r['scrape_ms_max']} "
            f"| {r['queries']} | {r['health_ms_median']} | {r['bytes']:,} |"
        )
    print(f"\nfull / empty: {ratio}x")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"vendor": vendor, "results": results, "ratio": ratio}, indent=1)
        )


def scrapes(args: argparse.Namespace) -> dict[str, object]:
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import AnonymousUser
    from django.db import connection
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext

    from tombstones.jobs.models import Job
    from tombstones.monitoring import health, views

    settings.TOMBSTONES_METRICS_TOKEN = TOKEN
    seeded = _ensure_ledger(args.ledger)
    _fresh_work(args.backlog, args.recent)
    request = RequestFactory().get("/tombstones/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    request.user = AnonymousUser()
    times, checks = [], []
    body = b""
    for _ in range(args.repeat):
        started = time.perf_counter()
        response = views.metrics(request)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.content
        body = response.content
        started = time.perf_counter()
        health.check()
        checks.append((time.perf_counter() - started) * 1000)
    with CaptureQueriesContext(connection) as queries:
        views.metrics(request)
    assert b"tombstones_jobs{" in body
    return {
        "vendor": connection.vendor,
        "finished_jobs": Job.objects.filter(owner="seed").count(),
        "seeded_s": seeded,
        "backlog": args.backlog,
        "recent": args.recent,
        "scrape_ms_median": round(statistics.median(times), 1),
        "scrape_ms_max": round(max(times), 1),
        "queries": len(queries),
        "health_ms_median": round(statistics.median(checks), 1),
        "bytes": len(body),
    }


def _ensure_ledger(n: int) -> float:
    from django.db import connection

    from bench.ledger import seed_finished

    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM tombstones_job WHERE owner = 'seed'")
        have = cursor.fetchone()[0]
    if have >= n:
        return 0.0
    started = time.monotonic()
    seed_finished(n - have)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE tombstones_job")
            cursor.execute("CHECKPOINT")
    return round(time.monotonic() - started, 1)


def _fresh_work(backlog: int, recent: int) -> None:
    """The backlog, the recent jobs and the heartbeats, made again (``owner='bench'``)."""
    from django.db import connection

    from bench.ledger import _content_type_id
    from tombstones.jobs import beats
    from tombstones.jobs.ledger import rollup
    from tombstones.jobs.models import WorkerBeat

    pg = connection.vendor == "postgresql"
    ct = _content_type_id("default")
    lanes = max(backlog // 4, 1)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM tombstones_job WHERE owner = 'bench'")
        # Queued, due over the last minute, four jobs per lane, each hinted.
        series = (
            "generate_series(1, %s) AS g"
            if pg
            else "(WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < %s) "
            "SELECT g FROM s)"
        )
        at = (
            "now() - make_interval(secs => g %% 60)"
            if pg
            else "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || (g %% 60) || ' seconds')"
        )
        cursor.execute(
            f"""
            INSERT INTO tombstones_job (handler, content_type_id, object_id, generation, version,
                lane, queue, status, reason, error_class, params, attempts, rereads, external,
                created_at, run_after, queued_at, ready_at, owner, claim_token, priority,
                traceparent)
            SELECT 'bench.touch', %s, CAST(g AS TEXT), 1, 1, 'bench:lane:' || (g %% {lanes}),
                'default', 'queued', '', '', '{{}}', 0, 0, {"false" if pg else "0"},
                {at}, {at}, {at}, {at}, 'bench', '', 0, ''
            FROM {series}
            """,
            [ct, backlog],
        )
        # Finished in the last five minutes: the latency quantiles' window.
        cursor.execute(
            f"""
            INSERT INTO tombstones_job (handler, content_type_id, object_id, generation, version,
                lane, queue, status, reason, error_class, params, attempts, rereads, external,
                created_at, run_after, queued_at, started_at, finished_at, owner, claim_token,
                priority, traceparent, ready_at)
            SELECT 'bench.touch', %s, CAST(g AS TEXT), 1, 1, 'bench:done:' || g, 'default',
                'succeeded', '', '', '{{}}', 1, 0, {"false" if pg else "0"},
                {at.replace("60", "300")}, {at.replace("60", "300")}, {at.replace("60", "300")},
                {at.replace("60", "300")}, {at.replace("60", "300")}, 'bench', '', 0, '', NULL
            FROM {series}
            """,
            [ct, recent],
        )
        if pg:
            cursor.execute("ANALYZE tombstones_job")
    # The recent jobs' roll-up rows folded, as the sweep does every minute.
    rollup.fold()
    WorkerBeat.objects.all().delete()
    for n in range(4):
        beats.beat("bench", name=f"bench-host:{n}")


if __name__ == "__main__":
    main()
