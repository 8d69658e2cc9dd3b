"""Idle latency (issue 34): one job at a time into an idle, warmed-up cluster.

    .venv/bin/python bench/latency.py --workers 1,2 --json bench/results/issue34/latency-2cores.json
    .venv/bin/python bench/latency.py --jobs 20 --workers 1 --variants fenced    # a quick look

Per variant and worker count, on PostgreSQL with the Redis broker (a scratch database of its
own, ``bench_latency``, created when missing; bench/run.py's Redis), with bench/run.py's helpers
(``setup_django``, ``reset_tables``, ``seed``) and its cluster:

1. reset the tables (the lane rows too, and this process's cache of them), create one customer
   per job (warm-up and measured): every job is its customer's first, in a new lane;
2. start a real ``manage.py qcluster`` (project/stress/cluster.py, settings ``bench.settings``,
   ``Q_WORKERS`` = workers) as bench/run.py does, with its connection settings: ``CONN_MAX_AGE``
   600 for ``baseline-fast``, the demo's 0 for the others, unless ``--conn-max-age``;
3. warm it up: ``--warmup`` jobs (not measured), ``--interval`` apart, all finished, then
   ``--idle`` seconds of nothing;
4. enqueue ``--jobs`` jobs from this process, one at a time, on a fixed schedule ``--interval``
   apart (a late enqueue is not caught up: never a burst), each in its own transaction;
5. wait until every job finished; read the times from the rows.

Variants:

- ``fenced``: ``tombstones.enqueue("bench.touch", customer)`` (the customer's lane);
  latency = ``Job.finished_at - Job.created_at``, both the database's clock
  (``STATEMENT_TIMESTAMP()``); also ``to worker`` = the ``started`` of the django-q2 task row
  of the wake-up the job's enqueue sent (a worker began to run it) minus ``created_at``, for the
  jobs whose enqueue sent one (``woken_jobs``), and ``to start`` = ``Job.started_at -
  Job.created_at`` (the wake-up and the claim);
- ``baseline-fast``: ``async_task("bench.tasks.fast_touch", pk, save=False)`` as bench/run.py's
  variant (no task row); the start is ``clock_timestamp()`` read from the database just before
  ``async_task``, the end the customer's ``synced_at``, written by the task (``timezone.now()``
  in the worker: the same host clock as the database's);
- ``tasks``: ``bench.benchapp.tasks.touch.enqueue(customer)`` through ``TombstoneBackend``
  (``TASKS["default"]`` of bench.settings), the fenced job of ``fenced`` through Django's tasks
  framework; latency as ``fenced``.

``write`` is the same end for every variant: the customer's ``synced_at`` (the moment the job's
UPDATE was built) minus the start, so ``fenced``/``tasks`` compare with ``baseline-fast`` on the
same measure too. Printed: p50, p90, p99, max per variant (linear interpolation between ranks),
the ratio fenced/baseline-fast of p50 and p99, the statements per job in the cluster and in this
process during the measured jobs (bench/sqlcount.py), and the machine's load average. Each run
waits until no other benchmark runs (``pgrep -f`` of bench/run.py, plans.py, soak.py: 2 cores)
and records any that ran meanwhile (``others_running_after`` in the JSON).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VARIANTS = ("fenced", "baseline-fast", "tasks")
TARGET_P99_MS = 15.0


# A scratch database of its own (created when missing): other benchmarks reset bench/run.py's.
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_latency"
PG_HELP = "scratch database (created when missing; a test database is refused)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from bench.run import DEFAULT_REDIS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS), help="fenced,baseline-fast,tasks")
    p.add_argument("--workers", default="2", help="Q_WORKERS values (comma list: 1,2)")
    p.add_argument("--jobs", type=int, default=200, help="measured jobs per run")
    p.add_argument("--warmup", type=int, default=10, help="jobs before the measured ones")
    p.add_argument("--idle", type=float, default=2.0, help="seconds idle after the warm-up")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between enqueues")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to finish, after the last")
    p.add_argument("--conn-max-age", type=int, default=None, help="CONN_MAX_AGE for all sides")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG), help=PG_HELP)
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--keep-logs", action="store_true", help="keep the qcluster logs")
    args = p.parse_args(argv)
    args.sqlite_path = ""  # bench.run.setup_django's, unused (PostgreSQL only)
    unknown = set(csv(args.variants)) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown --variants {','.join(sorted(unknown))}")
    return args


def csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    from bench import run as harness

    args = parse_args(argv)
    harness.interrupt_on_signals()
    harness.setup_django(args, "postgres", "redis")
    started = time.time()
    results: dict[str, Any] = {
        **harness.run_header("bench/latency.py", argv),
        "settings": {
            "jobs": args.jobs,
            "warmup": args.warmup,
            "idle_s": args.idle,
            "interval_s": args.interval,
            "conn_max_age": args.conn_max_age,
            "db": "postgres",
            "broker": "redis",
        },
        "runs": [],
    }
    variants = csv(args.variants)
    for workers in [int(w) for w in csv(args.workers)]:
        for variant in variants:
            wait_quiet()
            run = run_once(args, variant, workers)
            run["others_running_after"] = others_running()
            results["runs"].append(run)
            print(one_line(run), flush=True)
            if args.json:  # partial results survive an interrupted run
                harness.write_json(args.json, results)
    results["ratios"] = ratios(results["runs"])
    results["seconds"] = round(time.time() - started, 1)
    print()
    print(render(results))
    if args.json:
        harness.write_json(args.json, results)
        print(f"\nJSON: {args.json}")
    return 0


def run_once(args: argparse.Namespace, variant: str, workers: int) -> dict[str, Any]:
    import shutil

    from bench import run as harness
    from bench import sqlcount
    from project.stress.cluster import Cluster

    reset()
    records = harness.seed("many", args.warmup + args.jobs, 1)
    warm, measured = records[: args.warmup], records[args.warmup :]
    sqldir = tempfile.mkdtemp(prefix="tombstones-latency-sql-")
    env = {
        "BENCH_SQL_DIR": sqldir,
        "TOMBSTONES_LOG_LEVEL": os.environ.get("TOMBSTONES_LOG_LEVEL", "INFO"),
    }
    if args.conn_max_age is not None:
        env["BENCH_CONN_MAX_AGE"] = str(args.conn_max_age)
    elif variant == "baseline-fast":  # as bench/run.py: the careful user keeps connections
        env["BENCH_CONN_MAX_AGE"] = str(harness.FAST_CONN_MAX_AGE)
    log_path = str(Path(sqldir).with_suffix(".qcluster.log"))
    cluster = Cluster(workers, settings_module="bench.settings", env=env, log_path=log_path)
    cluster.start(ready_timeout=90)
    result: dict[str, Any] = {
        "variant": variant,
        "workers": workers,
        "jobs": len(measured),
        "conn_max_age": env.get("BENCH_CONN_MAX_AGE", "demo (0)"),
        "loadavg_before": round(os.getloadavg()[0], 2),
    }
    try:
        with cluster.messages():
            warm_starts = paced(variant, warm, args.interval)
            if not wait_done(variant, warm, warm_starts, time.time() + args.timeout, cluster):
                raise RuntimeError(f"warm-up not done:\n{cluster.log_tail()}")
            time.sleep(args.idle)
            before = sqlcount.read_dir(sqldir)
            enq_before = sqlcount.snapshot()
            starts = paced(variant, measured, args.interval, timings=result)
            enq_after = sqlcount.snapshot()
            complete = wait_done(variant, measured, starts, time.time() + args.timeout, cluster)
        time.sleep(3 * sqlcount.FLUSH_SECONDS)
        after = sqlcount.read_dir(sqldir)
    finally:
        cluster.stop()
    result["loadavg_after"] = round(os.getloadavg()[0], 2)
    result["complete"] = complete
    result.update(collect(variant, measured, starts))
    result.update(sql_figures(sqlcount.diff(before, after), enq_before, enq_after, len(measured)))
    if not complete:
        result["log_tail"] = cluster.log_tail(20)
    if not args.keep_logs:
        shutil.rmtree(sqldir, ignore_errors=True)
        Path(log_path).unlink(missing_ok=True)
    return result


def reset() -> None:
    """bench/run.py's reset, plus the lane rows and this process's cache of them: every job is
    its customer's first, in a new lane, whatever ran before."""
    from django.core.management.color import no_style
    from django.db import connection

    from bench import run as harness
    from tombstones.jobs.ledger import lanes
    from tombstones.jobs.models import Lane

    harness.reset_tables()
    sql = connection.ops.sql_flush(no_style(), [Lane._meta.db_table], reset_sequences=True)
    connection.ops.execute_sql_flush(sql)
    known = getattr(lanes, "_KNOWN", None)
    if known is not None:
        known.clear()


