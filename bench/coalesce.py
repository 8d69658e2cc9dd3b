"""Coalescing per record (issue 39): a stream of edits against a debounced, coalescing handler.

    .venv/bin/python bench/coalesce.py --json bench/results/issue39/coalesce-postgres.json
    .venv/bin/python bench/coalesce.py --db sqlite --records 200 --rate 500 --producers 1 \\
        --workers 2 --json bench/results/issue39/coalesce-sqlite.json

The issue's scenario: edits to ``--records`` records at ``--rate`` edits/s for ``--seconds``,
each edit enqueueing ``bench.coalesce_sync`` (bench/benchapp/handlers.py: ``coalesce=True``,
``debounce`` = ``--debounce``, ``max_delay`` = ``--max-delay``, one fenced ``ctx.update``) for
its record. With bench/run.py's helpers (``setup_django``, ``seed``, bench/latency.py's
``reset``) and its cluster (a real ``manage.py qcluster``, settings ``bench.settings``):

1. reset the tables, create the records (a scratch database of its own: ``bench_coalesce`` on
   PostgreSQL with the Redis broker, or a SQLite file with the ORM broker);
2. start the cluster with ``--workers`` workers;
3. fork ``--producers`` processes, each owning the records whose index is its number modulo
   ``--producers`` (no two producers edit one record). Each loops: a transaction of ``--batch``
   edits of distinct records, picked at random among its own, each read ``select_for_update``,
   its ``name`` changed by a fenced ``save()`` and ``tombstones.enqueue("bench.coalesce_sync",
   record)``; paced toward its share of ``--rate`` (a fixed schedule, at most 1 s of lag caught
   up), until ``--seconds`` have passed. A deadlock or a locked database retries the batch;
4. wait (at most ``--timeout`` s after the last edit) until no job of the handler is unfinished;
5. read the rows: jobs by status, the suppression ratio (superseded / enqueued), and for each job
   that ran, ``started_at - created_at`` (its enqueue, the record's last edit, to its run) and
   ``started_at - window_started_at`` (its window's first edit to its run), both the database's
   clock, against ``--debounce`` and ``--max-delay``; and, per record, that the last job
   enqueued succeeded, carries the producers' last edit (its version snapshot is the version
   their last save made) and made the record's last write (the record's version is the job's
   ``found_version``): no edit lost.

The achieved edit rate is what the producers did, whatever ``--rate`` asked: the machine's
cores run the producers, the cluster and the database together.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HANDLER = "bench.coalesce_sync"
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_coalesce"
DEFAULT_SQLITE = "/tmp/tombstones-bench/coalesce.sqlite3"
SETTINGS = ("db", "records", "rate", "seconds", "debounce", "max_delay", "workers", "producers")
SETTINGS += ("batch", "timeout", "seed", "conn_max_age")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from bench.run import DEFAULT_REDIS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--rate", type=float, default=5000.0, help="target edits/s (all producers)")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the edit stream")
    p.add_argument("--debounce", type=float, default=1.0, help="the handler's debounce (s)")
    p.add_argument("--max-delay", type=float, default=5.0, help="the handler's max_delay (s)")
    p.add_argument("--workers", type=int, default=4, help="Q_WORKERS of the cluster")
    p.add_argument("--producers", type=int, default=2, help="processes making edits")
    p.add_argument("--batch", type=int, default=5, help="edits per transaction")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to drain, after the last")
    p.add_argument("--seed", type=int, default=39)
    p.add_argument("--conn-max-age", type=int, default=None, help="CONN_MAX_AGE for all sides")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_COALESCE_PG_URL", DEFAULT_PG))
    p.add_argument("--sqlite-path", default=DEFAULT_SQLITE)
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--keep-logs", action="store_true", help="keep the qcluster log")
    args = p.parse_args(argv)
    if args.max_delay < args.debounce:
        raise SystemExit("--max-delay must be at least --debounce")
    args.batch = max(1, min(args.batch, args.records // max(1, args.producers)))
    return args


def main(argv: list[str] | None = None) -> int:
    from bench import run as harness

    args = parse_args(argv)
    harness.interrupt_on_signals()
    # The handler's window, for this process (its enqueues plan the due times) and the cluster.
    os.environ["BENCH_COALESCE_DEBOUNCE"] = str(args.debounce)
    os.environ["BENCH_COALESCE_MAX_DELAY"] = str(args.max_delay)
    harness.setup_django(args, args.db, harness.BROKER_FOR[args.db])
    results: dict[str, Any] = {
        **harness.run_header("bench/coalesce.py", argv),
        "settings": {k: getattr(args, k) for k in SETTINGS},
    }
    results["settings"]["broker"] = harness.BROKER_FOR[args.db]
    results.update(run_once(args))
    print()
    print(render(results))
    if args.json:
        harness.write_json(args.json, results)
        print(f"\nJSON: {args.json}")
    return 0 if results["complete"] and results["no_edit_lost"] else 1


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connections

    from bench import run as harness
    from bench.latency import others_running, reset
    from project.stress.cluster import Cluster

    reset()
    pks = [r.pk for r in harness.seed("many", args.records, 1)]
    logdir = tempfile.mkdtemp(prefix="tombstones-coalesce-")
    env = {"TOMBSTONES_LOG_LEVEL": os.environ.get("TOMBSTONES_LOG_LEVEL", "INFO")}
    log_path = str(Path(logdir) / "qcluster.log")
    cluster = Cluster(args.workers, settings_module="bench.settings", env=env, log_path=log_path)
    cluster.start(ready_timeout=90)
    out: dict[str, Any] = {
        "loadavg_before": round(os.getloadavg()[0], 2),
        "others_running_before": others_running(),
    }
    try:
        with cluster.messages():
            connections.close_all()  # never share a connection with the forked producers
            out["producers"] = produce(args, pks)
            t_last = max(p["t_last"] for p in out["producers"])
            out["complete"] = wait_drained(t_last + args.max_delay + args.timeout, cluster)
            out["drained_s"] = round(time.time() - t_last, 2)
    finally:
        cluster.stop()
    out["loadavg_after"] = round(os.getloadavg()[0], 2)
    out.update(collect(args, pks, out["producers"]))
    for p in out["producers"]:
        del p["last_version"]  # read by collect(): 1 entry per record, not for the JSON
    if not out["complete"]:
        out["log_tail"] = cluster.log_tail(20)
    if args.keep_logs or not out["complete"]:
        out["log_path"] = log_path
    else:
        shutil.rmtree(logdir, ignore_errors=True)
    return out


def produce(args: argparse.Namespace, pks: list[int]) -> list[dict[str, Any]]:
    """Run the producers (forked: this process's settings and message namespace) to the end."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    start = time.time() + 0.5  # every producer starts its schedule at the same moment
    procs = [
        ctx.Process(target=producer, args=(args, pks[n :: args.producers], n, start, results))
        for n in range(args.producers)
    ]
    try:
        for proc in procs:
            proc.start()
        done = [results.get(timeout=args.seconds + 300) for _ in procs]
    finally:
        for proc in (p for p in procs if p.pid is not None):
            proc.join(30)
            if proc.is_alive():  # a producer that failed to report: ended, never left behind
                proc.terminate()
    return sorted(done, key=lambda p: p["producer"])


def producer(
    args: argparse.Namespace, mine: list[int], number: int, start: float, results: Any
) -> None:
    """One producer's stream: batches of edits + enqueues, paced; its tally into ``results``."""
    from collections import Counter

    from django.db import OperationalError, connections, transaction

    import tombstones
    from bench import sqlcount
    from project.customers.models import Customer

    rng = random.Random(args.seed * 1000 + number)
    interval = args.batch / (args.rate / args.producers)
    last_version: dict[int, int] = {}
    edits = transactions = retries = 0
    took: list[float] = []
    while time.time() < start:
        time.sleep(0.01)
    counted = sqlcount.snapshot()["statements"]
    due, end = time.monotonic(), time.monotonic() + args.seconds
    t_first = time.time()
    while time.monotonic() < end:
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        batch = sorted(rng.sample(mine, args.batch))  # in pk order: locks taken in one order
        t = time.perf_counter()
        while True:
            try:
                with transaction.atomic():
                    records = Customer.objects.select_for_update().filter(pk__in=batch)
                    saved = []
                    for record in records.order_by("pk"):
                        record.name = f"Edit {number}-{edits}"
                        record.save()
                        tombstones.enqueue(HANDLER, record)
                        saved.append((record.pk, record.version))
                break
            except OperationalError:  # a deadlock (PostgreSQL) or a locked database (SQLite)
                retries += 1
                if retries > 1000:  # the database went away: give up
                    raise
                time.sleep(0.01)
        took.append(time.perf_counter() - t)
        last_version.update(saved)
        edits += len(saved)
        transactions += 1
        due = max(due + interval, time.monotonic() - 1.0)
    t_last = time.time()
    connections.close_all()
    sent = Counter(sqlcount.snapshot()["statements"])
    sent.subtract(counted)
    statements = sum(c for sql, c in sent.items() if not sqlcount.is_tx_control(sql))
    results.put(
        {
            "producer": number,
            "records": len(mine),
            "edits": edits,
            "transactions": transactions,
            "retries": retries,
            "seconds": round(t_last - t_first, 3),
            "t_first": t_first,
            "t_last": t_last,
            "tx_ms_p50": round(1000 * sorted(took)[len(took) // 2], 2) if took else None,
            "statements": statements,  # transaction control left out (bench/sqlcount.py)
            "last_version": last_version,
        }
    )


def wait_drained(deadline: float, cluster: Any) -> bool:
    """Until no job of the handler is unfinished (looks at least once)."""
    from tombstones.models import Job

    while True:
        if not Job.objects.filter(handler=HANDLER, status__in=Job.UNFINISHED).exists():
            return True
        if cluster.process is not None and cluster.process.poll() is not None:
            return False
        if time.time() >= deadline:
            return False
        time.sleep(0.25)


def collect(args: argparse.Namespace, pks: list[int], producers: list[dict[str, Any]]) -> dict:
    from collections import Counter
    from datetime import timedelta

    from django.db.models import F

    from project.customers.models import Customer
    from tombstones.models import Job

    jobs = Job.objects.filter(handler=HANDLER)
    outcomes = Counter(
        f"{status}/{reason}" if reason else status
        for status, reason in jobs.values_list("status", "reason")
    )
    enqueued = sum(outcomes.values())
    superseded = outcomes.get(f"{Job.Status.SUPERSEDED}/{Job.Reason.COALESCED}", 0)
    succeeded = outcomes.get(Job.Status.SUCCEEDED, 0)
    edits = sum(p["edits"] for p in producers)
    span = max(p["t_last"] for p in producers) - min(p["t_first"] for p in producers)
    to_run: list[float] = []
    window: list[float] = []
    claim: list[float] = []
    planned: list[float] = []
    late_plans = 0
    ran = jobs.filter(started_at__isnull=False).values_list(
        "created_at", "started_at", "window_started_at", "run_after"
    )
    for created, started, opened, due in ran:
        to_run.append((started - created).total_seconds())
        claim.append((started - due).total_seconds())
        if opened is not None:
            window.append((started - opened).total_seconds())
            planned.append((due - opened).total_seconds())
            # Due past the cap: only a job enqueued after it (then due at its enqueue).
            cap = opened + timedelta(seconds=args.max_delay)
            late_plans += due > cap and due > created
    out: dict[str, Any] = {
        "edits": edits,
        "enqueued": enqueued,
        "edit_rate": round(edits / span, 1) if span > 0 else None,
        "edit_seconds": round(span, 2),
        "retried_batches": sum(p["retries"] for p in producers),
        "sql_per_edit": round(sum(p["statements"] for p in producers) / max(edits, 1), 2),
        "tx_ms_p50": [p["tx_ms_p50"] for p in producers],
        "outcomes": dict(sorted(outcomes.items())),
        "succeeded": succeeded,
        "superseded": superseded,
        "other_outcomes": enqueued - succeeded - superseded,
        "suppression_ratio": round(superseded / enqueued, 4) if enqueued else None,
        "jobs_per_record": round(succeeded / len(pks), 2) if pks else None,
        "rereads": sum(jobs.values_list("rereads", flat=True)),
        # Run more than once (a retry after its re-reads ran out: due again after a backoff).
        "retried_jobs": jobs.filter(attempts__gt=1).count(),
        "to_run": quantiles(to_run),
        "window_to_run": quantiles(window),
        "over_max_delay": sum(v > args.max_delay for v in window),
        # The plan against the machine: when each job was due (run_after) after its window
        # opened (never past max_delay), and how long after it was due a worker took it.
        "due_after_window": quantiles(planned),
        "due_over_max_delay": late_plans,
        "due_to_run": quantiles(claim),
        # Superseded once due, before a worker took it: its replacement (due at once, the same
        # window) runs instead, one claim's lag later.
        "superseded_while_due": jobs.filter(
            status=Job.Status.SUPERSEDED, run_after__lt=F("finished_at")
        ).count(),
    }
    # No edit lost: per record, the last job enqueued ran, with the last edit, and wrote last.
    last_version: dict[int, int] = {}
    for p in producers:
        last_version.update({int(k): v for k, v in p["last_version"].items()})
    newest: dict[int, tuple[int, str, int, int | None]] = {}
    for pk, job_id, status, version, found in jobs.values_list(
        "object_id", "id", "status", "version", "found_version"
    ):
        if int(pk) not in newest or job_id > newest[int(pk)][0]:
            newest[int(pk)] = (job_id, status, version, found)
    final = dict(Customer.all_objects.filter(pk__in=pks).values_list("pk", "version"))
    lost = []
    for pk, version in last_version.items():
        job_id, status, snapshot, found = newest.get(pk, (0, "missing", 0, None))
        if status != Job.Status.SUCCEEDED or snapshot != version or final[pk] != found:
            lost.append({"pk": pk, "job": job_id, "status": status, "edited": version,
                         "snapshot": snapshot, "found": found, "final": final[pk]})  # fmt: skip
    out["records_edited"] = len(last_version)
    out["records_lost"] = len(lost)
    out["lost_examples"] = lost[:10]
    out["no_edit_lost"] = not lost
    return out


def quantiles(values: list[float]) -> dict[str, Any]:
    from bench.run import pct

    found = {f"p{int(q * 100)}": pct(values, q) for q in (0.5, 0.9, 0.99)}
    found["max"] = max(values) if values else None
    found = {k: None if v is None else round(v, 3) for k, v in found.items()}
    found["n"] = len(values)
    return found


def render(r: dict[str, Any]) -> str:
    s = r["settings"]
    window, cap = s["debounce"], s["max_delay"]
    lines = [
        f"{s['db']} + {s['broker']} broker, {s['workers']} workers, {s['producers']} producers "
        f"x {s['batch']} edits/transaction, {s['records']} records, target {s['rate']:.0f} "
        f"edits/s for {s['seconds']:.0f} s, debounce {window} s, max_delay {cap} s; "
        f"load {r['loadavg_before']}-{r['loadavg_after']}",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| edits (= enqueues) | {r['edits']:,} ({r['enqueued']:,} job rows) |",
        f"| achieved edit rate | {r['edit_rate']:,.0f} edits/s over {r['edit_seconds']} s |",
        f"| per edit: statements (edit + enqueue) | {r['sql_per_edit']} |",
        f"| per transaction: ms, median per producer | {r['tx_ms_p50']} |",
        f"| jobs run (succeeded) | {r['succeeded']:,} ({r['jobs_per_record']} per record) |",
        f"| superseded / coalesced | {r['superseded']:,} |",
        f"| other outcomes | {r['other_outcomes']} {'' if r['other_outcomes'] else '(none)'} |",
        f"| suppression ratio (superseded / enqueued) | {fmt(r['suppression_ratio'], 4)} |",
        f"| rereads (a newer edit during the run); jobs run again | {r['rereads']}; "
        f"{r['retried_jobs']} |",
        f"| superseded while due (not claimed before the next edit) | "
        f"{r['superseded_while_due']:,} |",
        f"| drained | {'yes' if r['complete'] else 'NO'}, {r['drained_s']} s after the last edit |",
        f"| no edit lost (last job ran the last edit) | {'yes' if r['no_edit_lost'] else 'NO'} "
        f"({r['records_edited']} records, {r['records_lost']} lost) |",
        "",
        "| latency (s) | p50 | p90 | p99 | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, key, ref, name in (
        ("last edit to run (started - created)", "to_run", window, "window"),
        ("window's first edit to run (started - window_started)", "window_to_run", cap, "max"),
        ("window's first edit to due (run_after - window_started)", "due_after_window", 0, ""),
        ("due to run: the claim's lag (started - run_after)", "due_to_run", 0, ""),
    ):
        q = r[key]
        lines.append(f"| {label} | " + " | ".join(fmt(q[k], 2) for k in QS) + " |")
        if name:
            lines.append(
                f"| ... against the {name} ({ref} s) | "
                + " | ".join(versus(q[k], ref, name) for k in QS)
                + " |"
            )
    lines.append(
        f"\nJobs run later than max_delay after their window opened: {r['over_max_delay']}; "
        f"due later than max_delay (and than their enqueue): {r['due_over_max_delay']}"
    )
    return "\n".join(lines)


QS = ("p50", "p90", "p99", "max")


def versus(value: float | None, ref: float, name: str) -> str:
    if value is None:
        return "-"
    return f"{name} {'+' if value >= ref else '-'} {abs(value - ref):.2f}"


def fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
