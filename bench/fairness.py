"""Does a hot record starve the others? One record's backlog, and other records' jobs meanwhile.

    .venv/bin/python bench/fairness.py                       # PostgreSQL + Redis, 1 and 4 workers
    .venv/bin/python bench/fairness.py --db sqlite --workers 1 --hot 2000

Per worker count: reset the scratch tables, start a real ``manage.py qcluster``, pause it
(SIGSTOP) while ``--hot`` jobs for one record are enqueued, resume it, then enqueue one job for
another record every ``--every`` seconds (``--probes`` of them) while the hot lane drains. Each
probe's delay is its finish minus its due time (both the database's clock, from the ledger).
Printed: the probes' delays (median, p95, max) and how many hot jobs finished meanwhile, so the
hot lane is seen to keep running. The goal (issue 23): no probe later than 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402 - after the path set-up
    DEFAULT_PG,
    DEFAULT_REDIS,
    DEFAULT_SQLITE,
    HANDLER,
    csv,
    pct,
    reset_tables,
    setup_django,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", default="postgres", choices=("postgres", "sqlite"))
    p.add_argument("--workers", default="1,4", help="Q_WORKERS values (comma list)")
    p.add_argument("--hot", type=int, default=10_000, help="jobs queued for the hot record")
    p.add_argument("--probes", type=int, default=40, help="jobs for other records meanwhile")
    p.add_argument("--every", type=float, default=0.25, help="seconds between two probes")
    p.add_argument("--conn-max-age", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    p.add_argument("--sqlite-path", default=os.environ.get("BENCH_SQLITE", DEFAULT_SQLITE))
    p.add_argument("--json", default="", help="write the results here")
    return p.parse_args(argv)


def enqueue_hot(record: Any, n: int) -> None:
    """The hot backlog, through the public API, a few hundred per transaction (a save storm)."""
    from django.db import transaction

    import tombstones

    for start in range(0, n, 500):
        with transaction.atomic():
            for _ in range(min(500, n - start)):
                tombstones.enqueue(HANDLER, record)


def one_run(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    import tombstones
    from project.customers.models import Customer
    from project.stress.cluster import Cluster
    from tombstones.models import Job

    reset_tables()
    hot = Customer.objects.create(reference="HOT", name="Bench", email="bench@example.invalid")
    others = [
        Customer.objects.create(reference=f"P{i:05d}", name="Bench", email="bench@example.invalid")
        for i in range(args.probes)
    ]
    cluster = Cluster(workers, settings_module="bench.settings", env={})
    cluster.start(ready_timeout=90)
    assert cluster.process is not None
    try:
        with cluster.messages():
            os.killpg(cluster.process.pid, signal.SIGSTOP)
            try:
                enqueue_hot(hot, args.hot)
            finally:
                os.killpg(cluster.process.pid, signal.SIGCONT)
            probes = []
            for record in others:
                probes.append(tombstones.enqueue(HANDLER, record).pk)
                time.sleep(args.every)
            deadline = time.time() + 60
            while time.time() < deadline:
                if Job.objects.filter(pk__in=probes, finished_at__isnull=False).count() == len(
                    probes
                ):
                    break
                time.sleep(0.1)
            hot_done = Job.objects.filter(object_id=str(hot.pk), status__in=Job.TERMINAL).count()
    finally:
        cluster.stop()
    rows = Job.objects.filter(pk__in=probes).values_list("run_after", "finished_at", "status")
    delays = [(end - due).total_seconds() for due, end, _ in rows if end is not None]
    return {
        "db": args.db,
        "workers": workers,
        "hot_jobs": args.hot,
        "probes": len(probes),
        "finished": len(delays),
        "statuses": sorted({status for _, _, status in rows}),
        "hot_finished_meanwhile": hot_done,
        "delay_s_median": round(pct(delays, 0.5) or 0.0, 3),
        "delay_s_p95": round(pct(delays, 0.95) or 0.0, 3),
        "delay_s_max": round(max(delays, default=float("nan")), 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_django(args, args.db, "redis" if args.db == "postgres" else "orm")
    runs = []
    for workers in [int(w) for w in csv(args.workers)]:
        run = one_run(args, workers)
        runs.append(run)
        print(
            f"{run['db']} w={workers}: {run['finished']}/{run['probes']} probe jobs of other "
            f"records finished while {args.hot} jobs of one record drained "
            f"({run['hot_finished_meanwhile']} of them meanwhile); delay from due to finish: "
            f"median {run['delay_s_median']} s, p95 {run['delay_s_p95']} s, "
            f"max {run['delay_s_max']} s",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
    return 0 if all(r["finished"] == r["probes"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
