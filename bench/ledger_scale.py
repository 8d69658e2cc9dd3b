"""The engine against a ledger full of finished jobs: a fenced ordered drain on an empty ledger
and on one holding ``--ledger`` finished jobs (three events each), alternated in one run.

    .venv/bin/python bench/ledger_scale.py --ledger 10000000 --jobs 2000 --rounds 2
    .venv/bin/python bench/ledger_scale.py --sqlite --ledger 1000000

Two scratch databases, ``<name>_empty`` and ``<name>_full`` (PostgreSQL, created when missing;
a test database is refused) or two SQLite files under artifacts/. The full one is seeded once in
SQL (bench/ledger.py) and reused while it holds at least ``--ledger`` seeded jobs. Each round
enqueues ``--jobs`` jobs of ``bench.touch`` (one customer each, each in its own transaction) and
drains them in this process through ``runner.pump()`` (no cluster: the worker's own cost), then
removes them. ``--old-indexes`` puts back the job-table indexes of release 0.1 (before migration
0010) for the round, to measure what they cost on the same data. Prints a JSON line per drain and
a summary: jobs/s per ledger and the full/empty ratio. Then the audit pages on the full ledger
(bench/admin_pages.py, median of ``--repeat``; ``--no-pages`` skips them), and one table of both.

Time on this machine (2 cores, PostgreSQL 15): seeding 10,000,000 jobs and 30,000,000 events
takes about 8 minutes (indexes dropped and built once at the end, the roll-up counted in
one statement), a round of drains about a minute, the pages a minute.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

# The job table's indexes before migration 0010 (release 0.1), for --old-indexes.
OLD_INDEXES = {
    "bench_old_status": "CREATE INDEX bench_old_status ON tombstones_job (status)",
    "bench_old_object_id": "CREATE INDEX bench_old_object_id ON tombstones_job (object_id)",
    "bench_old_ct": "CREATE INDEX bench_old_ct ON tombstones_job (content_type_id)",
    "bench_old_due": "CREATE INDEX bench_old_due ON tombstones_job (status, run_after)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ledger", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/bench_ledger")
    parser.add_argument("--sqlite", action="store_true", help="SQLite files instead")
    parser.add_argument("--old-indexes", action="store_true")
    parser.add_argument("--no-pages", action="store_true", help="the drains only")
    parser.add_argument("--repeat", type=int, default=5, help="fetches of each admin page")
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE the job table once the jobs are queued (what autovacuum does after 1,000 "
        "changes with migration 0010's settings; this server runs no autovacuum)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a drain of one database URL
    args = parser.parse_args()
    if args.child:
        os.environ["DATABASE_URL"] = args.child
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
        import django

        django.setup()
        logging.getLogger("tombstones").setLevel(logging.ERROR)
        drain(args.jobs, analyze=args.analyze)
        return

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    if args.sqlite:
        folder = ROOT / "artifacts"
        folder.mkdir(exist_ok=True)
        urls = {k: f"sqlite:///{folder / f'bench_ledger_{k}.sqlite3'}" for k in ("empty", "full")}
    else:
        from bench.run import ensure_pg_database

        urls = {k: f"{args.pg_url}_{k}" for k in ("empty", "full")}
        for url in urls.values():
            ensure_pg_database(url)
    os.environ["DATABASE_URL"] = urls["empty"]

    import django
    from django.conf import settings

    django.setup()
    for key, url in urls.items():
        import environ

        config = environ.Env.db_url_config(url)
        if "sqlite3" in config["ENGINE"]:
            config["OPTIONS"] = dict(settings.SQLITE_OPTIONS)
        settings.DATABASES[key] = {**settings.DATABASES["default"], **config}
    logging.getLogger("tombstones").setLevel(logging.ERROR)

    for url in urls.values():
        # Each database as the default one of its own process: a third-party data migration
        # (django-tasks-db's) writes through the default alias, which would wait on this one.
        env = {**os.environ, "DATABASE_URL": url}
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0", "--no-input"],
            check=True,
            env=env,
        )
    seeded = ensure_seeded("full", args.ledger)
    print(json.dumps({"ledger": args.ledger, "seeded_s": seeded}), flush=True)
    indexes(args.old_indexes)

    results: dict[str, list[float]] = {"empty": [], "full": []}
    for _ in range(args.rounds):
        for key in ("empty", "full"):
            cleanup(key)
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    urls[key],
                    "--jobs",
                    str(args.jobs),
                    *(["--analyze"] if args.analyze else []),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            line = json.loads(out.strip().splitlines()[-1])
            print(json.dumps({"ledger": key, **line}), flush=True)
            results[key].append(line["jobs_per_s"])
            cleanup(key)
    summary = {
        "ledger": args.ledger,
        "vendor": "sqlite" if args.sqlite else "postgresql",
        "old_indexes": args.old_indexes,
        "analyze": args.analyze,
        "jobs": args.jobs,
        "empty_jobs_per_s": [round(r, 1) for r in results["empty"]],
        "full_jobs_per_s": [round(r, 1) for r in results["full"]],
        "ratio_full_to_empty": round(
            statistics.median(results["full"]) / statistics.median(results["empty"]), 3
        ),
    }
    print(json.dumps(summary), flush=True)
    pages = [] if args.no_pages else admin_pages(urls["full"], args.repeat)
    print(f"\n{args.ledger:,} finished jobs ({summary['vendor']}), seeded in {seeded} s\n")
    print("| what | figure |\n|---|---:|")
    print(f"| drain, empty ledger, jobs/s (rounds) | {summary['empty_jobs_per_s']} |")
    print(f"| drain, full ledger, jobs/s (rounds) | {summary['full_jobs_per_s']} |")
    print(f"| drain, full / empty (medians) | {summary['ratio_full_to_empty']}x |")
    for page in pages:
        print(f"| {page['page']}, median of {args.repeat} ms | {page['ms']} |")


def admin_pages(url: str, repeat: int) -> list[dict]:
    """The audit pages on the full ledger (bench/admin_pages.py, its own process)."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "admin_pages.py"),
            "--pg-url",
            url,
            "--repeat",
            str(repeat),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pages = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for page in pages:
        print(json.dumps(page), flush=True)
    return pages


