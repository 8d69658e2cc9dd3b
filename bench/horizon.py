"""A pinned horizon (issue 21): a REPEATABLE READ transaction held open while the workers run.

    .venv/bin/python bench/horizon.py                  # 60 s before, 3 min pinned, 2 min after
    .venv/bin/python bench/horizon.py --quick          # 30 s before, 60 s pinned, 60 s after
    .venv/bin/python bench/horizon.py --pin 600 --json bench/results/horizon.json

One ``qcluster`` (``--workers``, PostgreSQL + Redis, ``bench.settings``) drains a stream of
fenced ordered ``bench.touch`` jobs that this process keeps enqueueing at full rate, ``--per-tx``
jobs per transaction (a backlog of about ``--backlog`` unfinished jobs is kept topped up, so the
workers never wait for work). After ``--before`` seconds another connection opens a
``REPEATABLE READ`` transaction, reads the job table (its snapshot now pins the cleanup horizon:
no dead row newer than it can be vacuumed in this database) and holds it ``--pin`` seconds; then
it commits and the run goes on ``--after`` seconds.

Every ``--window`` seconds it prints: jobs finished per second; the queue wait of those jobs
(enqueue to claim, ``started_at - queued_at``, median and p95, database clock); the claim's
look (its first statement, the scan of the hints that came due, as ``heads.read_lanes`` builds
it; its SQL run and fetched here ``--probes`` times a window, median and p95: from the first
hint, as a worker scans at least once a second, and from the floor its other scans start at,
``hint_floor``); the dead rows of
``tombstones_job`` and ``tombstones_jobevent`` (``pg_stat_user_tables.n_dead_tup``). It prints
the look's ``EXPLAIN (ANALYZE, BUFFERS)`` before the pin, at its end and after it.

``--vacuum N`` runs ``VACUUM`` of both tables every N seconds from here (default 10), standing
in for autovacuum: the PostgreSQL of this machine runs with ``autovacuum = off``, where dead rows
pile up pin or no pin (``--vacuum 0`` shows that).

Scratch database ``--pg-url`` (default ``.../bench_hosts_horizon``, created when missing; a test
database is refused).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_hosts_horizon"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--before", type=float, default=60.0, help="seconds before the pin")
    parser.add_argument("--pin", type=float, default=180.0, help="seconds the pin is held")
    parser.add_argument("--after", type=float, default=120.0, help="seconds after the release")
    parser.add_argument("--quick", action="store_true", help="--before 30 --pin 60 --after 60")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per window")
    parser.add_argument("--backlog", type=int, default=2000, help="unfinished jobs kept queued")
    parser.add_argument(
        "--per-tx",
        type=int,
        default=20,
        help="jobs enqueued per transaction (a burst of saves), so the stream outruns the workers",
    )
    parser.add_argument("--customers", type=int, default=5000, help="records the jobs touch")
    parser.add_argument("--probes", type=int, default=10, help="timed looks per window")
    parser.add_argument(
        "--vacuum",
        type=float,
        default=10.0,
        help="seconds between VACUUMs of the two tables run here, standing in for autovacuum "
        "(0: none; the server's autovacuum, if on, runs anyway)",
    )
    parser.add_argument("--json", help="write every window here")
    args = parser.parse_args(argv)
    if args.quick:
        args.before, args.pin, args.after = 30.0, 60.0, 60.0
    return args


def setup(args: argparse.Namespace) -> None:
    from bench.run import ensure_pg_database

    ensure_pg_database(args.pg_url)  # refuses a test database
    os.environ["DATABASE_URL"] = args.pg_url
    os.environ["REDIS_URL"] = args.redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ.setdefault("TEST_DB_SUFFIX", "")
    import django

    django.setup()
    from django.core.management import call_command
    from django_q.models import Schedule

    call_command("migrate", verbosity=0, interactive=False)
    Schedule.objects.all().delete()


def look_queryset(floor: Any = None) -> Any:
    """The claim's first statement: its scan of the hints that came due (``heads.read_lanes``,
    a claim of one worker's batch), which every later statement of the claim follows. From the
    first hint (a worker's scan at least once a second), or from ``floor`` (its other scans:
    ``hint_floor``)."""
    from tombstones.conf import tombstone_settings
    from tombstones.jobs import queries
    from tombstones.jobs.ledger import heads
    from tombstones.models import Job

    scan = min(tombstone_settings.BATCH_SIZE * 2, heads.MAX_LANES)
    fields = ("lane", "id", "ready_at", "status")
    if floor is not None:
        return heads.hints_from("default", floor, fields)[:scan]
    # The default queue's range of the hint index, as the claim reads it (.queries.hint_range).
    hints = Job.objects.hinted().filter(queries.hint_range("default", "default"))
    return hints.order_by(*queries.HINT_ORDER).values_list(*fields)[:scan]


def floor_look() -> tuple[str, Any]:
    """The look from a worker's floor as it stands now: the first hint that came due, less the
    margin (read here with a scan from the first hint, not timed)."""
    from tombstones.jobs.ledger import hint_floor
    from tombstones.models import Job

    first = Job.objects.hinted().values_list("ready_at", flat=True).first()
    floor = None if first is None else first - hint_floor.MARGIN
    return look_queryset(floor).query.sql_with_params()


class Feeder(threading.Thread):
    """Enqueues fenced ordered jobs, ``per_tx`` per transaction, keeping ``backlog`` unfinished."""

    def __init__(self, backlog: int, per_tx: int, customers: list[Any], name: str) -> None:
        super().__init__(daemon=True)
        self.backlog, self.per_tx = backlog, max(1, per_tx)
        self.customers, self.name_ = customers, name
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        from django.db import connection, transaction

        import tombstones
        from bench.run import HANDLER
        from project.stress.cluster import queue_namespace
        from tombstones.models import Job

        try:
            with queue_namespace(self.name_):
                i = 0
                while not self.stop.is_set():
                    unfinished = Job.objects.filter(status__in=Job.UNFINISHED).count()
                    if unfinished >= self.backlog:
                        time.sleep(0.05)
                        continue
                    for _ in range(0, min(1000, self.backlog - unfinished), self.per_tx):
                        with transaction.atomic():  # a burst of saves, one commit
                            for _ in range(self.per_tx):
                                record = self.customers[i % len(self.customers)]
                                i += 1
                                tombstones.enqueue(HANDLER, record)
                        self.sent += self.per_tx
        finally:
            connection.close()


def time_look(sql: str, params: Any) -> float:
    """Milliseconds to run the claim's look and fetch its rows (the SQL alone, no ORM)."""
    from django.db import connection

    with connection.cursor() as cursor:
        t = time.perf_counter()
        cursor.execute(sql, params)
        cursor.fetchall()
        return (time.perf_counter() - t) * 1000


