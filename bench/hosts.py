"""Several hosts (issue 21): three ``qcluster`` processes with one cluster name next to one.

    .venv/bin/python bench/hosts.py                    # ~3 minutes on 2 cores
    .venv/bin/python bench/hosts.py --jobs 4000 --reps 2 --json bench/results/hosts.json

Each cluster is a ``qcluster`` of its own (own process group, own environment, ``STRESS_HOST``
naming its workers' host), against one PostgreSQL database and one Redis, all with the same
cluster name. In one run, on the same database and broker:

- **race**: the race harness (``racestress``'s feeder, delivery jobs, closed loop) through one
  host, then through three: host-a, host-b (SIGKILLed once a third of the changes ended, while it
  holds leases) and host-c (started once a sixth ended). Anomalies, jobs run twice, jobs lost,
  and changes/s (bound by the feeder's closed loop and the handlers' delays, not the workers);
- **drain**: a backlog of ``--jobs`` fenced ordered ``bench.touch`` jobs (bursty mix) enqueued
  with every cluster paused (SIGSTOP), the clock started at SIGCONT and stopped at the last
  ``finished_at``: one cluster of ``--workers``, three clusters of ``--workers`` each, and one
  cluster with as many workers as the three together (more hosts, or only more workers?).

Scratch database ``--pg-url`` (default ``.../bench_hosts``, created when missing; a test
database is refused), Redis ``--redis-url``; every run uses a queue name of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_hosts"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    parser.add_argument("--workers", type=int, default=2, help="worker processes per cluster")
    parser.add_argument("--jobs", type=int, default=3000, help="jobs of each drain")
    parser.add_argument("--burst", type=int, default=20, help="jobs per customer (bursty)")
    parser.add_argument("--messages", type=int, default=600, help="changes of each race run")
    parser.add_argument("--entities", type=int, default=40)
    parser.add_argument("--lease", type=float, default=5.0, help="TOMBSTONES_LEASE, seconds")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--scenarios", default="race,drain")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", help="write every run here")
    return parser.parse_args(argv)


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
    Schedule.objects.all().delete()  # no sweep: the hosts' own timers take leases back


def cluster_env(args: argparse.Namespace) -> dict[str, str]:
    return {"BENCH_LEASE": str(args.lease), "TOMBSTONES_LOG_LEVEL": "WARNING"}


def race(args: argparse.Namespace, hosts: int) -> dict[str, Any]:
    from project.stress import harness
    from project.stress.hosts import Host, run_on_hosts

    n = args.messages
    plan = harness.Plan(entities=args.entities, messages=n, seed=21)
    if hosts == 1:
        layout = [Host("host-a", args.workers)]
    else:
        layout = [
            Host("host-a", args.workers),
            Host("host-b", args.workers, kill_at=n // 3),
            Host("host-c", args.workers, start_at=n // 6),
        ]
    load = os.getloadavg()[0]
    run = run_on_hosts(
        plan, layout, settings_module="bench.settings", env=cluster_env(args), timeout=args.timeout
    )
    report = run.report
    return {
        "scenario": "race",
        "clusters": hosts,
        "workers": report.workers,
        "jobs": n,
        "seconds": report.seconds,
        "per_s": report.messages_per_s,
        "anomalies": report.anomalies,
        "run_twice": report.breakdown["duplicated_jobs"],
        "lost": report.breakdown["lost_jobs"],
        "completed": report.completed,
        "by_host": run.delivered,
        "held_at_kill": run.held_at_kill,
        "rescued_by": {str(k): v for k, v in run.rescued_by.items()},
        "ended_after": {str(k): v for k, v in run.ended_after.items()},
        "timeline": run.timeline,
        "outcomes": report.outcomes,
        "loadavg": round(load, 2),
    }


def drain(args: argparse.Namespace, clusters: int, workers: int) -> dict[str, Any]:
    """A backlog drained by ``clusters`` clusters of ``workers`` workers, one cluster name."""
    from django.db import transaction
    from django.db.models import Max

    import tombstones
    from bench.run import HANDLER, reset_tables, seed
    from project.stress.apps import HOST_ENV
    from project.stress.cluster import Cluster, queue_namespace
    from project.stress.hosts import host_of
    from tombstones.models import Job, JobEvent

    reset_tables()
    plan = seed("bursty", args.jobs, args.burst)
    name = f"hosts-{uuid.uuid4().hex[:8]}"
    running = [
        Cluster(
            workers,
            name=name,
            settings_module="bench.settings",
            env={**cluster_env(args), HOST_ENV: f"host-{chr(97 + i)}"},
        )
        for i in range(clusters)
    ]
    load = os.getloadavg()[0]
    complete = False
    try:
        for cluster in running:
            cluster.start(ready_timeout=90)
        with queue_namespace(name):
            for cluster in running:
                assert cluster.process is not None
                os.killpg(cluster.process.pid, signal.SIGSTOP)
            try:
                for record in plan:
                    with transaction.atomic():  # one request, one enqueue
                        tombstones.enqueue(HANDLER, record)
            finally:
                t0 = time.time()
                for cluster in running:
                    assert cluster.process is not None
                    os.killpg(cluster.process.pid, signal.SIGCONT)
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline:
                if not Job.objects.filter(status__in=Job.UNFINISHED).exists():
                    complete = True
                    break
                time.sleep(0.2)
    finally:
        for cluster in running:
            cluster.stop()
        _drop(name)
    last = Job.objects.aggregate(last=Max("finished_at"))["last"]
    seconds = max(last.timestamp() - t0, 1e-6) if last else float("nan")
    done = Job.objects.filter(status__in=Job.TERMINAL).count()
    workers_seen = JobEvent.objects.filter(event="succeeded").values_list("worker", flat=True)
    return {
        "scenario": "drain",
        "clusters": clusters,
        "workers": clusters * workers,
        "jobs": len(plan),
        "seconds": round(seconds, 2),
        "per_s": round(done / seconds, 1),
        "completed": complete,
        "not_succeeded": Job.objects.exclude(status=Job.Status.SUCCEEDED).count(),
        "by_host": dict(Counter(host_of(w) for w in workers_seen)),
        "loadavg": round(load, 2),
    }


def _drop(name: str) -> None:
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    key = f"django_q:{name}:q"
    client.delete(key, f"{key}:tombstones:gate", f"{key}:tombstones:helper")
    client.close()


def render(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | clusters | workers in all | jobs | jobs/s (each rep) | median | anomalies "
        "| run twice | lost | jobs per host |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    keys: list[tuple[str, int, int]] = []
    for run in runs:
        key = (run["scenario"], run["clusters"], run["workers"])
        if key not in keys:
            keys.append(key)
    for scenario, clusters, workers in keys:
        same = [
            r
            for r in runs
            if (r["scenario"], r["clusters"], r["workers"]) == (scenario, clusters, workers)
        ]
        rates = [r["per_s"] for r in same]
        hosts = Counter[str]()
        for r in same:
            hosts.update(r["by_host"])
        share = ", ".join(f"{h} {n // len(same)}" for h, n in sorted(hosts.items()))
        lines.append(
            f"| {scenario} | {clusters} | {workers} | {same[0]['jobs']} | "
            f"{', '.join(f'{x:g}' for x in rates)} | {statistics.median(rates):g} | "
            f"{sum(r.get('anomalies', 0) for r in same)} | "
            f"{sum(r.get('run_twice', 0) for r in same)} | {sum(r.get('lost', 0) for r in same)} "
            f"| {share} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup(args)
    scenarios = args.scenarios.split(",")
    runs: list[dict[str, Any]] = []
    started = time.time()
    for rep in range(args.reps):
        # Alternated within each repetition: the machine's drift hits every layout alike.
        order = [(1,), (3,)] if rep % 2 == 0 else [(3,), (1,)]
        if "race" in scenarios:
            for (hosts,) in order:
                runs.append(race(args, hosts))
                print(json.dumps(runs[-1]), flush=True)
        if "drain" in scenarios:
            layouts = [(1, args.workers), (3, args.workers), (1, 3 * args.workers)]
            for clusters, workers in layouts if rep % 2 == 0 else layouts[::-1]:
                runs.append(drain(args, clusters, workers))
                print(json.dumps(runs[-1]), flush=True)
    print()
    print(render(runs))
    print(f"\n{time.time() - started:.0f} s; load average now {os.getloadavg()}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
