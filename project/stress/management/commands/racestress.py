"""``manage.py racestress``: reproduce the seed's delete/re-create race against real workers.

Starts a django-q2 cluster (``qcluster``, ``--workers N``) on the configured database and broker,
feeds it bursty changes for ``--entities`` entities, waits for every job to end, and compares the
downstream store with the source of truth. ``--no-ordering`` gives every job its own lane (the
seed's bug) and must show anomalies; the default (one lane per entity) must show none.

It wipes the ``stress`` app's tables and their jobs before each run.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Max
from django.test.utils import override_settings
from tqdm import tqdm

from project.stress import harness
from project.stress.cluster import Cluster, broker_name
from tombstones.conf import tombstone_settings
from tombstones.models import Job


class Command(BaseCommand):
    help = "Race real django-q2 workers on delete / re-create bursts and count anomalies."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workers",
            type=int,
            nargs="+",
            default=[2],
            help="Worker processes of the cluster (several values: one run each). 1: sequential.",
        )
        parser.add_argument("--entities", type=int, default=200)
        parser.add_argument("--messages", type=int, default=1000, help="Changes (jobs) in all.")
        parser.add_argument(
            "--no-ordering",
            action="store_true",
            help="Partition work by job instead of by entity (reproduces the seed's bug).",
        )
        parser.add_argument(
            "--compare",
            action="store_true",
            help="Run sequential (1 worker), then ordered and unordered for each --workers.",
        )
        parser.add_argument(
            "--delay-ms",
            type=float,
            default=harness.Plan.delay_ms,
            help="Each delivery waits a random 0..N ms before its downstream write (race window).",
        )
        parser.add_argument(
            "--recreate-gap-ms",
            type=float,
            default=harness.Plan.recreate_gap_ms,
            help="A re-create follows its delete within 0..N ms.",
        )
        parser.add_argument(
            "--slow-delete-ms",
            type=float,
            default=harness.Plan.slow_delete_ms,
            help="The delete of a delete+recreate burst is delivered in N/4..N ms.",
        )
        parser.add_argument(
            "--in-flight",
            type=int,
            default=0,
            help="Unfinished jobs the feeder allows; it tops them up in bursts (0: workers + 2).",
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--timeout", type=float, default=600.0, help="Seconds to wait for the jobs to end."
        )
        parser.add_argument("--json", dest="json_path", help="Write the results as JSON here.")

    def handle(self, *args: Any, **options: Any) -> None:
        workers: list[int] = options["workers"]
        if any(n < 1 for n in workers):
            raise CommandError("--workers must be at least 1.")
        if options["entities"] < 1 or options["messages"] < 1:
            raise CommandError("--entities and --messages must be at least 1.")
        runs: list[tuple[bool, int]]
        if options["compare"]:
            runs = [(True, 1)] + [(o, n) for n in workers for o in (True, False)]
        else:
            runs = [(not options["no_ordering"], n) for n in workers]
        reports = []
        for ordering, n in runs:
            plan = harness.Plan(
                entities=options["entities"],
                messages=options["messages"],
                ordering=ordering,
                delay_ms=options["delay_ms"],
                recreate_gap_ms=options["recreate_gap_ms"],
                slow_delete_ms=options["slow_delete_ms"],
                in_flight=options["in_flight"],
                seed=options["seed"],
            )
            reports.append(self.run_one(plan, n, options["timeout"], options["verbosity"]))
        self.print_table(reports)
        if options["json_path"]:
            with open(options["json_path"], "w") as out:
                json.dump({"runs": [r.as_dict() for r in reports]}, out, indent=2)

    def run_one(self, plan: harness.Plan, workers: int, timeout: float, verbosity: int) -> Any:
        mode = harness.mode_name(plan.ordering, workers)
        report = harness.Report(
            mode=mode,
            database=harness.database_label(),
            broker=broker_name(),
            workers=workers,
            entities=plan.entities,
            messages=plan.messages,
        )
        harness.reset()
        # Messages go to the cluster, never run inline; any "cluster" option would bypass ours.
        q_options = {
            k: v for k, v in tombstone_settings.Q_OPTIONS.items() if k not in ("sync", "cluster")
        }
        cluster = Cluster(workers, name=f"racestress-{uuid.uuid4().hex[:8]}")
        if verbosity >= 2:
            self.stderr.write(f"cluster log: {cluster.log_path}")
        cluster.start()
        bar = tqdm(
            total=plan.messages,
            desc=f"{mode} x{workers}",
            unit="job",
            file=sys.stderr,
            disable=verbosity < 1,
            leave=verbosity >= 2,
        )
        try:
            with cluster.messages(), override_settings(TOMBSTONES_Q_OPTIONS=q_options):
                first_id = (Job.objects.aggregate(last=Max("id"))["last"] or 0) + 1
                started = time.monotonic()

                def progress() -> None:
                    bar.n = harness.job_counts(first_id)[1]
                    bar.refresh()

                sent = harness.Feeder(plan, first_id, workers).run(on_progress=progress)
                deadline = started + timeout
                finished = 0
                while time.monotonic() < deadline:
                    total, finished = harness.job_counts(first_id)
                    bar.n = finished
                    bar.refresh()
                    if total >= sent and finished >= total:
                        break
                    time.sleep(0.05)
                else:
                    report.completed = False
                report.seconds = round(time.monotonic() - started, 3)
        finally:
            bar.close()
            cluster.stop()
        report.messages = sent
        report.messages_per_s = round(sent / report.seconds, 1) if report.seconds else 0.0
        return harness.analyse(report, first_id, sent)

    def print_table(self, reports: list[harness.Report]) -> None:
        header = (
            f"{'mode':<11} {'db':<10} {'broker':<6} {'workers':>7} {'entities':>8} "
            f"{'messages':>8} {'seconds':>8} {'msg/s':>8} {'anomalies':>9} {'uncertain':>9}"
        )
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        for r in reports:
            self.stdout.write(
                f"{r.mode:<11} {r.database:<10} {r.broker:<6} {r.workers:>7} {r.entities:>8} "
                f"{r.messages:>8} {r.seconds:>8.2f} {r.messages_per_s:>8.1f} {r.anomalies:>9} "
                f"{r.uncertain:>9}"
            )
        for r in reports:
            found = {k: v for k, v in r.breakdown.items() if v}
            if found:
                self.stdout.write(f"  {r.mode} x{r.workers}: {found}")
            if not r.completed:
                self.stdout.write(f"  {r.mode} x{r.workers}: TIMED OUT before every job ended")