class Vacuumer(threading.Thread):
    """``VACUUM (VERBOSE)`` of the job and event tables every ``every`` seconds, as autovacuum
    would (this machine's PostgreSQL runs with ``autovacuum = off``): what each one removed and
    what it found dead but not yet removable (newer than the oldest snapshot)."""

    PATTERN = re.compile(
        r"tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable"
    )

    def __init__(self, url: str, every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every = url, every
        self.stop = threading.Event()
        self.runs: list[dict[str, Any]] = []

    def run(self) -> None:
        import psycopg

        notices: list[str] = []
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
            while not self.stop.wait(self.every):
                for table in ("tombstones_job", "tombstones_jobevent"):
                    notices.clear()
                    t = time.perf_counter()
                    conn.execute(f"VACUUM (VERBOSE) {table}")
                    found = [m for n in notices if (m := self.PATTERN.search(n))]
                    # The first is the table's own; its TOAST table follows.
                    removed, _, kept = (int(x) for x in found[0].groups()) if found else (0, 0, 0)
                    self.runs.append(
                        {
                            "at": time.time(),
                            "table": table,
                            "ms": round((time.perf_counter() - t) * 1000, 1),
                            "removed": removed,
                            "not_removable": kept,
                        }
                    )


def pin_connection(url: str) -> Any:
    import psycopg

    conn = psycopg.connect(url)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT count(*) FROM tombstones_job").fetchone()  # the snapshot is taken
    return conn


def dead_rows() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, n_dead_tup, n_live_tup FROM pg_stat_user_tables "
            "WHERE relname IN ('tombstones_job', 'tombstones_jobevent')"
        )
        found = {}
        for name, dead, live in cursor.fetchall():
            found[f"{name}_dead"] = dead
            found[f"{name}_live"] = live
        return found