OTHERS = "bench/run.py|bench/plans.py|bench/soak.py"


def others_running() -> list[str]:
    """Other benchmarks running on this machine now (pgrep -f)."""
    import subprocess

    out = subprocess.run(["pgrep", "-af", OTHERS], capture_output=True, text=True, check=False)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def wait_quiet(limit: float = 3600.0, load: float = 1.5) -> None:
    """Wait (at most ``limit`` seconds) until no other benchmark runs (2 cores), then until the
    1-minute load average is below ``load`` (at most 3 minutes more: it decays slowly)."""
    deadline = time.time() + limit
    while (found := others_running()) and time.time() < deadline:
        print(f"  waiting for other benchmarks to end: {found[0][:100]}", flush=True)
        time.sleep(30)
    deadline = time.time() + 180
    while os.getloadavg()[0] >= load and time.time() < deadline and not others_running():
        time.sleep(5)


def paced(
    variant: str, records: list[Any], interval: float, timings: dict[str, Any] | None = None
) -> dict[int, datetime]:
    """Enqueue a job per record, each in its own transaction, ``interval`` apart on a fixed
    schedule (a late one is not caught up). Returns baseline-fast's start per customer pk (the
    database's clock before ``async_task``); the fenced variants' start is in their rows."""
    from django.db import connection, transaction
    from django_q.tasks import async_task

    import tombstones
    from bench.benchapp.tasks import touch
    from bench.run import FAST, HANDLER

    starts: dict[int, datetime] = {}
    took: list[float] = []
    late = 0
    due = time.monotonic()
    for record in records:
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        else:
            late += now - due > 0.005
        t = time.perf_counter()
        with transaction.atomic():
            if variant == "fenced":
                tombstones.enqueue(HANDLER, record)
            elif variant == "tasks":
                touch.enqueue(record)
            else:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT clock_timestamp()")
                    starts[record.pk] = cursor.fetchone()[0]
                async_task(FAST, record.pk, save=False)
        took.append(time.perf_counter() - t)
        due = max(due + interval, time.monotonic())
    if timings is not None:
        timings["enqueue_ms_p50"] = round(1000 * statistics.median(took), 2)
        timings["enqueue_ms_max"] = round(1000 * max(took), 2)
        timings["late_enqueues"] = late
    return starts


