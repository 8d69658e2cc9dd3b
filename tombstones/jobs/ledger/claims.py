"""Claims: a worker takes due lane heads (and their lanes' followers) under one lease.

Here because they share the claim token and the lease: taking, reading back, renewing,
holding and giving back are the statements about who holds a job, not what became of it
(:mod:`.outcomes`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, IntegrityError, models, router, transaction
from django.db.models import F, Value
from django.db.models.functions import Now
from django.utils import timezone

from ...conf import tombstone_settings
from ...logfields import jobs_fields
from .. import queries
from ..models import Job
from ..queues import known as known_queues
from ..states import Status
from . import heads, hint_floor, lanes

logger = logging.getLogger("tombstones")


def worker_id() -> str:
    """host:pid of this process (read each time: workers are forked)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(eq=False)
class Claim:
    """Jobs one worker took with one UPDATE: they share a token and a lease.

    Shared by the worker's thread, which runs the jobs, and the lease keeper's, which may give
    the jobs not started yet back while a slow one runs (:meth:`begin`, :func:`give_back`).
    """

    token: str
    worker: str
    using: str
    jobs: Sequence[Job]
    unclaimed: int = 0  # due lane heads seen and not taken (for the other workers)
    workers: int = 1  # worker processes of the cluster, as the claim saw them
    # The database's clock at the claim's look, and this process's monotonic clock then: events
    # are stamped in database time at the step they record, without asking the database again.
    clock: tuple[datetime, float] | None = None
    started: set[int] = field(default_factory=set)  # jobs whose turn came (worker thread)
    returned: set[int] = field(default_factory=set)  # jobs given back (keeper thread)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # No job's turn starts after this moment (this process's monotonic clock): the lease may
    # have run out by then, and another worker may have taken the jobs back. Moved forward by
    # each renewal; measured from before the statement that took or renewed the lease, minus a
    # margin, so it always comes before the lease's end in the database.
    deadline: float = math.inf
    expired: bool = False  # a turn was refused at the deadline: what is left goes back

    def extend(self, sent: float) -> None:
        """A renewal sent at ``sent`` (monotonic) succeeded."""
        with self.lock:
            self.deadline = max(self.deadline, sent + lease_margin())

    def db_now(self) -> datetime:
        """The database's time now, as read at the claim plus the time elapsed here since."""
        return _clock_now(self.clock) if self.clock is not None else timezone.now()

    @property
    def claimed_at(self) -> datetime:
        """When the claim was made (the database's clock at its look)."""
        return self.clock[0] if self.clock is not None else timezone.now()

    def begin(self, job_id: int) -> bool:
        """The worker starts this job's turn: False if it was given back meanwhile, or if the
        lease may have run out (a worker that stalled past its lease starts nothing more)."""
        with self.lock:
            if job_id in self.returned:
                return False
            if time.monotonic() > self.deadline:
                self.expired = True
                return False
            self.started.add(job_id)
            return True


def lease_margin() -> float:
    """How long after a lease is taken or renewed its holder may still start a job."""
    lease = tombstone_settings.LEASE.total_seconds()
    return lease - min(1.0, lease / 10)


def _clock_now(clock: tuple[datetime, float]) -> datetime:
    at, then = clock
    return at + timedelta(seconds=time.monotonic() - then)


def lease_until() -> Any:
    """The end of a lease taken or renewed now (database clock)."""
    return Now() + Value(tombstone_settings.LEASE)


def uncharged() -> dict[str, Any]:
    """A claim's hold on a job ends without counting: no token, its attempt given back, and its
    lane to be looked at again (the hint)."""
    return {"claim_token": "", "attempts": F("attempts") - 1, "ready_at": Now()}


def given_back() -> dict[str, Any]:
    """A claimed job goes back to its place in the queue, uncharged, its lease ended."""
    return {**uncharged(), "status": Status.QUEUED, "lease_expires_at": None}


