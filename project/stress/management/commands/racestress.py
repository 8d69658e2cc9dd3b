"""``manage.py racestress``: reproduce the seed's delete/re-create race against real workers.

Starts a django-q2 cluster (``qcluster``, ``--workers N``) on the configured database and broker,
feeds it bursty changes for ``--entities`` entities, waits for every job to end, and compares the
downstream store with the source of truth. ``--no-ordering`` gives every job its own lane (the
seed's bug) and must show anomalies; the default (one lane per entity) must show none.

It wipes the ``stress`` app's tables and their jobs before each run. SIGTERM, SIGINT (Ctrl-C) and
SIGHUP stop the run and its cluster; the exit status is then 128 + the signal's number. A run
that times out exits with status 1 after its table. See docs/operations.md for the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Max
from django.test.utils import override_settings
from tqdm import tqdm

from project.stress import harness
from project.stress.cluster import Cluster, broker_name
from tombstones.conf import tombstone_settings
from tombstones.models import Job

# Off a terminal (a log, CI), a progress line this often (seconds) instead of a bar.
PROGRESS_EVERY = 10.0
# More worker processes than this is a typo, not a stress test, on any machine this runs on.
MAX_WORKERS = 64


def _bounded(
    kind: type[int] | type[float],
    minimum: float,
    *,
    strict: bool = False,
    maximum: float = math.inf,
) -> Callable[[str], Any]:
    """An argparse ``type``: a finite number >= minimum (> minimum if strict), <= maximum."""
    noun = "a whole number" if kind is int else "a number"
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    if maximum != math.inf:
        bound += f" and <= {maximum:g}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        too_low = value <= minimum if strict else value < minimum
        if not math.isfinite(value) or too_low or value > maximum:
            raise argparse.ArgumentTypeError(f"must be {bound}, not {text}")
        return value

    return parse


class Progress:
    """Jobs ended so far (verbosity >= 1): a bar on a terminal, a line now and then elsewhere."""

    def __init__(
        self,
        command: BaseCommand,
        label: str,
        total: int,
        verbosity: int,
        *,
        terminal: bool | None = None,
    ) -> None:
        self.command, self.label, self.total = command, label, total
        self.enabled = verbosity >= 1
        self.started = self.last_line = time.monotonic()
        self.bar = None
        if terminal is None:
            terminal = sys.stderr.isatty()
        if self.enabled and terminal:
            self.bar = tqdm(
                total=total, desc=label, unit="job", file=sys.stderr, leave=verbosity >= 2
            )

    def update(self, finished: int) -> None:
        if self.bar is not None:
            self.bar.n = finished
            self.bar.refresh()
        elif self.enabled and time.monotonic() - self.last_line >= PROGRESS_EVERY:
            self.last_line = time.monotonic()
            self.command.stderr.write(
                f"{self.label}: {finished}/{self.total} jobs ended "
                f"after {self.last_line - self.started:.0f}s"
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Command(BaseCommand):
    help = "Race real django-q2 workers on delete / re-create bursts and count anomalies."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workers",
            type=_bounded(int, 1, maximum=MAX_WORKERS),
            nargs="+",
            default=[2],
            help="Worker processes of the cluster (several values: one run each). 1: sequential.",
        )
        parser.add_argument("--entities", type=_bounded(int, 1), default=200)
        parser.add_argument(
            "--messages", type=_bounded(int, 1), default=1000, help="Changes (jobs) in all."
        )
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
            type=_bounded(float, 0),
            default=harness.Plan.delay_ms,
            help="Each delivery waits a random 0..N ms before its downstream write (race window).",
        )
        parser.add_argument(
            "--recreate-gap-ms",
            type=_bounded(float, 0),
            default=harness.Plan.recreate_gap_ms,
            help="A re-create follows its delete within 0..N ms.",
        )
        parser.add_argument(
            "--slow-delete-ms",
            type=_bounded(float, 0),
            default=harness.Plan.slow_delete_ms,
            help="The delete of a delete+recreate burst is delivered in N/4..N ms.",
        )
        parser.add_argument(
            "--in-flight",
            type=_bounded(int, 0),
            default=0,
            help="Unfinished jobs the feeder allows; it tops them up in bursts (0: workers + 2).",
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--timeout",
            type=_bounded(float, 0, strict=True),
            default=600.0,
            help="Seconds to wait for the jobs to end.",
        )
        parser.add_argument("--json", dest="json_path", help="Write the results as JSON here.")

    def handle(self, *args: Any, **options: Any) -> None:
        workers: list[int] = options["workers"]
        if any(n < 1 for n in workers):  # call_command(workers=[...]) skips argparse
            raise CommandError("--workers must be at least 1.")
        if options["entities"] < 1 or options["messages"] < 1:
            raise CommandError("--entities and --messages must be at least 1.")
        runs: list[tuple[bool, int]]
        if options["compare"]:
            runs = [(True, 1)] + [(o, n) for n in workers for o in (True, False)]
        else:
            runs = [(not options["no_ordering"], n) for n in workers]
        reports = []
        try:
            with harness.stop_on_signals():
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
        except BaseException as exc:
            stop = harness.stopped_by(exc)
            if stop is None:
                raise
            # The cluster was stopped on the way out (run_one's finally); no traceback.
            raise CommandError(
                f"Stopped by {stop}: the worker cluster is stopped.", returncode=128 + stop.signum
            ) from None
        self.print_table(reports)
        if options["json_path"]:
            with open(options["json_path"], "w") as out:
                json.dump({"runs": [r.as_dict() for r in reports]}, out, indent=2)
        timed_out = sum(1 for r in reports if not r.completed)
        if timed_out:
            raise CommandError(
                f"{timed_out} run(s) timed out after {options['timeout']:g}s with jobs unfinished "
                "(raise --timeout, or lower --messages)."
            )

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
        progress: Progress | None = None
        # From before start(): a signal at any point after it still reaches cluster.stop().
        try:
            try:
                cluster.start()
            except (RuntimeError, TimeoutError) as exc:
                raise CommandError(f"The worker cluster did not start: {exc}") from None
            progress = Progress(self, f"{mode} x{workers}", plan.messages, verbosity)
            with cluster.messages(), override_settings(TOMBSTONES_Q_OPTIONS=q_options):
                first_id = (Job.objects.aggregate(last=Max("id"))["last"] or 0) + 1
                started = time.monotonic()
                shown = progress

                def on_progress() -> None:
                    shown.update(harness.job_counts(first_id)[1])

                try:
                    sent = harness.Feeder(plan, first_id, workers).run(on_progress=on_progress)
                except harness.Stalled as exc:
                    raise CommandError(f"{exc} (cluster log: {cluster.log_path})") from None
                deadline = started + timeout
                while True:  # counted once more at the deadline: a finished run never times out
                    total, finished = harness.job_counts(first_id)
                    progress.update(finished)
                    if total >= sent and finished >= total:
                        break
                    if time.monotonic() >= deadline:
                        report.completed = False
                        break
                    time.sleep(0.05)
                report.seconds = round(time.monotonic() - started, 3)
        finally:
            if progress is not None:
                progress.close()
            cluster.stop()
        report.messages = sent
        report.messages_per_s = round(sent / report.seconds, 1) if report.seconds else 0.0
        return harness.analyse(report, first_id, sent)

    def print_table(self, reports: list[harness.Report]) -> None:
        header = (
            f"{'mode':<11} {'db':<10} {'broker':<6} {'workers':>7} {'entities':>8} "
            f"{'messages':>8} {'seconds':>8} {'msg/s':>8} {'anomalies':>9} {'uncertain':>9} "
            f"{'superseded':>10}"
        )
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        for r in reports:
            self.stdout.write(
                f"{r.mode:<11} {r.database:<10} {r.broker:<6} {r.workers:>7} {r.entities:>8} "
                f"{r.messages:>8} {r.seconds:>8.2f} {r.messages_per_s:>8.1f} {r.anomalies:>9} "
                f"{r.uncertain:>9} {r.superseded:>10}"
            )
        for r in reports:
            found = {k: v for k, v in r.breakdown.items() if v}
            if found:
                self.stdout.write(f"  {r.mode} x{r.workers}: {found}")
            if r.uncertain:
                self.stdout.write(
                    f"  {r.mode} x{r.workers}: {r.uncertain} job(s) need a staff decision "
                    "(uncertain: see the admin's Jobs list)"
                )
            if not r.completed:
                self.stdout.write(f"  {r.mode} x{r.workers}: TIMED OUT before every job ended")
