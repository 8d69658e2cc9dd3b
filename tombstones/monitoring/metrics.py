"""The Prometheus metrics, read from the ledger at scrape time (any number of worker processes
and hosts: nothing per process to merge).

Families (labels never carry a record's identity, a job's parameters or a person's data:
queue, status, reason, cluster and worker process names only):

- ``tombstones_jobs{queue,status}``: jobs now, unfinished (queued, running, retry_wait,
  paused) and waiting for staff (uncertain, escalated); zeros included.
- ``tombstones_lanes{queue,status}``: lanes with a job in that unfinished status (a running,
  retry_wait or paused job holds its lane).
- ``tombstones_job_outcomes_total{status,reason}``: every job that finished, by its outcome;
  from the outcome roll-up, so a purge never takes one away.
- ``tombstones_oldest_due_seconds{queue}``: how long the longest-due job has waited for a
  worker (0: none due).
- ``tombstones_workers{cluster}``: worker processes alive (a heartbeat within 30 s).
- ``tombstones_worker_last_heartbeat_timestamp_seconds{cluster,worker}``: each worker's last
  heartbeat (Unix time), for workers heard of in the last hour.
- ``tombstones_broker_up{cluster}``: 1 when the cluster's django-q2 broker answers, else 0.
- ``tombstones_start_latency_seconds{quantile}``: from due (the enqueue, or a delay's or a
  retry's end) to start, over the last :data:`SAMPLE` jobs that finished in the last
  :data:`WINDOW`; ``tombstones_start_latency_jobs``: how many that is.

Each read follows the work in hand, not the ledger's size: the unfinished jobs (their partial
index), the finished jobs of the last minutes (the finished index, backwards, capped), one probe
of the hint index per queue, the roll-up's and the heartbeats' small tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta

from django.db import connections, router
from django.db.models import Count
from django.db.models.functions import Now
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..jobs import beats, queues
from ..jobs.ledger import rollup
from ..jobs.models import Job
from ..jobs.states import AWAITING_STAFF as AWAITING
from ..jobs.states import TERMINAL, UNFINISHED
from .health import broker_status

WINDOW = timedelta(minutes=5)
SAMPLE = 1000
QUANTILES = (0.5, 0.9, 0.99)


class LedgerCollector(Collector):
    """The families above, read from ``using`` (default: the job table's read database)."""

    def __init__(self, using: str | None = None) -> None:
        self.db = using or router.db_for_read(Job)

    def describe(self) -> list[Metric]:
        return []  # nothing read when registered: only at a scrape

    def collect(self) -> Iterator[Metric]:
        yield from self.jobs_and_lanes()
        yield self.outcomes()
        yield self.oldest_due()
        yield from self.workers()
        yield self.brokers()
        yield from self.start_latency()

    def jobs_and_lanes(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "tombstones_jobs",
            "Jobs now by queue and status: unfinished, and waiting for staff.",
            labels=["queue", "status"],
        )
        lanes = GaugeMetricFamily(
            "tombstones_lanes",
            "Lanes with a job in this unfinished status (running, retry_wait and paused hold "
            "their lane).",
            labels=["queue", "status"],
        )
        found_jobs, found_lanes = current(self.db)
        names = sorted({*queues.known(), *(queue for queue, _ in found_jobs)})
        for queue in names:
            for status in (*UNFINISHED, *AWAITING):
                jobs.add_metric([queue, status], found_jobs.get((queue, status), 0))
                if status in UNFINISHED:
                    lanes.add_metric([queue, status], found_lanes.get((queue, status), 0))
        yield jobs
        yield lanes

    def outcomes(self) -> Metric:
        family = CounterMetricFamily(
            "tombstones_job_outcomes",
            "Jobs finished since the ledger began, by status and reason (purges take none away).",
            labels=["status", "reason"],
        )
        for (status, reason), n in sorted(rollup.totals(self.db).items()):
            family.add_metric([status, reason], n)
        return family

    def oldest_due(self) -> Metric:
        family = GaugeMetricFamily(
            "tombstones_oldest_due_seconds",
            "How long the longest-due job of a queue has waited for a worker (0: none due).",
            labels=["queue"],
        )
        known = queues.known()
        waits = Job.objects.using(self.db).hint_waits(known)
        for queue in known:
            wait = waits.get(queue)
            family.add_metric([queue], max(wait.total_seconds(), 0.0) if wait else 0.0)
        return family

    def workers(self) -> Iterator[Metric]:
        live = GaugeMetricFamily(
            "tombstones_workers",
            "Worker processes alive (a heartbeat in the last 30 seconds), by cluster.",
            labels=["cluster"],
        )
        counts = beats.live(self.db)
        for cluster in sorted({*counts, *queues.clusters()}):
            live.add_metric([cluster], counts.get(cluster, 0))
        last = GaugeMetricFamily(
            "tombstones_worker_last_heartbeat_timestamp_seconds",
            "Each worker process's last heartbeat (Unix time), for those heard of in the last "
            "hour.",
            labels=["cluster", "worker"],
        )
        for cluster, name, at in beats.last_beats(self.db):
            last.add_metric([cluster, name], at)
        yield live
        yield last

    def brokers(self) -> Metric:
        family = GaugeMetricFamily(
            "tombstones_broker_up",
            "1 when the django-q2 broker of a cluster answers, 0 when it cannot be reached.",
            labels=["cluster"],
        )
        for cluster in queues.clusters():
            family.add_metric([cluster], 1.0 if broker_status(cluster) == "ok" else 0.0)
        return family

    def start_latency(self) -> Iterator[Metric]:
        waits = sorted(self._recent_waits())
        family = GaugeMetricFamily(
            "tombstones_start_latency_seconds",
            f"From due to start, for the last {SAMPLE} jobs finished in the last "
            f"{int(WINDOW.total_seconds() // 60)} minutes (quantiles; none: no such job).",
            labels=["quantile"],
        )
        if waits:
            for q in QUANTILES:
                # Nearest rank: the smallest wait at least q of the jobs did not exceed.
                family.add_metric([str(q)], waits[max(math.ceil(q * len(waits)) - 1, 0)])
        yield family
        yield GaugeMetricFamily(
            "tombstones_start_latency_jobs",
            "How many jobs tombstones_start_latency_seconds is computed over.",
            value=len(waits),
        )

    def _recent_waits(self) -> list[float]:
        """Due-to-start seconds of the last :data:`SAMPLE` jobs finished within
        :data:`WINDOW`: one backward range of the finished index per final status, capped, in
        one statement (UNION ALL: each part keeps its own plan)."""
        conn = connections[self.db]
        parts, params = [], []
        for n, status in enumerate(TERMINAL):
            rows = (
                Job.objects.using(self.db)
                .filter(status=status, finished_at__gte=Now() - WINDOW, started_at__isnull=False)
                .order_by("-finished_at")
                .values_list("finished_at", "started_at", "run_after")[:SAMPLE]
            )
            compiler = rows.query.get_compiler(self.db)
            sql, more = compiler.as_sql()
            parts.append(f"SELECT * FROM ({sql}) AS part_{n}")
            params += list(more)
        with conn.cursor() as cursor:
            cursor.execute(" UNION ALL ".join(parts), params)
            found = cursor.fetchall()
        # The rows as the querysets would give them (SQLite's datetimes made aware).
        converters = compiler.get_converters([column for column, _, _ in compiler.select])
        recent = sorted(compiler.apply_converters(found, converters), reverse=True)[:SAMPLE]
        return [max((started - due).total_seconds(), 0.0) for _, started, due in recent]


def current(db: str) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """Jobs and lanes by (queue, status) now: the unfinished ones (their partial index) and
    those waiting for staff (the audit index)."""
    ledger = Job.objects.using(db).order_by()
    unfinished = (
        ledger.filter(status__in=UNFINISHED)
        .values_list("queue", "status")
        .annotate(jobs=Count("id"), lanes=Count("lane", distinct=True))
    )
    awaiting = ledger.filter(status__in=AWAITING).values_list("queue", "status")
    jobs: dict[tuple[str, str], int] = {}
    lanes: dict[tuple[str, str], int] = {}
    for queue, status, n, held in unfinished:
        jobs[queue, status], lanes[queue, status] = n, held
    for queue, status, n in awaiting.annotate(jobs=Count("id")):
        jobs[queue, status] = n
    return jobs, lanes


def registry(using: str | None = None) -> CollectorRegistry:
    """A registry of one :class:`LedgerCollector`, made per scrape."""
    made = CollectorRegistry(auto_describe=False)
    made.register(LedgerCollector(using))
    return made