def claim(
    limit: int,
    *,
    workers: int = 1,
    whole: bool = False,
    ids: Sequence[int] | None = None,
    using: str | None = None,
    queues: Sequence[str] | None = None,
) -> Claim | None:
    """Take due lane heads in one transaction (committed): running, leased, attempt + 1.

    The lanes looked at are those whose hints came due (:mod:`.heads`), locked on PostgreSQL so
    that claims at once take different lanes and none takes a lane while one of its enqueues is
    unfinished (:mod:`.lanes`). A ``whole`` claim (quick handlers: one worker running them in
    one transaction beats several splitting them) also reserves their lanes' next queued jobs
    (``limit`` jobs in all), and takes up to ``limit`` heads with no look first. Otherwise, with
    several workers, a count of the lanes with due hints first sizes this worker's share
    (1/``workers`` of them): slow handlers are worth the round trip, and the rest is left to a
    helper at once. A job whose last claim ended without an outcome (a crash) is taken alone, so
    that a job that kills its worker is told apart from its batch-mates. The unique running-lane
    index is the last word. Returns None when nothing is due.

    ``queues``: the lanes of these queues only (default: every queue; ``ids`` names its jobs
    whatever their queue).
    """
    db = using or router.db_for_write(Job)
    served = tuple(queues) if queues is not None else known_queues()
    if not served and ids is None:
        return None  # a cluster that serves no queue (logged by .queues)
    # Hints are read from this process's floor on (see .hint_floor).
    floor = hint_floor.current((db, served)) if ids is None else None
    seen = None
    size = limit
    if not whole and ids is None and workers > 1:
        seen = heads.due_lanes(limit * workers, using=db, floor=floor, queues=served)
        if not seen:
            return None
        size = max(1, min(limit, math.ceil(seen / workers)))
    token, wid = uuid.uuid4().hex, worker_id()
    sent = time.monotonic()  # the lease is taken after this moment
    scan = min(size * (max(workers, 1) + 1), heads.MAX_LANES)
    for _ in range(_LOOKS):
        try:
            with transaction.atomic(using=db):
                taken, picked, more = _take(
                    db, size, scan, token, wid, whole=whole, ids=ids, floor=floor, queues=served
                )
        except IntegrityError:
            # The unique running-lane index refused a second running job of a lane (a lane
            # without a row of its own, read by two claims at once): nothing was taken.
            return Claim(token, wid, db, [], unclaimed=1, workers=workers)
        if taken or not more or not picked.clear:
            break
        # Every lane looked at was held: the hints behind them may name free ones.
    if not taken:
        return None
    found = [job for job in taken if job.status == Status.RUNNING]
    # The database's clock at the claim: what the statement wrote as the jobs' start.
    at = cast(datetime, taken[0].started_at)
    clock = (at, time.monotonic())
    types = ContentType.objects.db_manager(db)
    oldest = at - tombstone_settings.JOB_MAX_AGE
    for job in taken:
        if job.content_type_id is not None:  # None: a plain job
            job.content_type = types.get_for_id(job.content_type_id)
        job.too_old = job.created_at < oldest  # type: ignore[attr-defined]
    taken.sort(key=place)
    claimed = Claim(token, wid, db, taken, workers=workers, clock=clock)
    claimed.deadline = sent + lease_margin()
    if seen is not None:
        claimed.unclaimed = max(0, seen - len(found))
    else:  # a full batch: more may be due, for the other workers (a hint, not a count)
        claimed.unclaimed = len(found) if len(found) >= size or picked.unclaimed else 0
    return claimed


# Looks of one claim at most when every lane it looked at was held (hints cleared each time:
# each look makes progress; the bound keeps one call short).
_LOOKS = 20


