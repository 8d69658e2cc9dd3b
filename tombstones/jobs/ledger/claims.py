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
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery
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
    claim reserves their lanes' next queued jobs in the same statement (:func:`_followers`).
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
        due = Job.objects.using(db).claimable().order_by().values("id")[: limit * workers]
        seen = Job.objects.using(db).filter(pk__in=due).count()
        if not seen:
            return None
        size = max(1, min(limit, math.ceil(seen / workers)))
    token, wid = uuid.uuid4().hex, worker_id()
    sql, params = _statement(db, size, token, wid, whole=whole and ids is None, ids=ids)
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


# The claim statement by (database, size, whole, lease), compiled once per process: building it
# through the ORM costs more than running it. The token and the worker are filled in per claim.
_compiled_claims: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}
_TOKEN, _WORKER = "\x00token", "\x00worker"


def _statement(
    db: str, size: int, token: str, wid: str, *, whole: bool, ids: Sequence[int] | None
) -> tuple[str, tuple[Any, ...]]:
    if ids is not None:
        return _claim_sql(db, size, token, wid, whole=whole, ids=ids)
    key = (db, connections[db].vendor, size, whole, tombstone_settings.LEASE)
    if key not in _compiled_claims:
        if len(_compiled_claims) > 64:  # sizes follow the settings: a handful in practice
            _compiled_claims.clear()
        compiled = _claim_sql(db, size, _TOKEN, _WORKER, whole=whole, ids=None)
        if compiled[1].count(_TOKEN) != 1 or compiled[1].count(_WORKER) != 1:
            raise RuntimeError("the claim statement does not take its token as a parameter")
        _compiled_claims[key] = compiled
    sql, params = _compiled_claims[key]
    filled = {_TOKEN: token, _WORKER: wid}
    return sql, tuple(filled.get(p, p) if isinstance(p, str) else p for p in params)


def _claim_sql(
    db: str, size: int, token: str, wid: str, *, whole: bool, ids: Sequence[int] | None
) -> tuple[str, tuple[Any, ...]]:
    """The claim statement: ``WITH heads, followers UPDATE ... RETURNING *``.

    Built from the ORM's own conditions (:mod:`..queries`), compiled for ``db``; the CTEs are
    materialized so that the heads are picked (and on PostgreSQL locked) once.
    """
    conn = connections[db]
    heads = Job.objects.using(db).filter(queries.claimable())
    if ids is not None:
        heads = heads.filter(pk__in=list(ids))
    heads_sql, heads_params = _compiled(heads.order_by("queued_at", "id").values("id")[:size], db)
    if conn.features.has_select_for_update_skip_locked:
        # Heads another claim is taking right now are skipped, not waited for.
        heads_sql += " FOR UPDATE SKIP LOCKED"
    ctes = [f'"claim_heads" AS MATERIALIZED ({heads_sql})']
    params: list[Any] = [*heads_params]
    is_head = Q(pk__in=RawSQL('SELECT "id" FROM "claim_heads"', ()))
    taken = is_head
    if whole:
        followers_sql, followers_params = _compiled(_followers(db, size), db)
        ctes.append(f'"claim_followers" AS MATERIALIZED ({followers_sql})')
        params += followers_params
        # A follower stays queued (its head holds the lane), with the claim's token; the
        # conditions repeated here are checked again on a row another statement changed. One
        # IN over both sets, so that the rows are found by their keys, not by a scan.
        both = 'SELECT "id" FROM "claim_heads" UNION ALL SELECT "id" FROM "claim_followers"'
        taken = Q(pk__in=RawSQL(both, ())) & (
            is_head | Q(queries.unclaimed(), status=Status.QUEUED)
        )
    values = {
        "status": Case(When(is_head, then=Value(Status.RUNNING)), default=F("status")),
        "lease_expires_at": Case(When(is_head, then=lease_until()), default=None),
        "owner": wid,
        "claim_token": token,
        "attempts": F("attempts") + 1,
        "started_at": Now(),
        "sending_at": None,
    }
    query = cast(UpdateQuery, Job.objects.using(db).filter(taken).query.chain(UpdateQuery))
    query.add_update_values(values)
    update_sql, update_params = query.get_compiler(db).as_sql()
    sql = f"WITH {', '.join(ctes)} {update_sql} RETURNING *"
    return sql, (*params, *update_params)


def _followers(db: str, limit: int) -> Any:
    """The next queued jobs of the heads' lanes (at most ``limit``): lane followers.

    A follower stays ``queued`` (a lane has one running job, its head) with the claim's token and
    one more attempt, and runs in its head's group, after it, on the record as the head left it.
    Its outcome is recorded with the others'; if its turn does not come, it is given back.
    Only an unbroken run behind the head: no job it must wait for (an external or suspect
    job, one reserved or not due) is queued before it. Ordered by place and cut at ``limit``,
    each lane's followers are the first of its queue.
    """
    heads = RawSQL('SELECT "id" FROM "claim_heads"', ())
    candidate = (
        queries.due()
        & queries.unclaimed()
        & Q(status=Status.QUEUED, external=False)
        & ~Q(reason__in=SUSPECT)
    )
    blocker = (
        Job.objects.filter(
            queries.placed_before(OuterRef("queued_at"), OuterRef("id")),
            lane=OuterRef("lane"),
            status=Status.QUEUED,
        )
        .exclude(pk__in=heads)
        .exclude(candidate)
    )
    # Not behind an external head (internal jobs run first: they would overtake it), nor a
    # suspect one (it runs alone).
    lanes = (
        Job.objects.filter(pk__in=heads, external=False).exclude(reason__in=SUSPECT).values("lane")
    )
    # The first ``limit`` candidates first, then the blocker test on those only: tested on
    # every queued job of a long lane, it would read the lane once per job.
    first = (
        Job.objects.filter(candidate, lane__in=lanes)
        .exclude(pk__in=heads)
        .order_by("queued_at", "id")
        .values("id")[:limit]
    )
    return Job.objects.using(db).filter(pk__in=first).exclude(Exists(blocker)).values("id")


def _compiled(qs: Any, db: str) -> tuple[str, tuple[Any, ...]]:
    sql, params = qs.query.get_compiler(db).as_sql()
    return sql, tuple(params)


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
