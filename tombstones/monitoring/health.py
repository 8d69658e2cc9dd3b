"""Whether the cluster is alive and keeping up: ``manage.py tombstones_health``'s checks.

One :class:`Problem` per thing an operator must act on: the database or a cluster's broker
unreachable, no live worker in a cluster while its queues have due jobs, a queue's oldest due
job waiting past a threshold, uncertain or escalated jobs waiting for staff.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, router
from django.db.models import Count

from ..jobs import beats, queues
from ..jobs.models import Job
from ..jobs.states import AWAITING_STAFF as AWAITING


@dataclass(frozen=True)
class Limits:
    max_wait: timedelta = timedelta(minutes=5)
    silence: timedelta = beats.SILENCE
    max_awaiting: int = 0


@dataclass(frozen=True)
class Problem:
    check: str  # database, broker, workers, oldest_due, awaiting_staff
    message: str


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    workers: dict[str, int] = field(default_factory=dict)
    oldest_due_seconds: dict[str, float] = field(default_factory=dict)
    awaiting_staff: dict[str, int] = field(default_factory=dict)
    brokers: dict[str, str] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, **asdict(self)}


def check(using: str | None = None, limits: Limits | None = None) -> Report:
    limits = limits or Limits()
    db = using or router.db_for_read(Job)
    report = Report()
    for cluster in queues.clusters():
        report.brokers[cluster] = broker_status(cluster)
        if report.brokers[cluster] != "ok":
            report.problems.append(
                Problem(
                    "broker",
                    f"the broker of cluster {cluster!r} is unreachable "
                    f"({report.brokers[cluster]}): no wake-up reaches its workers",
                )
            )
    try:
        _ledger(db, limits, report)
    except DatabaseError as exc:
        report.problems.append(
            Problem("database", f"the database is unreachable ({type(exc).__name__})")
        )
    return report


def _ledger(db: str, limits: Limits, report: Report) -> None:
    waits = Job.objects.using(db).hint_waits(queues.known())
    report.oldest_due_seconds = {q: round(max(w.total_seconds(), 0.0), 3) for q, w in waits.items()}
    report.workers = beats.live(db, limits.silence)
    due_by_cluster: dict[str, list[str]] = {}
    for queue in waits:
        due_by_cluster.setdefault(queues.cluster_of(queue), []).append(queue)
    for cluster, due in sorted(due_by_cluster.items()):
        if not report.workers.get(cluster):
            oldest = max(report.oldest_due_seconds[q] for q in due)
            report.problems.append(
                Problem(
                    "workers",
                    f"no live worker in cluster {cluster!r} while queue(s) {', '.join(due)} "
                    f"have due jobs (the oldest due for {oldest:.0f} s)",
                )
            )
    for queue, seconds in sorted(report.oldest_due_seconds.items()):
        if seconds > limits.max_wait.total_seconds():
            report.problems.append(
                Problem(
                    "oldest_due",
                    f"queue {queue!r}: the oldest due job has waited {seconds:.0f} s "
                    f"(limit {limits.max_wait.total_seconds():.0f} s)",
                )
            )
    counted = Job.objects.using(db).filter(status__in=AWAITING).values_list("status").order_by()
    report.awaiting_staff = dict(counted.annotate(n=Count("id")))
    waiting = sum(report.awaiting_staff.values())
    if waiting > limits.max_awaiting:
        listed = ", ".join(f"{n} {status}" for status, n in sorted(report.awaiting_staff.items()))
        report.problems.append(
            Problem(
                "awaiting_staff",
                f"{listed} job(s) wait for staff (the admin's job dashboard; "
                f"limit {limits.max_awaiting})",
            )
        )


def broker_status(cluster: str) -> str:
    """``"ok"``, or why the broker of ``cluster`` cannot be reached (an exception's class)."""
    from django_q.brokers import get_broker

    try:
        broker = get_broker(cluster)
        if broker.ping() is False:
            return "no answer"
        broker.queue_size()  # the ORM broker's ping asks nothing: this reads its table
    except Exception as exc:  # noqa: BLE001 - whatever the broker's client raises, it is down
        return type(exc).__name__
    return "ok"
