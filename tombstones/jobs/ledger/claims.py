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
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, models, router, transaction
from django.db.models import BooleanField, Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.functions import Now
from django.utils import timezone

from ...conf import tombstone_settings
from .. import queries
from ..models import Job
from ..states import SUSPECT, Status

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
    left: int = 0  # due lane heads seen and not taken (for the other workers)
    workers: int = 1  # worker processes of the cluster, as the claim saw them
    # The database's clock at the claim's look, and this process's monotonic clock then: events
    # are stamped in database time at the step they record, without asking the database again.
    clock: tuple[datetime, float] | None = None
    started: set[int] = field(default_factory=set)  # jobs whose turn came (worker thread)
    returned: set[int] = field(default_factory=set)  # jobs given back (keeper thread)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def db_now(self) -> datetime:
        """The database's time now, as read at the claim plus the time elapsed here since."""
        return _clock_now(self.clock) if self.clock is not None else timezone.now()

    @property
    def claimed_at(self) -> datetime:
        """When the claim was made (the database's clock at its look)."""
        return self.clock[0] if self.clock is not None else timezone.now()

    def begin(self, job_id: int) -> bool:
        """The worker starts this job's turn: False if it was given back meanwhile."""
        with self.lock:
            if job_id in self.returned:
                return False
            self.started.add(job_id)
            return True


def _clock_now(clock: tuple[datetime, float]) -> datetime:
    at, then = clock
    return at + timedelta(seconds=time.monotonic() - then)


def lease_until() -> Any:
    return Now() + Value(tombstone_settings.LEASE)


def uncharged() -> dict[str, Any]:
    """A claim's hold on a job ends without counting: no token, its attempt given back."""
    return {"claim_token": "", "attempts": F("attempts") - 1}


def given_back() -> dict[str, Any]:
    """A claimed job goes back to its place in the queue, uncharged, its lease ended."""
    return {**uncharged(), "status": Status.QUEUED, "lease_expires_at": None}


def _too_old() -> Case:
    return Case(When(queries.too_old(), then=True), default=False, output_field=BooleanField())