def horizon_age() -> float | None:
    """Seconds since the oldest open snapshot of this database began (its xact_start)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM now() - min(xact_start)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_xmin IS NOT NULL "
            "AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    return round(float(row[0]), 1) if row and row[0] is not None else None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def window(
    phase: str,
    t_from: float,
    t_to: float,
    t0: float,
    probes: list[float],
    vacuums: list[dict[str, Any]],
) -> dict[str, Any]:
    from datetime import UTC, datetime

    from django.db.models import DurationField, ExpressionWrapper, F

    from tombstones.models import Job

    start = datetime.fromtimestamp(t_from, UTC)
    end = datetime.fromtimestamp(t_to, UTC)
    done = Job.objects.filter(finished_at__gte=start, finished_at__lt=end)
    waits = [
        d.total_seconds() * 1000
        for d in done.filter(started_at__isnull=False)
        .annotate(
            wait=ExpressionWrapper(F("started_at") - F("queued_at"), output_field=DurationField())
        )
        .values_list("wait", flat=True)
    ]
    count = done.count()
    mine = [v for v in vacuums if t_from <= v["at"] < t_to and v["table"] == "tombstones_job"]
    return {
        "phase": phase,
        "t": round(t_from - t0),
        "jobs_per_s": round(count / (t_to - t_from), 1),
        "wait_p50_ms": _r(statistics.median(waits) if waits else None),
        "wait_p95_ms": _r(pct(waits, 0.95)),
        "look_p50_ms": _r(statistics.median(probes) if probes else None),
        "look_p95_ms": _r(pct(probes, 0.95)),
        **dead_rows(),
        "vacuum_removed": sum(v["removed"] for v in mine) if mine else None,
        "vacuum_not_removable": mine[-1]["not_removable"] if mine else None,
        "vacuum_ms": max(v["ms"] for v in mine) if mine else None,
        "backlog": Job.objects.filter(status__in=Job.UNFINISHED).count(),
        "horizon_s": horizon_age(),
        "loadavg": round(os.getloadavg()[0], 2),
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def explain(label: str) -> str:
    plan = look_queryset().explain(analyze=True, buffers=True)
    return f"--- EXPLAIN (ANALYZE, BUFFERS) of the claim's look, {label}\n{plan}"


def render(rows: list[dict[str, Any]]) -> str:
    out = [
        "| phase | t s | jobs/s | backlog | queue wait p50 / p95 ms | claim look p50 / p95 ms "
        "| look from the floor p50 / p95 ms "
        "| dead rows job | dead rows jobevent | vacuum: removed / not yet removable (job) "
        "| live job rows | horizon age s | load |",
        "|---|---:|---:|---:|---|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['phase']} | {r['t']} | {r['jobs_per_s']} | {r['backlog']} | "
            f"{r['wait_p50_ms']} / {r['wait_p95_ms']} | {r['look_p50_ms']} / {r['look_p95_ms']} | "
            f"{r.get('floor_look_p50_ms')} / {r.get('floor_look_p95_ms')} | "
            f"{r.get('tombstones_job_dead')} | {r.get('tombstones_jobevent_dead')} | "
            f"{r['vacuum_removed']} / {r['vacuum_not_removable']} | "
            f"{r.get('tombstones_job_live')} | {r['horizon_s']} | {r['loadavg']} |"
        )
    return "\n".join(out)


def summary(rows: list[dict[str, Any]]) -> str:
    lines = []
    for phase in ("before", "pinned", "after"):
        same = [r for r in rows if r["phase"] == phase]
        if not same:
            continue
        rates = [r["jobs_per_s"] for r in same]
        looks = [r["look_p50_ms"] for r in same if r["look_p50_ms"] is not None]
        floors = [r["floor_look_p50_ms"] for r in same if r.get("floor_look_p50_ms") is not None]
        floor = f"{statistics.median(floors):g} ms" if floors else "-"
        lines.append(
            f"{phase}: {statistics.median(rates):g} jobs/s median of {len(same)} windows "
            f"(min {min(rates):g}), claim look median {statistics.median(looks):g} ms "
            f"(from the floor {floor}), "
            f"dead job rows {same[-1].get('tombstones_job_dead')}, "
            f"dead event rows {same[-1].get('tombstones_jobevent_dead')} at its end"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup(args)
    import redis
    from django.db import connection

    from bench.run import reset_tables, seed
    from project.stress.cluster import Cluster

    reset_tables()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE tombstones_job")
        cursor.execute("VACUUM ANALYZE tombstones_jobevent")
    customers = seed("many", args.customers, 1)
    name = f"horizon-{uuid.uuid4().hex[:8]}"
    env = {"TOMBSTONES_LOG_LEVEL": "WARNING", "BENCH_Q_RECYCLE": "100000"}
    cluster = Cluster(args.workers, name=name, settings_module="bench.settings", env=env)
    feeder = Feeder(args.backlog, args.per_tx, customers, name)
    vacuum = Vacuumer(args.pg_url, args.vacuum)
    rows: list[dict[str, Any]] = []
    plans: list[str] = []
    pin = None
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    sql, params = look_queryset().query.sql_with_params()
    try:
        cluster.start(ready_timeout=90)
        feeder.start()
        if args.vacuum > 0:
            vacuum.start()
        t0 = time.time()
        phases = [
            ("before", args.before),
            ("pinned", args.pin),
            ("after", args.after),
        ]
        for phase, seconds in phases:
            if phase == "pinned":
                plans.append(explain("before the pin"))
                pin = pin_connection(args.pg_url)
            if phase == "after" and pin is not None:
                plans.append(explain("at the end of the pin"))
                pin.execute("COMMIT")
                pin.close()
                pin = None
            phase_end = time.time() + seconds
            while time.time() < phase_end - 0.5:
                w_start = time.time()
                w_end = min(w_start + args.window, phase_end)
                probes, floored = [], []
                every = (w_end - w_start) / max(args.probes, 1)
                while time.time() < w_end:
                    probes.append(time_look(sql, params))
                    floored.append(time_look(*floor_look()))
                    time.sleep(max(0.0, min(every, w_end - time.time())))
                time.sleep(1.0)  # jobs finishing at the window's end are committed
                row = window(phase, w_start, w_end, t0, probes, list(vacuum.runs))
                row["floor_look_p50_ms"] = _r(statistics.median(floored))
                row["floor_look_p95_ms"] = _r(pct(floored, 0.95))
                rows.append(row)
                print(json.dumps(row), flush=True)
        plans.append(explain(f"{args.after:.0f} s after the release"))
    finally:
        feeder.stop.set()
        vacuum.stop.set()
        feeder.join(30)
        if vacuum.is_alive():
            vacuum.join(60)
        if pin is not None:
            pin.close()
        cluster.stop()
        client = redis.Redis.from_url(args.redis_url)
        key = f"django_q:{name}:q"
        client.delete(key, f"{key}:tombstones:gate", f"{key}:tombstones:helper")
        client.close()
    print()
    print("\n\n".join(plans))
    print()
    print(render(rows))
    print()
    print(summary(rows))
    print(f"enqueued {feeder.sent} jobs; load average now {os.getloadavg()}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "windows": rows, "plans": plans}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
