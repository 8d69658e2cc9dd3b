"""``manage.py tombstones_doctor``: check the ledger's invariants; non-zero exit on failure."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import tombstone_settings
from ...jobs.models import Job
from ...jobs.wakeups import TASK as TASK_FUNC
from ...worker import carried as carried_statuses
from ..databases import add_database_argument, database_alias

# Orphaned job ids listed at verbosity 2.
MAX_LISTED = 20


class Command(BaseCommand):
    help = (
        "Check the invariants: no unfenced unfinished jobs, retention longer than the maximum "
        "queue age, no rejected/failed job recorded as a django-q2 success, no running job with "
        "an expired lease. Successful django-q2 tasks whose job was deleted since are listed "
        "apart, as orphans, and are not a problem."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        db = database_alias(options)
        contradictions, orphans = self._q_successes(db)
        problems: list[str] = []
        checks = [
            ("unfenced jobs", self._unfenced(db)),
            ("retention", self._retention()),
            ("django-q2 successes", contradictions),
            ("expired leases", self._expired_leases(db)),
        ]
        for name, found in checks:
            if found:
                problems.extend(found)
                self.stdout.write(self.style.ERROR(f"FAIL {name}"))
                for line in found:
                    self.stdout.write(f"  - {line}")
            else:
                self.stdout.write(self.style.SUCCESS(f"ok   {name}"))
        self._report_orphans(orphans, options["verbosity"])
        if problems:
            raise CommandError(f"{len(problems)} problem(s) found.")

    def _report_orphans(self, orphans: list[Any], verbosity: int) -> None:
        """Not a problem: the job ran and its row was deleted since (a purge, a test harness)."""
        if not orphans:
            return
        self.stdout.write(
            f"note orphaned django-q2 tasks: {len(orphans)} successful task(s) name jobs that no "
            "longer exist (deleted after they ran); nothing to contradict, not counted as a problem"
        )
        if verbosity >= 2:
            shown = ", ".join(str(job_id) for job_id in orphans[:MAX_LISTED])
            more = f" and {len(orphans) - MAX_LISTED} more" if len(orphans) > MAX_LISTED else ""
            self.stdout.write(f"  job ids: {shown}{more}")

    def _unfenced(self, db: str) -> list[str]:
        jobs = Job.objects.using(db).unfinished().unfenced()
        return [
            f"job {pk} has no generation/version (status {s})"
            for pk, s in jobs.values_list("pk", "status")[:100]
        ]

    def _retention(self) -> list[str]:
        retention, max_age = tombstone_settings.RETENTION, tombstone_settings.JOB_MAX_AGE
        if retention <= max_age:
            return [
                f"TOMBSTONES_RETENTION ({retention}) is not longer than "
                f"TOMBSTONES_JOB_MAX_AGE ({max_age})"
            ]
        return []

    def _q_successes(self, db: str) -> tuple[list[str], list[Any]]:
        """(contradictions, orphans): a task's claim against the job row, when there is one."""
        from django_q.models import Task

        found: list[str] = []
        orphans: list[Any] = []
        claims: list[tuple[Any, str]] = []
        tasks = Task.objects.using(db).filter(func=TASK_FUNC, success=True)
        for (result,) in tasks.values_list("result").iterator():
            claims += carried_statuses(result)
        ledger = dict(
            Job.objects.using(db)
            .filter(pk__in={job_id for job_id, _ in claims})
            .values_list("pk", "status")
        )
        for job_id, status in claims:
            if status != Job.Status.SUCCEEDED:
                found.append(f"job {job_id}: django-q2 task stored as success with status {status}")
            elif job_id not in ledger:
                orphans.append(job_id)
            elif ledger[job_id] != Job.Status.SUCCEEDED:
                found.append(
                    f"job {job_id}: django-q2 task says succeeded, the ledger says {ledger[job_id]}"
                )
        return found, sorted(set(orphans), key=_id_order)

    def _expired_leases(self, db: str) -> list[str]:
        jobs = Job.objects.using(db).lapsed()
        return [
            f"job {pk} is running with an expired lease (owner {owner})"
            for pk, owner in jobs.values_list("pk", "owner")[:100]
        ]


def _id_order(job_id: Any) -> tuple[int, int, str]:
    # Job ids are ints; a hand-edited task result may hold anything, and must not crash the sort.
    return (0, job_id, "") if isinstance(job_id, int) else (1, 0, str(job_id))
