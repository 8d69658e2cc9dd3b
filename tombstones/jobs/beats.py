"""Workers' heartbeats: each cluster worker process writes its row of
:class:`~tombstones.jobs.models.WorkerBeat` every :data:`BEAT_SECONDS`, from a daemon thread of
its own (a long handler does not silence it), so that the metrics and ``tombstones_health`` can
tell live workers from dead ones across hosts.

A worker counts as live while its last beat is younger than :data:`SILENCE`. django-q2 keeps
its own cluster statistics in the broker, but on the ORM broker only through a cache shared by
every process (not Django's default): the ledger's database is the one place every worker can
reach. The clock is the database's, on both sides.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta

from django.db import DatabaseError, IntegrityError, connections, router, transaction
from django.db.models import Count, Q
from django.db.models.functions import Now

from .models import WorkerBeat

logger = logging.getLogger("tombstones")

BEAT_SECONDS = 10.0
# A worker silent this long is dead (three beats missed).
SILENCE = timedelta(seconds=3 * BEAT_SECONDS)
# Rows silent this long go (the sweep): dead workers leave the metrics after an hour.
FORGET = timedelta(hours=1)


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


def beat(cluster: str, *, name: str | None = None, using: str | None = None) -> None:
    """Write this process's (or ``name``'s) heartbeat: its row's ``beat_at`` is now."""
    db = using or router.db_for_write(WorkerBeat)
    name = name or process_name()
    beats = WorkerBeat.objects.using(db)
    if beats.filter(name=name).update(cluster=cluster, beat_at=Now()):
        return
    try:
        with transaction.atomic(using=db):
            beats.create(name=name, cluster=cluster)
    except IntegrityError:  # a pid reused while its dead predecessor's row is still here
        beats.filter(name=name).update(cluster=cluster, beat_at=Now(), started_at=Now())


def started(cluster: str, *, using: str | None = None) -> None:
    """A new worker process: a row of its own (a reused pid's row restarts)."""
    db = using or router.db_for_write(WorkerBeat)
    name = process_name()
    WorkerBeat.objects.using(db).filter(name=name).delete()
    beat(cluster, name=name, using=db)


def live(using: str | None = None, silence: timedelta = SILENCE) -> dict[str, int]:
    """Live workers per cluster (their last beat within ``silence``); clusters with beats
    but none live are 0."""
    db = using or router.db_for_read(WorkerBeat)
    rows = (
        WorkerBeat.objects.using(db)
        .values("cluster")
        .annotate(n=Count("id", filter=Q(beat_at__gt=Now() - silence)))
        .order_by()
    )
    return {row["cluster"]: row["n"] for row in rows}


def last_beats(using: str | None = None) -> list[tuple[str, str, float]]:
    """(cluster, name, unix time of the last beat) of every worker heard of in the last hour."""
    db = using or router.db_for_read(WorkerBeat)
    rows = WorkerBeat.objects.using(db).values_list("cluster", "name", "beat_at")
    return [
        (cluster, name, at.timestamp()) for cluster, name, at in rows.order_by("cluster", "name")
    ]


def forget(using: str | None = None) -> int:
    """Delete the rows of workers silent for :data:`FORGET` (the sweep's)."""
    db = using or router.db_for_write(WorkerBeat)
    silent = WorkerBeat.objects.using(db).filter(beat_at__lt=Now() - FORGET)
    # A read first: on SQLite a DELETE waits for (and takes) the one write lock, every minute.
    if not silent.exists():
        return 0
    deleted, _ = silent.delete()
    return deleted


class Heart:
    """One daemon thread per worker process, beating until the process ends."""

    def __init__(self, cluster: str, every: float = BEAT_SECONDS) -> None:
        self.cluster = cluster
        self.every = every
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is not None:
            return
        self.thread = threading.Thread(target=self._run, name="tombstones-beat", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        first = True
        while not self.stopped.is_set():
            try:
                started(self.cluster) if first else beat(self.cluster)
                first = False
            except DatabaseError as exc:  # the database is down: the next beat tries again
                logger.warning("heartbeat not written (%s)", type(exc).__name__)
            finally:
                # Not held between beats: a database restart leaves nothing stale behind.
                connections.close_all()
            self.stopped.wait(self.every)