def claim(
    limit: int,
    *,
    workers: int = 1,
    whole: bool = False,
    ids: Sequence[int] | None = None,
    using: str | None = None,
) -> Claim | None:
    """Take due lane heads with one conditional UPDATE (committed): running, leased, attempt + 1.

    Looks first without a lock (an idle wake-up takes none; on SQLite the write lock is the
    database's), then takes up to ``limit`` of them: this worker's share (1/``workers`` of what
    it saw) unless ``whole``. A job whose last claim ended without an outcome (a crash) is taken
    alone, so that a job that kills its worker is told apart from its batch-mates. The UPDATE
    repeats every condition, and the unique running-lane index is the last word. A ``whole``
    claim also reserves its lanes' next queued jobs in the same statement (:func:`_followers`).
    Returns None when nothing is due.
    """
    db = using or router.db_for_write(Job)
    rows = Job.objects.using(db).select_related("content_type").annotate(too_old=_too_old())
    heads = rows.claimable()
    if ids is not None:
        heads = heads.filter(pk__in=list(ids))
    if whole and ids is None:
        # Whether the lane has a job queued behind: only then look for followers.
        behind = Job.objects.filter(lane=OuterRef("lane"), status=Status.QUEUED).exclude(
            pk=OuterRef("pk")
        )
        heads = heads.annotate(more=Exists(behind))
    looked = heads.annotate(db_now=Now()).order_by("queued_at", "id")
    seen: list[Job] = list(looked[: limit * max(workers, 1)])
    if not seen:
        return None
    clock = (seen[0].db_now, time.monotonic())  # type: ignore[attr-defined]
    if _suspect(seen[0]):
        chosen = seen[:1]
    else:
        share = limit if whole else max(1, min(limit, math.ceil(len(seen) / max(workers, 1))))
        chosen = [job for job in seen if not _suspect(job)][:share]
    followers = _followers(rows, chosen, limit) if whole and ids is None else []
    token, wid = uuid.uuid4().hex, worker_id()
    head_ids = [job.pk for job in chosen]
    mine = [*head_ids, *(job.pk for job in followers)]
    # One statement claims the heads (running, leased) and reserves their lanes' followers
    # (queued, this token; nobody else can take them while their head holds the lane).
    take = Job.objects.using(db).filter(
        (Q(pk__in=head_ids) & queries.claimable())
        | Q(pk__in=[job.pk for job in followers], status=Status.QUEUED)
        & queries.unclaimed()
        & ~Q(queries.ahead(exclude=mine))
    )
    is_head = Q(pk__in=head_ids)
    values = {
        "status": Case(When(is_head, then=Value(Status.RUNNING)), default=F("status")),
        "lease_expires_at": Case(When(is_head, then=lease_until()), default=None),
        "owner": wid,
        "claim_token": token,
        "attempts": F("attempts") + 1,
        "started_at": Now(),
        "sending_at": None,
    }
    try:
        # One statement, no transaction of its own. Its row (owner, started_at) is the record of
        # the claim: the ``claimed`` event is written with the outcome, or by the take-back when
        # the worker died without one.
        matched = _update(db, take, values)
    except IntegrityError:
        # The unique running-lane index refused a second running job of a lane: look again.
        return Claim(token, wid, db, [], left=len(seen), workers=workers, clock=clock)
    if matched == len(mine):
        for job in chosen:
            job.status = Status.RUNNING
        jobs = [*chosen, *followers]
        for job in jobs:
            job.claim_token, job.owner = token, wid
            job.attempts += 1
    else:  # another worker took some of them meanwhile
        jobs = _read_back(rows, token, db)
    return Claim(
        token,
        wid,
        db,
        sorted(jobs, key=_place),
        left=len(seen) - sum(job.status == Status.RUNNING for job in jobs),
        workers=workers,
        clock=clock,
    )


def _followers(rows: Any, heads: Sequence[Job], limit: int) -> list[Job]:
    """The next queued jobs of the heads' lanes (at most ``limit``): lane followers.

    A follower stays ``queued`` (a lane has one running job, its head) with the claim's token and
    one more attempt, and runs in its head's group, after it, on the record as the head left it.
    Its outcome is recorded with the others'; if its turn does not come, it is given back.
    """
    if not heads or _suspect(heads[0]):
        return []
    lanes = {job.lane for job in heads if not job.external and getattr(job, "more", False)}
    if not lanes:
        return []
    queued = rows.filter(
        queries.due(), lane__in=lanes, status=Status.QUEUED, external=False
    ).exclude(reason__in=SUSPECT)  # a suspect is claimed alone
    return list(queued.exclude(pk__in=[j.pk for j in heads]).order_by("queued_at", "id")[:limit])


def _read_back(rows: Any, token: str, db: str) -> list[Job]:
    """What a partly matched claim took; followers whose head it did not get go back."""
    jobs = list(rows.filter(queries.held_by(token)))
    led = {job.lane for job in jobs if job.status == Status.RUNNING}
    stray = [job.pk for job in jobs if job.status == Status.QUEUED and job.lane not in led]
    if stray:
        followers = Job.objects.using(db).filter(queries.followers_of(token), pk__in=stray)
        followers.update(**uncharged())
    return [job for job in jobs if job.pk not in stray]


def _update(db: str, qs: Any, values: dict[str, Any]) -> int:
    if connections[db].in_atomic_block:
        with transaction.atomic(using=db):  # a savepoint: the caller's transaction survives
            return int(qs.update(**values))
    return int(qs.update(**values))  # one statement in autocommit: no BEGIN/COMMIT


def _place(job: Job) -> tuple[Any, int]:
    return (job.queued_at, job.pk)


# Reasons of a job whose last claim ended without an outcome.
def _suspect(job: Job) -> bool:
    return job.reason in SUSPECT


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
