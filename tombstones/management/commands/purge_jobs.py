"""``manage.py purge_jobs``: remove finished jobs past their retention, with their events, in
bounded batches; says what it removed and what it kept, and why."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...jobs import retention
from ...jobs.retention import AUDIT, JOBS, KINDS
from ..databases import add_database_argument, database_alias

NAMES = {JOBS: "finished jobs", AUDIT: "audit trail"}


def batch_size(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, not {value!r}") from None
    if not 1 <= size <= retention.MAX_BATCH:
        raise argparse.ArgumentTypeError(f"must be between 1 and {retention.MAX_BATCH}, not {size}")
    return size


def _days(kind: str) -> str:
    kept = retention.retention(kind)
    if kept % timedelta(days=1):
        return str(kept)
    return f"{kept.days} day{'s' if kept.days != 1 else ''}"


class Command(BaseCommand):
    help = (
        "Remove finished jobs older than TOMBSTONES_JOB_RETENTION (succeeded, cancelled, "
        "expired) or TOMBSTONES_AUDIT_RETENTION (rejected, failed, uncertain, superseded, "
        "escalated), with their events, in batches of short transactions. Unfinished jobs are "
        "never removed; the dashboard's charts keep their figures. Says what it kept and why."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Report, remove nothing.")
        parser.add_argument("--noinput", "--no-input", action="store_false", dest="interactive")
        parser.add_argument(
            "--batch-size",
            type=batch_size,
            default=retention.DEFAULT_BATCH,
            help=f"Most jobs removed per transaction (default {retention.DEFAULT_BATCH}, at most "
            f"{retention.MAX_BATCH}); halved while batches take over "
            f"{retention.TARGET_SECONDS:g} s.",
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        db = database_alias(options)
        verbosity = options["verbosity"]
        plan = retention.plan(db)
        if verbosity >= 1:
            self._report_plan(plan, verbosity)
        if not plan.total and not plan.rollups:
            if verbosity >= 1:
                self.stdout.write("Nothing to remove.")
            return
        if options["dry_run"]:
            if verbosity >= 1:
                self.stdout.write(
                    f"Would remove {plan.total} job(s) and {plan.events} event(s) (dry run)."
                )
            return
        if options["interactive"]:
            answer = input(
                f"Remove {plan.total} job(s) and {plan.events} event(s) permanently? "
                "Type 'yes' to continue: "
            )
            if answer != "yes":
                raise CommandError("Purge cancelled.")
        purged = retention.purge(db, now=plan.now, batch_size=options["batch_size"])
        if verbosity >= 1:
            self._report_purged(purged, options["batch_size"])

    def _report_plan(self, plan: retention.Plan, verbosity: int) -> None:
        for kind, statuses in KINDS.items():
            self.stdout.write(
                f"{NAMES[kind]} ({', '.join(statuses)}; kept {_days(kind)}): "
                f"{plan.by_kind(kind)} past retention; kept {plan.young[kind]} younger"
            )
            if verbosity >= 2:
                for status in statuses:
                    self.stdout.write(f"  {status}: {plan.removable.get(status, 0)}")
        self.stdout.write(
            f"kept {plan.unfinished} unfinished job(s) (queued, running, retry_wait, paused): "
            "never removed"
        )
        if plan.no_finish:
            self.stdout.write(f"kept {plan.no_finish} finished job(s) without a finish time")
        if plan.rollups:
            self.stdout.write(
                f"{plan.rollups} roll-up period(s) past the audit retention, to be summed "
                "into the totals"
            )

    def _report_purged(self, purged: retention.Purged, asked: int) -> None:
        slow = ""
        if purged.slow_batches:
            slow = (
                f"; {purged.slow_batches} slow batch(es) brought the size from {asked} down "
                f"to {purged.smallest_batch}"
            )
        rollups = (
            f"; {purged.rollups} roll-up period(s) summed into the totals" if purged.rollups else ""
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"Removed {purged.total} job(s) and {purged.events} event(s) in "
                f"{purged.batches} batch(es){slow}{rollups}."
            )
        )