def wait_done(
    variant: str, records: list[Any], starts: dict[int, datetime], deadline: float, cluster: Any
) -> bool:
    from project.customers.models import Customer
    from tombstones.models import Job

    pks = [r.pk for r in records]
    while True:
        if variant == "baseline-fast":
            count = Customer.all_objects.filter(pk__in=pks, synced_at__isnull=False).count()
        else:
            ids = [str(pk) for pk in pks]
            count = Job.objects.filter(object_id__in=ids, status__in=Job.TERMINAL).count()
        if count >= len(pks):
            return True
        if cluster.process is not None and cluster.process.poll() is not None:
            return False
        if time.time() >= deadline:
            return False
        time.sleep(0.1)


def collect(variant: str, records: list[Any], starts: dict[int, datetime]) -> dict[str, Any]:
    from project.customers.models import Customer
    from tombstones.models import Job

    pks = [r.pk for r in records]
    synced = dict(Customer.all_objects.filter(pk__in=pks).values_list("pk", "synced_at"))
    latency: list[float] = []
    to_start: list[float] = []
    to_worker: list[float] = []
    write: list[float] = []
    outcomes: dict[str, int] = {}
    if variant == "baseline-fast":
        for pk in pks:
            if synced.get(pk) is not None and pk in starts:
                latency.append((synced[pk] - starts[pk]).total_seconds())
                write.append(latency[-1])
        outcomes["succeeded"] = len(latency)
    else:
        from django_q.models import Task

        # The wake-up a job's enqueue sent (its argument is the job's id), as django-q2 stored
        # it: when a worker began to run it (the worker's clock).
        woken = {
            args[0]: began
            for args, began in Task.objects.filter(func="tombstones.worker.run").values_list(
                "args", "started"
            )
            if args
        }
        rows = Job.objects.filter(object_id__in=[str(pk) for pk in pks]).values_list(
            "id", "object_id", "created_at", "started_at", "finished_at", "status"
        )
        for job_id, object_id, created, started_at, finished, status in rows:
            outcomes[status] = outcomes.get(status, 0) + 1
            if job_id in woken:
                to_worker.append((woken[job_id] - created).total_seconds())
            if finished is not None:
                latency.append((finished - created).total_seconds())
            if started_at is not None:
                to_start.append((started_at - created).total_seconds())
            end = synced.get(int(object_id))
            if end is not None:
                write.append((end - created).total_seconds())
    out: dict[str, Any] = {"finished": len(latency), "outcomes": outcomes}
    out.update(figures("latency", latency))
    out.update(figures("to_worker", to_worker))
    out["woken_jobs"] = len(to_worker)
    out.update(figures("to_start", to_start))
    out.update(figures("write", write))
    out["latency_ms"] = [round(1000 * v, 2) for v in latency]
    return out


