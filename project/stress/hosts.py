"""The race harness through several hosts: independent ``qcluster`` processes, one cluster name.

Each host is a ``qcluster`` of its own (its own process group and environment, nothing shared
but the database and the broker), named by ``STRESS_HOST`` so that its workers' ids
(``host:pid``) say which host ran what. A host may join after the run began (``start_at``: once
that many jobs ended) and may be killed (``kill_at``: SIGKILL of its whole process group once
that many jobs ended and it holds a lease), like a machine that loses power: the jobs it held
must come back through the other hosts (their timers, or the sweep) and run once.

Used by ``tests/acceptance/test_hosts.py`` and ``bench/hosts.py``.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Max
from django.test.utils import override_settings

from tombstones.conf import tombstone_settings
from tombstones.jobs import wakeups
from tombstones.models import Job, JobEvent

from . import harness
from .apps import HOST_ENV
from .cluster import Cluster, broker_name
from .models import Delivery

# Longest wait for a host due to be killed to hold a lease (seconds); then it is killed anyway.
KILL_WAIT = 30.0


@dataclass
class Host:
    name: str
    workers: int = 2
    start_at: int = 0  # jobs ended before the host starts (0: before the run)
    kill_at: int | None = None  # jobs ended before its SIGKILL (None: never killed)


@dataclass
class HostsRun:
    report: harness.Report
    hosts: list[Host]
    timeline: list[str] = field(default_factory=list)  # "12.3s host-c started", ...
    delivered: dict[str, int] = field(default_factory=dict)  # deliveries ended, per host
    held_at_kill: list[int] = field(default_factory=list)  # jobs running on the killed host
    rescued_by: dict[int, str] = field(default_factory=dict)  # held job -> who took it back
    ended_after: dict[int, str] = field(default_factory=dict)  # held job -> its status at the end

    def as_dict(self) -> dict[str, Any]:
        return {
            "report": self.report.as_dict(),
            "hosts": [h.__dict__ for h in self.hosts],
            "timeline": self.timeline,
            "delivered": self.delivered,
            "held_at_kill": self.held_at_kill,
            "rescued_by": {str(k): v for k, v in self.rescued_by.items()},
            "ended_after": {str(k): v for k, v in self.ended_after.items()},
        }


def host_of(worker: str) -> str:
    return worker.rsplit(":", 1)[0]


@contextlib.contextmanager
def _routing(name: str, broker: Any) -> Iterator[None]:
    """This process's wake-ups go to the hosts' queue (through ``broker`` when given)."""
    from .cluster import queue_namespace

    # Messages go to the clusters, never run inline; any "cluster" option would bypass ours.
    q_options = {
        k: v for k, v in tombstone_settings.Q_OPTIONS.items() if k not in ("sync", "cluster")
    }
    key = (os.getpid(), name)
    with queue_namespace(name), override_settings(TOMBSTONES_Q_OPTIONS=q_options):
        if broker is not None:  # after override_settings, which forgets the brokers
            wakeups._brokers[key] = broker
        try:
            yield
        finally:
            wakeups._brokers.pop(key, None)


def run_on_hosts(
    plan: harness.Plan,
    hosts: list[Host],
    *,
    settings_module: str | None = None,
    env: dict[str, str] | None = None,
    broker: Any = None,
    name: str | None = None,
    timeout: float = 300.0,
) -> HostsRun:
    """Feed ``plan`` to the hosts, wait for every job (bounded by ``timeout``), count anomalies.

    ``broker``: the django-q2 broker this process sends through (and pings the clusters with),
    when this process's own settings name another one (a test run without REDIS_URL); it must
    send to the queue ``name``.
    """
    name = name or f"hosts-{uuid.uuid4().hex[:8]}"  # one cluster name for every host
    workers = sum(h.workers for h in hosts)
    report = harness.Report(
        mode=f"{len(hosts)} hosts",
        database=harness.database_label(),
        broker=broker_name(),
        workers=workers,
        entities=plan.entities,
        messages=plan.messages,
    )
    run = HostsRun(report=report, hosts=hosts)
    harness.reset()
    clusters = {
        h.name: Cluster(
            h.workers,
            name=name,
            env={**(env or {}), HOST_ENV: h.name},
            settings_module=settings_module,
            broker=broker,
        )
        for h in hosts
    }
    started = time.monotonic()
    killed: set[str] = set()
    due_since: dict[str, float] = {}

    def note(text: str) -> None:
        run.timeline.append(f"{time.monotonic() - started:.1f}s {text}")

    def on_progress() -> None:
        ended = harness.job_counts(first_id)[1]
        for host in hosts:
            cluster = clusters[host.name]
            if cluster.process is None and ended >= host.start_at:
                cluster.launch()
                note(f"{host.name} started after {ended} jobs ended")
            if (
                host.kill_at is not None
                and host.name not in killed
                and cluster.process is not None
                and ended >= host.kill_at
            ):
                waited = time.monotonic() - due_since.setdefault(host.name, time.monotonic())
                if _running_on(host.name) or waited > KILL_WAIT:
                    cluster.kill()
                    killed.add(host.name)
                    # Read again once it is dead: a job may have ended in between.
                    held = run.held_at_kill = _running_on(host.name)
                    note(f"{host.name} killed (SIGKILL) after {ended} jobs ended, holding {held}")

    try:
        with _routing(name, broker):
            first_id = (Job.objects.aggregate(last=Max("id"))["last"] or 0) + 1
            first = [h for h in hosts if h.start_at <= 0]
            for host in first:
                clusters[host.name].start(ready_timeout=90)
            started = time.monotonic()
            for host in first:
                note(f"{host.name} started")
            sent = harness.Feeder(plan, first_id, workers).run(on_progress=on_progress)
            deadline = started + timeout
            while True:
                on_progress()  # a host due to start or die still does, whatever the feed
                total, ended = harness.job_counts(first_id)
                if total >= sent and ended >= total:
                    break
                if time.monotonic() >= deadline:
                    report.completed = False
                    break
                time.sleep(0.1)
            report.seconds = round(time.monotonic() - started, 2)
            report.messages_per_s = round(sent / report.seconds, 1) if report.seconds else 0.0
    finally:
        for cluster in clusters.values():
            cluster.stop()
        _drop_keys(name, broker)
    harness.analyse(report, first_id, sent)
    ends = Delivery.objects.filter(job_id__gte=first_id, phase=Delivery.Phase.END)
    run.delivered = dict(Counter(host_of(w) for w in ends.values_list("worker", flat=True)))
    if run.held_at_kill:
        rescues = JobEvent.objects.filter(
            job_id__in=run.held_at_kill,
            reason__in=[Job.Reason.LEASE_EXPIRED, Job.Reason.OUTCOME_UNKNOWN],
        )
        run.rescued_by = dict(rescues.values_list("job_id", "worker"))
        run.ended_after = {
            pk: str(status)
            for pk, status in Job.objects.filter(pk__in=run.held_at_kill).values_list(
                "pk", "status"
            )
        }
    return run


def _running_on(host: str) -> list[int]:
    """Jobs running under a lease of one of the host's workers."""
    running = Job.objects.filter(status=Job.Status.RUNNING, owner__startswith=f"{host}:")
    return list(running.values_list("pk", flat=True))


def _drop_keys(name: str, broker: Any) -> None:
    """The queue and the wake-up keys of the run (Redis), so nothing is left behind."""
    connection = getattr(broker, "connection", None)
    if connection is None:
        with contextlib.suppress(Exception):
            from django_q.brokers import get_broker

            connection = getattr(get_broker(name), "connection", None)
    if connection is None or not hasattr(connection, "delete"):
        return
    key = f"django_q:{name}:q"
    with contextlib.suppress(Exception):
        connection.delete(key, f"{key}:tombstones:gate", f"{key}:tombstones:helper")
