"""``manage.py tombstones_health``: is the cluster alive and keeping up? For probes and cron.

Exit 0 when it is; exit 1 with one line per problem otherwise (``--json``: the report as JSON
on stdout, the exit code the same). See :mod:`tombstones.monitoring.health`.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...jobs import beats
from ...monitoring import health
from ..databases import add_database_argument, database_alias


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is no number of seconds >= 0")
    return value


def count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is no whole number >= 0")
    return int(text)


class Command(BaseCommand):
    help = (
        "Check that the job cluster is alive and keeping up: the database and each cluster's "
        "broker reachable, a live worker in every cluster with due jobs, no job due for longer "
        "than --max-wait, no uncertain or escalated job waiting for staff (past "
        "--max-awaiting). Exit 0 when healthy, 1 with one line per problem."
    )
    # A probe: no system checks first (they cost a second, and on Django 6.1 one of them needs
    # the database: a traceback instead of the "database" problem's line).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser)
        parser.add_argument(
            "--max-wait",
            type=seconds,
            default=300.0,
            help="Seconds the oldest due job of a queue may wait for a worker (default 300).",
        )
        parser.add_argument(
            "--worker-silence",
            type=seconds,
            default=beats.SILENCE.total_seconds(),
            help="Seconds without a heartbeat after which a worker counts as dead (default "
            f"{beats.SILENCE.total_seconds():.0f}; workers beat every {beats.BEAT_SECONDS:.0f}).",
        )
        parser.add_argument(
            "--max-awaiting",
            type=count,
            default=0,
            help="Uncertain and escalated jobs that may wait for staff (default 0).",
        )
        parser.add_argument("--json", action="store_true", help="The report as JSON on stdout.")

    def handle(self, *args: Any, **options: Any) -> None:
        limits = health.Limits(
            max_wait=timedelta(seconds=options["max_wait"]),
            silence=timedelta(seconds=options["worker_silence"]),
            max_awaiting=options["max_awaiting"],
        )
        report = health.check(database_alias(options), limits)
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), sort_keys=True))
        else:
            for problem in report.problems:
                self.stdout.write(self.style.ERROR(f"FAIL {problem.check}: {problem.message}"))
            if report.healthy:
                workers = sum(report.workers.values())
                oldest = max(report.oldest_due_seconds.values(), default=0.0)
                staff = sum(report.awaiting_staff.values())
                self.stdout.write(
                    self.style.SUCCESS(
                        f"ok: {workers} live worker(s), oldest due job {oldest:.1f} s, "
                        f"{staff} job(s) wait for staff"
                    )
                )
        if not report.healthy:
            raise CommandError(f"{len(report.problems)} problem(s)", returncode=1)