def figures(name: str, values: list[float]) -> dict[str, Any]:
    from bench.run import pct

    if not values:
        return {f"{name}_{k}_ms": None for k in ("p50", "p90", "p99", "max")}
    return {
        f"{name}_p50_ms": ms(pct(values, 0.5)),
        f"{name}_p90_ms": ms(pct(values, 0.9)),
        f"{name}_p99_ms": ms(pct(values, 0.99)),
        f"{name}_max_ms": ms(max(values)),
    }


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def sql_figures(
    diffs: dict[int, dict[str, Any]], enq_before: dict[str, Any], enq_after: dict[str, Any], n: int
) -> dict[str, Any]:
    """Statements per measured job: the cluster's (all processes; workers apart) and this
    process's (the enqueue side), transaction control left out."""
    from collections import Counter

    from bench.sqlcount import is_tx_control

    per = max(n, 1)
    total = worker = 0
    shapes: Counter[tuple[str, str]] = Counter()
    for d in diffs.values():
        for sql, count in d["statements"].items():
            if is_tx_control(sql):
                continue
            total += count
            worker += count if d.get("role") == "worker" else 0
            shapes[(d.get("role") or "other", sql[:200])] += count
    enq = Counter(enq_after["statements"])
    enq.subtract(enq_before["statements"])
    return {
        "sql_per_job_cluster": round(total / per, 2),
        "sql_per_job_worker": round(worker / per, 2),
        "connects_per_job_cluster": round(sum(d["connects"] for d in diffs.values()) / per, 2),
        "sql_per_job_enqueue": round(
            sum(c for sql, c in enq.items() if not is_tx_control(sql)) / per, 2
        ),
        "sql_breakdown": [
            {"role": role, "per_job": round(c / per, 3), "sql": sql}
            for (role, sql), c in shapes.most_common()
            if c / per >= 0.01
        ],
    }


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """fenced (and tasks) over baseline-fast, per worker count: p50 and p99."""
    out = []
    by = {(r["workers"], r["variant"]): r for r in runs}
    for (workers, variant), run in sorted(by.items()):
        base = by.get((workers, "baseline-fast"))
        if variant == "baseline-fast" or base is None:
            continue
        row = {"workers": workers, "variant": variant}
        for q in ("p50", "p99"):
            a, b = run[f"latency_{q}_ms"], base[f"latency_{q}_ms"]
            row[q] = round(a / b, 2) if a and b else None
        row["p50_target_met"] = bool(row["p50"] is not None and row["p50"] <= 1.0)
        row["p99_target_met"] = bool(
            run["latency_p99_ms"] is not None and run["latency_p99_ms"] <= TARGET_P99_MS
        )
        out.append(row)
    return out


def one_line(run: dict[str, Any]) -> str:
    return (
        f"  w={run['workers']} {run['variant']:<13} p50 {run['latency_p50_ms']} ms "
        f"p90 {run['latency_p90_ms']} p99 {run['latency_p99_ms']} max {run['latency_max_ms']} "
        f"sql/job {run['sql_per_job_cluster']} load {run['loadavg_before']}"
        f"{'' if run['complete'] else ' INCOMPLETE'} {run['outcomes']}"
    )


def render(results: dict[str, Any]) -> str:
    lines = [
        "| workers | variant | p50 ms | p90 ms | p99 ms | max ms | to worker p50/p99 ms "
        "| to start p50/p99 ms "
        "| write p50/p99 ms | enqueue ms p50 | SQL/job worker | SQL/job cluster "
        "| SQL/job enqueue | load |",
        "|---:|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in results["runs"]:
        flag = "" if r["complete"] else " (incomplete)"
        lines.append(
            f"| {r['workers']} | {r['variant']}{flag} | {fmt(r['latency_p50_ms'])} "
            f"| {fmt(r['latency_p90_ms'])} | {fmt(r['latency_p99_ms'])} "
            f"| {fmt(r['latency_max_ms'])} | {fmt(r['to_worker_p50_ms'])} / "
            f"{fmt(r['to_worker_p99_ms'])} | {fmt(r['to_start_p50_ms'])} / "
            f"{fmt(r['to_start_p99_ms'])} | {fmt(r['write_p50_ms'])} / {fmt(r['write_p99_ms'])} "
            f"| {fmt(r.get('enqueue_ms_p50'))} | {r['sql_per_job_worker']:.2f} "
            f"| {r['sql_per_job_cluster']:.2f} | {r['sql_per_job_enqueue']:.2f} "
            f"| {r['loadavg_before']}-{r['loadavg_after']} |"
        )
    if results.get("ratios"):
        lines += ["", "Against baseline-fast (targets: p50 ratio <= 1.00, p99 <= 15 ms):"]
        for row in results["ratios"]:
            met50 = "met" if row["p50_target_met"] else "MISSED"
            met99 = "met" if row["p99_target_met"] else "MISSED"
            lines.append(
                f"- {row['workers']} worker(s), {row['variant']}: p50 x{fmt(row['p50'])} "
                f"({met50}), p99 x{fmt(row['p99'])} (p99 <= 15 ms {met99})"
            )
    return "\n".join(lines)


def fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
