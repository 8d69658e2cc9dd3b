"""The worker's own cost: a backlog drained in this process, without a cluster or a broker.

    .venv/bin/python bench/worker_drain.py --mix bursty --jobs 1000

Resets and seeds the scratch database as ``bench/run.py`` does (``--pg-url``, default the bench
database, created when missing; a test database is refused), enqueues ``--jobs`` jobs of
``bench.touch`` (``many``: one customer each; ``bursty``: ``--burst`` jobs per customer), each in
its own transaction, then runs ``runner.pump()`` until nothing is due, with
the wake-up messages switched off (nothing else would run them). Prints one JSON line: jobs/s,
wall and CPU seconds of the drain. Run it from another checkout (``cd`` there, same virtualenv)
to measure other code in the same session; alternate the two, the machine drifts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))


def main() -> None:
    from bench.run import DEFAULT_PG, HANDLER, ensure_pg_database, reset_tables, seed

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mix", choices=["many", "bursty", "hot"], default="many")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=20, help="jobs per entity (bursty)")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument(
        "--road", choices=["handler", "tasks"], default="handler", help="tasks: the @task variant"
    )
    parser.add_argument("--profile", type=int, default=0, help="print the top N functions")
    parser.add_argument("--sort", default="tottime", help="the profile's order (pstats' keys)")
    args = parser.parse_args()
    ensure_pg_database(args.pg_url)  # refuses a test database
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ["DATABASE_URL"] = args.pg_url

    import django

    django.setup()
    logging.getLogger("tombstones").setLevel(logging.ERROR)  # a line per job would dominate

    from django.core.management import call_command
    from django.db import transaction

    import tombstones
    from tombstones.jobs import wakeups
    from tombstones.jobs.engine import runner
    from tombstones.models import Job

    for name in ("wake_soon", "hand_off", "call_helper", "helper_arrived"):
        setattr(wakeups, name, lambda *a, **k: None)
    wakeups.open_gate = lambda *a, **k: False  # type: ignore[assignment]
    runner.cluster_workers = lambda: 1  # type: ignore[assignment]

    call_command("migrate", verbosity=0, interactive=False)
    reset_tables()
    for record in seed(args.mix, args.jobs, args.burst):
        with transaction.atomic():  # one request, one enqueue
            if args.road == "tasks":
                from bench.benchapp.tasks import touch

                touch.enqueue(record)
            else:
                tombstones.enqueue(HANDLER, record)

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    wall, cpu = time.perf_counter(), time.process_time()
    done = 0
    while ran := runner.pump():
        done += len(ran)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if profiler is not None:
        import pstats

        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats(args.sort).print_stats(args.profile)
    left = Job.objects.exclude(status=Job.Status.SUCCEEDED).count()
    print(
        json.dumps(
            {
                "mix": args.mix,
                "road": args.road,
                "jobs": done,
                "not_succeeded": left,
                "wall_s": round(wall, 3),
                "cpu_ms_per_job": round(cpu * 1000 / max(done, 1), 3),
                "jobs_per_s": round(done / wall, 1),
                "code": str(Path(tombstones.__file__).parent),  # which checkout was measured
            }
        )
    )


if __name__ == "__main__":
    main()
