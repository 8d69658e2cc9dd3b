"""Enqueue throughput (issue 34): jobs/s of the enqueue alone, no cluster running.

    .venv/bin/python bench/enqueue_rate.py --json bench/results/issue34/enqueue-rate-2cores.json
    .venv/bin/python bench/enqueue_rate.py --jobs 200 --reps 1        # a quick look

PostgreSQL with the Redis broker (a scratch database of its own, ``bench_enqueue``, created when
missing; bench/run.py's Redis and helpers), no worker: the jobs pile up (their wake-up messages
in a Redis queue of a name of their own, deleted after each measurement, as are the keys next
to it). Per measurement: the job, lane and task tables emptied (sequences reset), this process's
cache of lanes cleared, ``--jobs`` fresh customers created, a CHECKPOINT, then the clock runs
over the enqueues only. Measurements (a variant in a mode):

- mode ``1/tx``: one job per transaction (``with transaction.atomic(): <enqueue one>``: a request
  that enqueues one job); mode ``500/tx``: ``--batch`` jobs per transaction (one enqueue call
  per job, or one bulk call);
- ``fenced``: ``tombstones.enqueue("bench.touch", customer)``, every job its customer's first:
  a new lane;
- ``fenced-known``: the same, each customer already holding a queued job (made with one
  ``enqueue_many`` before the clock): lanes this process knows (the engine's cache);
- ``fenced-many``: ``tombstones.enqueue_many("bench.touch", customers)``, ``--batch`` records per
  call and transaction (``500/tx``), and once ``--big`` records in one call (``5000/tx``, that
  many jobs);
- ``baseline``: ``async_task("bench.tasks.fast_touch", pk, save=False)`` (bench/run.py's
  ``baseline-fast`` enqueue; django-q2 opens a broker, so a Redis connection, per call). It
  writes nothing to the database: its transaction is empty;
- ``tasks``: ``bench.benchapp.tasks.touch.enqueue(customer)``, ``TombstoneBackend`` through
  Django's tasks framework (``TASKS["default"]`` of bench.settings);
- ``tasks-db``: ``bench.benchapp.tasks_db.touch.enqueue(pk)``, django-tasks-db 0.13.0's
  ``DatabaseBackend`` (``TASKS["tasks_db"]`` of bench.settings, when the ``bench`` extra is
  installed).

``--reps`` repetitions, the measurements' order rotated per repetition; the table shows the
median jobs/s (min-max), the statements per job (bench/sqlcount.py, transaction control apart),
Redis commands and connections per job, and jobs/s over tasks-db's in the same mode. Each
measurement waits until no other benchmark runs (as bench/latency.py); ``--profile fenced:1``
adds a cProfile of one more measurement (not in the figures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VARIANTS = ("fenced", "fenced-known", "fenced-many", "baseline", "tasks", "tasks-db")
DB_TASK_VARIANT = "tasks-db"
TARGET_VS_TASKS_DB = 1.5
TARGET_MANY_PER_S = 5000.0

_redis_counts: Counter[str] = Counter()


# A scratch database of its own (created when missing): other benchmarks reset bench/run.py's.
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_enqueue"
PG_HELP = "scratch database (created when missing; a test database is refused)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from bench.run import DEFAULT_REDIS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS), help=",".join(VARIANTS))
    p.add_argument("--jobs", type=int, default=2000, help="jobs per measurement")
    p.add_argument("--batch", type=int, default=500, help="jobs per transaction (mode 500/tx)")
    p.add_argument("--big", type=int, default=5000, help="fenced-many: records in one call")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median, min, max)")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG), help=PG_HELP)
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    p.add_argument("--profile", default="", help="cProfile one rep of VARIANT:MODE, e.g. fenced:1")
    p.add_argument("--json", default="", help="write the results here")
    args = p.parse_args(argv)
    args.sqlite_path = ""  # bench.run.setup_django's, unused (PostgreSQL only)
    args.conn_max_age = None
    unknown = set(csv(args.variants)) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown --variants {','.join(sorted(unknown))}")
    return args


def csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def measurements(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """(variant, jobs per transaction, jobs) of every measurement."""
    from importlib.util import find_spec

    out: list[tuple[str, int, int]] = []
    for variant in csv(args.variants):
        if variant == DB_TASK_VARIANT and find_spec("django_tasks_db") is None:
            raise SystemExit('tasks-db needs django-tasks-db: .venv/bin/pip install -e ".[bench]"')
        if variant == "fenced-many":
            out.append((variant, args.batch, args.jobs))
            if args.big:
                out.append((variant, args.big, max(args.jobs, args.big)))
        else:
            out += [(variant, 1, args.jobs), (variant, args.batch, args.jobs)]
    return out


def main(argv: list[str] | None = None) -> int:
    from bench import run as harness
    from bench.latency import others_running, wait_quiet

    args = parse_args(argv)
    harness.interrupt_on_signals()
    harness.setup_django(args, "postgres", "redis")
    count_redis()
    import logging

    # django-q2 logs every async_task at INFO ("Enqueued ..."); the demo's logging prints it.
    logging.getLogger("django-q").setLevel(logging.WARNING)
    plan = measurements(args)
    started = time.time()
    results: dict[str, Any] = {
        **harness.run_header("bench/enqueue_rate.py", argv),
        "settings": {
            "jobs": args.jobs,
            "batch": args.batch,
            "big": args.big,
            "reps": args.reps,
            "db": "postgres",
            "broker": "redis",
        },
        "runs": [],
    }
    for rep in range(args.reps):
        shift = rep % len(plan)
        for variant, per_tx, jobs in plan[shift:] + plan[:shift]:
            wait_quiet()
            run = measure(variant, per_tx, jobs)
            run["others_running_after"] = others_running()
            run["rep"] = rep
            results["runs"].append(run)
            print(one_line(run), flush=True)
    if args.profile:
        wait_quiet()
        variant, _, mode = args.profile.partition(":")
        per_tx = int(mode or 1)
        results["profile"] = profile(variant, per_tx, args.jobs)
        print(results["profile"])
    results["summary"] = summarise(results["runs"])
    results["seconds"] = round(time.time() - started, 1)
    print()
    print(render(results["summary"]))
    if args.json:
        harness.write_json(args.json, results)
        print(f"\nJSON: {args.json}")
    return 0


def count_redis() -> None:
    """Count every Redis command and new connection of this process."""
    import redis
    from redis.connection import AbstractConnection

    execute = redis.Redis.execute_command
    connect = AbstractConnection.connect

    def counted_execute(self: Any, *args: Any, **options: Any) -> Any:
        _redis_counts["commands"] += 1
        return execute(self, *args, **options)

    def counted_connect(self: Any) -> Any:
        if not getattr(self, "_sock", None):  # redis-py calls connect() before every command
            _redis_counts["connects"] += 1
        return connect(self)

    redis.Redis.execute_command = counted_execute  # type: ignore[method-assign]
    AbstractConnection.connect = counted_connect  # type: ignore[method-assign]


def prepare(variant: str, jobs: int) -> list[Any]:
    """Empty tables and caches, ``jobs`` fresh customers (and for fenced-known a queued job
    each, its lane known to this process)."""
    from django.db import connection, transaction

    import tombstones
    from bench import run as harness
    from bench.latency import reset
    from bench.run import HANDLER

    reset()  # lanes too, and the engine's cache of lanes seen: every lane is new again
    records = harness.seed("many", jobs, 1)
    if variant == "fenced-known":
        with transaction.atomic():
            tombstones.enqueue_many(HANDLER, records)
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")  # no checkpoint of the seed's writes inside the clock
    return records


def enqueue(variant: str, records: list[Any], per_tx: int) -> None:
    from django.db import transaction

    import tombstones
    from bench.run import FAST, HANDLER

    if variant in ("fenced", "fenced-known"):

        def one(record: Any) -> None:
            tombstones.enqueue(HANDLER, record)

    elif variant == "baseline":
        from django_q.tasks import async_task

        def one(record: Any) -> None:
            async_task(FAST, record.pk, save=False)

    elif variant == "tasks":
        from bench.benchapp.tasks import touch

        def one(record: Any) -> None:
            touch.enqueue(record)

    elif variant == "tasks-db":
        from bench.benchapp.tasks_db import touch as db_touch

        def one(record: Any) -> None:
            db_touch.enqueue(record.pk)

    elif variant != "fenced-many":
        raise SystemExit(f"unknown variant {variant!r}")
    for start in range(0, len(records), per_tx):
        chunk = records[start : start + per_tx]
        with transaction.atomic():
            if variant == "fenced-many":
                tombstones.enqueue_many(HANDLER, chunk)
            else:
                for record in chunk:
                    one(record)


def measure(variant: str, per_tx: int, jobs: int) -> dict[str, Any]:
    from django_q.brokers import get_broker

    from bench import sqlcount
    from project.stress.cluster import queue_namespace

    records = prepare(variant, jobs)
    name = f"bench-rate-{uuid.uuid4().hex[:8]}"
    load = round(os.getloadavg()[0], 2)
    with queue_namespace(name):
        sql_before = sqlcount.snapshot()
        redis_before = Counter(_redis_counts)
        t0 = time.perf_counter()
        enqueue(variant, records, per_tx)
        elapsed = time.perf_counter() - t0
        sql_after = sqlcount.snapshot()
        redis_after = Counter(_redis_counts)
        broker = get_broker(name)
        messages = broker.queue_size() or 0
        redis = broker.connection
        keys = [k.decode() for k in redis.scan_iter(match=f"django_q:{name}:*")]
        if keys:
            redis.delete(*keys)
        broker.connection.close()
    queued = queued_count(variant, jobs)
    stmts = Counter(sql_after["statements"])
    stmts.subtract(sql_before["statements"])
    data = sum(c for sql, c in stmts.items() if not sqlcount.is_tx_control(sql))
    tx = sum(stmts.values()) - data
    return {
        "variant": variant,
        "per_tx": per_tx,
        "jobs": jobs,
        "seconds": round(elapsed, 4),
        "jobs_per_s": round(jobs / elapsed, 1),
        "queued": queued,
        "messages": messages,
        "ok": queued == jobs,
        "sql_per_job": round(data / jobs, 3),
        "tx_control_per_job": round(tx / jobs, 3),
        "commits_per_job": round((sql_after["commits"] - sql_before["commits"]) / jobs, 4),
        "redis_commands_per_job": round(
            (redis_after["commands"] - redis_before["commands"]) / jobs, 3
        ),
        "redis_connects_per_job": round(
            (redis_after["connects"] - redis_before["connects"]) / jobs, 3
        ),
        "statements": {sql[:200]: round(c / jobs, 5) for sql, c in stmts.most_common() if c > 0},
        "loadavg": load,
    }


def queued_count(variant: str, jobs: int) -> int:
    """The measured jobs found queued (baseline: its messages, counted by the caller)."""
    from bench.run import db_task_result_model
    from tombstones.models import Job

    if variant == "baseline":
        return -1
    if variant == DB_TASK_VARIANT:
        return db_task_result_model().objects.count()
    if variant == "fenced-known":  # the jobs made before the clock are not the measured ones
        return Job.objects.count() - jobs
    return Job.objects.count()


def profile(variant: str, per_tx: int, jobs: int) -> str:
    """The enqueue's top functions by cumulative time (cProfile), for the report."""
    import cProfile
    import io
    import pstats

    from project.stress.cluster import queue_namespace

    records = prepare(variant, jobs)
    name = f"bench-rate-{uuid.uuid4().hex[:8]}"
    with queue_namespace(name):
        prof = cProfile.Profile()
        prof.enable()
        enqueue(variant, records, per_tx)
        prof.disable()
        from django_q.brokers import get_broker

        broker = get_broker(name)
        keys = list(broker.connection.scan_iter(match=f"django_q:{name}:*"))
        if keys:
            broker.connection.delete(*keys)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(50)
    return out.getvalue()


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["variant"], run["per_tx"]), []).append(run)
    rows = []
    for (variant, per_tx), reps in groups.items():
        rates = [r["jobs_per_s"] for r in reps]

        def med(field: str, reps: list[dict[str, Any]] = reps) -> Any:
            return round(statistics.median(r[field] for r in reps), 3)

        rows.append(
            {
                "variant": variant,
                "per_tx": per_tx,
                "jobs": reps[0]["jobs"],
                "reps": len(reps),
                "ok": all(r["ok"] or r["variant"] == "baseline" for r in reps),
                "jobs_per_s_median": round(statistics.median(rates), 1),
                "jobs_per_s_min": round(min(rates), 1),
                "jobs_per_s_max": round(max(rates), 1),
                "sql_per_job": med("sql_per_job"),
                "tx_control_per_job": med("tx_control_per_job"),
                "commits_per_job": med("commits_per_job"),
                "redis_commands_per_job": med("redis_commands_per_job"),
                "redis_connects_per_job": med("redis_connects_per_job"),
                "statements": reps[0]["statements"],
            }
        )
    base = {
        "single" if r["per_tx"] == 1 else "batch": r["jobs_per_s_median"]
        for r in rows
        if r["variant"] == DB_TASK_VARIANT
    }
    for r in rows:
        b = base.get("single" if r["per_tx"] == 1 else "batch")
        r["vs_tasks_db"] = round(r["jobs_per_s_median"] / b, 2) if b else None
    order = {v: i for i, v in enumerate(VARIANTS)}
    rows.sort(key=lambda r: (r["per_tx"] != 1, r["per_tx"], order[r["variant"]]))
    return rows


