"""Claims: a worker takes due lane heads (and their lanes' followers) under one lease.

Here because they share the claim token and the lease: taking, reading back, renewing,
holding and giving back are the statements about who holds a job, not what became of it
(:mod:`.outcomes`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, IntegrityError, connections, models, router, transaction
from django.db.models import (
    F,
)
from django.utils import timezone

from ...conf import tombstone_settings
from .. import queries
from ..models import Job
from ..states import SUSPECT, Status
from .claim_statement import due_heads, lease_until, statement

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


def uncharged() -> dict[str, Any]:
    """A claim's hold on a job ends without counting: no token, its attempt given back."""
    return {"claim_token": "", "attempts": F("attempts") - 1}


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
) -> Claim | None:
    """Take due lane heads with one statement (committed): running, leased, attempt + 1.

    The statement picks the heads (on PostgreSQL ``FOR UPDATE SKIP LOCKED``, so workers
    claiming at once take different heads instead of waiting on each other), and a ``whole``
    claim reserves their lanes' next queued jobs in the same statement (:func:`_followers_sql`).
    A ``whole`` claim (quick handlers: one worker running them in one transaction beats several
    splitting them) takes up to ``limit`` heads with no look first. Otherwise, with several
    workers, a count of the due heads first sizes this worker's share (1/``workers`` of them):
    slow handlers are worth the round trip, and the rest is left to a helper at once. A job
    whose last claim ended without an outcome (a crash) is kept alone, so that a job that kills
    its worker is told apart from its batch-mates. The unique running-lane index is the last
    word. Returns None when nothing is due.
    """
    db = using or router.db_for_write(Job)
    seen = None
    size = limit
    if not whole and ids is None and workers > 1:
        seen = due_heads(limit * workers, using=db)
        if not seen:
            return None
        size = max(1, min(limit, math.ceil(seen / workers)))
    token, wid = uuid.uuid4().hex, worker_id()
    sql, params = statement(
        db, size, token, wid, whole=whole and ids is None, ids=ids, workers=workers
    )
    try:
        with _savepoint(db):
            taken = list(Job.objects.db_manager(db).raw(sql, params))
    except IntegrityError:
        # The unique running-lane index refused a second running job of a lane (two claims
        # read the lane at once): nothing was taken, look again.
        return Claim(token, wid, db, [], left=1, workers=workers)
    heads = [job for job in taken if job.status == Status.RUNNING]
    if not heads:
        return None
    # The database's clock at the claim: what the statement wrote as the heads' start.
    at = cast(datetime, heads[0].started_at)
    clock = (at, time.monotonic())
    types = ContentType.objects.db_manager(db)
    oldest = at - tombstone_settings.JOB_MAX_AGE
    for job in taken:
        job.content_type = types.get_for_id(job.content_type_id)
        job.too_old = job.created_at < oldest  # type: ignore[attr-defined]
    taken.sort(key=_place)
    claimed = Claim(token, wid, db, taken, workers=workers, clock=clock)
    suspects = [job for job in heads if _suspect(job)]
    if suspects and len(taken) > 1:
        # A job whose last claim crashed runs alone: the rest go back, uncharged, in one
        # statement (rare: only after a crash).
        alone = min(suspects, key=_place)
        mine(claimed, [job.pk for job in taken if job is not alone]).update(**given_back())
        claimed.jobs = [alone]
        return claimed
    if seen is not None:
        claimed.left = max(0, seen - len(heads))
    else:  # a full batch: more may be due, for the other workers (a hint, not a count)
        claimed.left = len(heads) if len(heads) >= size else 0
    return claimed


@contextlib.contextmanager
def _savepoint(db: str) -> Iterator[None]:
    """One statement in autocommit (no BEGIN/COMMIT); a savepoint inside a caller's transaction,
    so that a refused claim leaves that transaction usable."""
    if connections[db].in_atomic_block:
        with transaction.atomic(using=db):
            yield
    else:
        yield


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