def _take(
    db: str,
    size: int,
    scan: int,
    token: str,
    wid: str,
    *,
    whole: bool,
    ids: Sequence[int] | None,
    floor: datetime | None,
    queues: Sequence[str],
) -> tuple[list[Job], heads.Picked, bool]:
    """One look, inside the claim's transaction: returns the jobs taken, the choice, and
    whether more hints of ``queues`` may be due than this look read (from ``floor`` on)."""
    keys, more, ended = heads.read_lanes(db, scan, ids, floor, queues)
    if not keys:
        return [], heads.Picked(), more
    count = size + 1 if whole and ids is None else 1
    options: dict[str, Any] = {"size": size, "whole": whole and ids is None, "ids": ids}
    fronts, hints = heads.read_lanes_jobs(db, keys, count, ended)
    guarded: set[str] | None = set() if lanes.guarded(db) else None
    picked = heads.pick(keys, fronts, hints, **options, guarded=guarded)
    if picked.guard and guarded is not None:
        # A delayed head: its lane's row first (no enqueue of the lane in flight), then the
        # lane as it is now.
        got, _ = lanes.take(db, picked.guard, len(picked.guard), wait=ids is not None)
        if got:
            more_fronts, more_hints = heads.read_lanes_jobs(db, got, count, ended)
            fronts.update(more_fronts)
            hints.update(more_hints)
            guarded.update(got)
            picked = heads.pick(keys, fronts, hints, **options, guarded=guarded)
    if lanes.guarded(db):
        # Every head there is to take, then as many as this claim can hold (see heads.lock).
        every = heads.pick(
            keys, fronts, hints, **{**options, "size": len(keys) * (size + 1)}, guarded=guarded
        )
        held = heads.lock(db, every, size)
        if held is not None:
            picked = heads.pick(keys, fronts, hints, **options, held=held, guarded=guarded)
    taken: list[Job] = []
    if picked.ids:
        took = heads.take(
            db, [f.id for f in picked.heads], [f.id for f in picked.followers], token, wid
        )
        taken = _with_their_heads(db, took)
    heads.settle_hints(db, picked)
    return taken, picked, more


def _with_their_heads(db: str, taken: list[Job]) -> list[Job]:
    """What the claim took, less any follower whose lane's head it did not take (none can be:
    the rows were locked and checked before. Should one be, it goes back at once, before the
    claim commits, rather than run ahead of its head)."""
    led = {job.lane for job in taken if job.status == Status.RUNNING}
    stray = [job.pk for job in taken if job.lane not in led]
    if not stray:
        return taken
    logger.error(
        "a claim took %s follower(s) without their lane's head; they go back",
        len(stray),
        extra=jobs_fields(stray),
    )
    Job.objects.using(db).filter(pk__in=stray).update(**uncharged())
    return [job for job in taken if job.pk not in stray]


def place(job: Job) -> tuple[Any, int]:
    """The job's place in its lane: lane order is (queued_at, id)."""
    return (job.queued_at, job.pk)


def give_back(claim: Claim) -> list[int]:
    """From the lease keeper, while a slow job holds the claim: the jobs whose turn has not come
    go back to the queue, uncharged, for the other workers (the worker thread then skips them).

    Its own connection: the worker's transaction holds none of these rows.
    """
    with claim.lock:
        ids = [job.pk for job in claim.jobs if job.pk not in claim.started | claim.returned]
        if not ids:
            return []
        try:
            mine(claim, ids).update(**given_back())
        except DatabaseError as exc:
            logger.warning("could not give back the jobs of a slow claim (%s)", type(exc).__name__)
            return []
        claim.returned.update(ids)
    return ids


def renew(tokens: Iterable[str], *, using: str | None = None) -> int:
    """Push the leases of these claims forward (database clock); the number renewed."""
    tokens = list(tokens)
    if not tokens:
        return 0
    held = Job.objects.using(using).filter(claim_token__in=tokens, status=Status.RUNNING)
    return held.update(lease_expires_at=lease_until())


def holds_any(token: str, *, using: str | None = None) -> bool:
    """True while the claim holds a job (running, or a lane follower it reserved)."""
    return Job.objects.using(using).filter(queries.held_by(token)).exists()


def mine(claim: Claim, ids: Sequence[int]) -> models.QuerySet[Job]:
    """These jobs, as long as the claim still holds them: every write of a claim goes through it."""
    return Job.objects.using(claim.using).filter(queries.held_by(claim.token), pk__in=list(ids))