def one_line(run: dict[str, Any]) -> str:
    return (
        f"  rep={run['rep']} {run['variant']:<12} {run['per_tx']:>5}/tx {run['jobs']} jobs "
        f"{run['jobs_per_s']:>8.1f} jobs/s sql/job {run['sql_per_job']} "
        f"redis/job {run['redis_commands_per_job']} load {run['loadavg']}"
        f"{'' if run['ok'] or run['variant'] == 'baseline' else ' QUEUED ' + str(run['queued'])}"
    )


def render(summary: list[dict[str, Any]]) -> str:
    lines = [
        "| jobs/tx | variant | jobs | jobs/s median (min-max) | vs tasks-db | SQL/job "
        "| tx control/job | Redis cmds/job | Redis connects/job |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in summary:
        vs = "-" if r["vs_tasks_db"] is None else f"{r['vs_tasks_db']:.2f}x"
        lines.append(
            f"| {r['per_tx']} | {r['variant']}{'' if r['ok'] else ' (MISSING JOBS)'} "
            f"| {r['jobs']} | {r['jobs_per_s_median']:.0f} ({r['jobs_per_s_min']:.0f}-"
            f"{r['jobs_per_s_max']:.0f}) | {vs} | {r['sql_per_job']:.3f} "
            f"| {r['tx_control_per_job']:.3f} | {r['redis_commands_per_job']:.3f} "
            f"| {r['redis_connects_per_job']:.3f} |"
        )
    lines += ["", "Targets:"]
    for r in summary:
        if r["variant"] == "fenced" and r["per_tx"] == 1 and r["vs_tasks_db"] is not None:
            met = "met" if r["vs_tasks_db"] >= TARGET_VS_TASKS_DB else "MISSED"
            lines.append(
                f"- fenced, one job per transaction >= 1.5x tasks-db: {r['vs_tasks_db']:.2f}x "
                f"({met})"
            )
        if r["variant"] == "fenced-many":
            met = "met" if r["jobs_per_s_median"] >= TARGET_MANY_PER_S else "MISSED"
            lines.append(
                f"- enqueue_many, {r['per_tx']} records per call >= 5,000 jobs/s: "
                f"{r['jobs_per_s_median']:.0f} ({met})"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