def ensure_seeded(key: str, n: int) -> float:
    from django.db import connections

    from bench.ledger import seed_finished

    with connections[key].cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM tombstones_job WHERE owner = 'seed'")
        have = cursor.fetchone()[0]
    if have >= n:
        return 0.0
    started = time.monotonic()
    seed_finished(n - have, using=key)
    if connections[key].vendor == "postgresql":
        connections[key].ensure_connection()
        with connections[key].cursor() as cursor:
            cursor.execute("VACUUM ANALYZE tombstones_job")
            cursor.execute("VACUUM ANALYZE tombstones_jobevent")
            # The seed's dirty pages written out now, not by a checkpoint during a drain (the
            # first drains after a fresh seed of 1 M ran at 0.03-0.33x of the later ones).
            cursor.execute("CHECKPOINT")
    return round(time.monotonic() - started, 1)


def indexes(old: bool) -> None:
    """Put back (or take away) the pre-0010 indexes on every bench database."""
    from django.db import connections

    for key in ("empty", "full"):
        with connections[key].cursor() as cursor:
            for name, create in OLD_INDEXES.items():
                cursor.execute(f"DROP INDEX IF EXISTS {name}")
                if old:
                    cursor.execute(create)


def drain(n: int, *, analyze: bool = False) -> None:
    """In the child: enqueue ``n`` jobs, one customer each, and drain them in this process."""
    from django.db import transaction

    import tombstones
    from bench.run import HANDLER
    from project.customers.models import Customer
    from tombstones.jobs import wakeups
    from tombstones.jobs.engine import runner
    from tombstones.models import Job

    for name in ("wake_soon", "hand_off", "call_helper", "helper_arrived"):
        setattr(wakeups, name, lambda *a, **k: None)
    wakeups.open_gate = lambda *a, **k: False  # type: ignore[assignment]
    runner.cluster_workers = lambda: 1  # type: ignore[assignment]

    Customer.objects.bulk_create(
        [
            Customer(reference=f"L{i:07d}", name="Bench", email="bench@example.invalid")
            for i in range(n)
        ],
        batch_size=500,
    )
    for customer in Customer.objects.order_by("pk"):
        with transaction.atomic():  # one request, one enqueue
            tombstones.enqueue(HANDLER, customer)
    if analyze:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("ANALYZE tombstones_job")
    wall = time.perf_counter()
    done, idle = 0, 0
    # A pump can come back empty while jobs wait (a claim that lost a race, a lane's hand-over):
    # drain until none is left, a bounded number of empty pumps.
    while idle < 50:
        ran = runner.pump()
        done += len(ran)
        if ran:
            idle = 0
        elif Job.objects.filter(status__in=Job.UNFINISHED).exists():
            idle += 1
        else:
            break
    wall = time.perf_counter() - wall
    left = Job.objects.exclude(owner="seed").exclude(status="succeeded").count()
    print(json.dumps({"jobs": done, "left": left, "jobs_per_s": round(done / wall, 1)}))


def cleanup(key: str) -> None:
    from django.db import connections

    with connections[key].cursor() as cursor:
        cursor.execute(
            "DELETE FROM tombstones_jobevent WHERE job_id IN "
            "(SELECT id FROM tombstones_job WHERE owner <> 'seed')"
        )
        cursor.execute("DELETE FROM tombstones_job WHERE owner <> 'seed'")
        cursor.execute("DELETE FROM customers_sheetrow")
        cursor.execute("DELETE FROM customers_customer")
        if connections[key].vendor == "postgresql":
            cursor.execute("VACUUM ANALYZE tombstones_job")
            cursor.execute("VACUUM ANALYZE customers_customer")


if __name__ == "__main__":
    main()
