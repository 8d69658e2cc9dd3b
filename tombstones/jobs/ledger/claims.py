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
    BooleanField,
    Case,
    Count,
    ExpressionWrapper,
    F,
    IntegerField,
    Min,
    Q,
    RowRange,
    Sum,
    Value,
    When,
    Window,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from ...conf import tombstone_settings
from .. import queries
from ..models import Job
from ..states import HOLDING, SUSPECT, UNFINISHED, Status

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
        seen = due_heads(limit * workers, using=db)
        if not seen:
            return None
        size = max(1, min(limit, math.ceil(seen / workers)))
    token, wid = uuid.uuid4().hex, worker_id()
    sql, params = _statement(
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


# The claim statement by (database, size, reach, whole, lease), compiled once per process:
# building it through the ORM costs more than running it. The token and the worker are filled
# in per claim.
_compiled_claims: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}
_TOKEN, _WORKER = "\x00token", "\x00worker"


def _statement(
    db: str,
    size: int,
    token: str,
    wid: str,
    *,
    whole: bool,
    ids: Sequence[int] | None,
    workers: int = 1,
) -> tuple[str, tuple[Any, ...]]:
    if ids is not None:
        return _claim_sql(db, size, token, wid, whole=whole, ids=ids)
    # The lanes a claim looks into: enough for every worker claiming at once to find heads of
    # its own (SKIP LOCKED passes over the others'), and some held ones.
    reach = size * (max(workers, 1) + 1)
    key = (db, connections[db].vendor, size, reach, whole, tombstone_settings.LEASE)
    if key not in _compiled_claims:
        if len(_compiled_claims) > 64:  # sizes follow the settings: a handful in practice
            _compiled_claims.clear()
        compiled = _claim_sql(db, size, _TOKEN, _WORKER, whole=whole, ids=None, reach=reach)
        if compiled[1].count(_TOKEN) != 1 or compiled[1].count(_WORKER) != 1:
            raise RuntimeError("the claim statement does not take its token as a parameter")
        _compiled_claims[key] = compiled
    sql, params = _compiled_claims[key]
    filled = {_TOKEN: token, _WORKER: wid}
    return sql, tuple(filled.get(p, p) if isinstance(p, str) else p for p in params)


def _claim_sql(
    db: str,
    size: int,
    token: str,
    wid: str,
    *,
    whole: bool,
    ids: Sequence[int] | None,
    reach: int | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """The claim statement: ``WITH lanes, heads, followers UPDATE ... RETURNING *``.

    ``claim_lanes`` reads the unfinished jobs once, in lane order, and numbers them (window
    functions): who holds each lane, each queued job's place in its lane's queue. The heads and
    the followers are picked from it, so that the plan is one pass over the unfinished jobs
    whatever the planner's statistics say (correlated lookups per job, planned on statistics
    taken before a backlog arrived, read a lane once per job). The CTEs are materialized so that
    the heads are picked (and on PostgreSQL locked) once.
    """
    conn = connections[db]
    lanes_sql, params = _lanes_sql(db, reach if ids is None else None)
    ctes = [f'"claim_lanes" AS MATERIALIZED ({lanes_sql})']
    # Every head (no limit here: the limit applies after the lock, so that the heads other
    # claims are taking at this moment are skipped and the next ones taken instead).
    picked = _picked_sql(None, ids)
    # The row's own conditions again: on PostgreSQL they are checked on the row as it is when
    # locked (another worker may have taken it since this statement's snapshot).
    heads = Job.objects.using(db).filter(
        queries.due(), queries.unclaimed(), pk__in=RawSQL(picked, ())
    )
    heads_sql, heads_params = _compiled(heads.order_by("queued_at", "id").values("id")[:size], db)
    if conn.features.has_select_for_update_skip_locked:
        # Heads another claim is taking right now are skipped, not waited for.
        heads_sql += " FOR UPDATE SKIP LOCKED"
    ctes.append(f'"claim_heads" AS MATERIALIZED ({heads_sql})')
    params = (*params, *heads_params)
    is_head = Q(pk__in=RawSQL('SELECT "id" FROM "claim_heads"', ()))
    taken = is_head
    if whole:
        ctes.append(f'"claim_followers" AS MATERIALIZED ({_followers_sql(size)})')
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


def _picked_sql(size: int | None, ids: Sequence[int] | None = None) -> str:
    """Up to ``size`` lane heads from ``claim_lanes``, in lane order: a queued job first in its
    lane's queue in a lane nobody holds, or a job waiting to be retried that holds its lane
    alone (:func:`..queries.lane_head`, by numbers), due and not reserved."""
    where_ids = ""
    if ids is not None:
        where_ids = f' AND "id" IN ({", ".join(str(int(pk)) for pk in ids)})'
    return (
        'SELECT "id" FROM "claim_lanes" WHERE "is_due" AND "claim_token" = \'\' AND ('
        f'("status" = \'{Status.QUEUED}\' AND "holders" = 0 AND "place" = 1) OR '
        f'("status" = \'{Status.RETRY_WAIT}\' AND "holders" = 1)){where_ids}'
        + (f' ORDER BY "queued_at", "id" LIMIT {int(size)}' if size else "")
    )


def due_heads(limit: int, *, using: str) -> int:
    """How many lane heads are due (at most ``limit``): one pass over the unfinished jobs."""
    lanes_sql, params = _lanes_sql(using, limit)
    sql = f'WITH "claim_lanes" AS ({lanes_sql}) SELECT COUNT(*) FROM ({_picked_sql(limit)}) "p"'
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0])


def _lanes_sql(db: str, reach: int | None) -> tuple[str, tuple[Any, ...]]:
    """Every unfinished job of the first ``reach`` lanes (all lanes if None) with its lane's
    numbers: ``holders`` (running, retry_wait, paused jobs of its lane), ``place`` (a queued
    job's place in its lane's queue), ``is_due`` and ``candidate`` (a job that may follow its
    lane's head in a claim).

    The first lanes: those with a due, unreserved job and no running or paused one, in the
    order of their earliest such job (one grouped pass, hashed lookups). Only their jobs are
    numbered: the claim's cost follows the lanes it may take from, not the whole backlog.
    """
    holding = Case(When(status__in=HOLDING, then=1), default=0, output_field=IntegerField())
    candidate = ExpressionWrapper(
        queries.due()
        & queries.unclaimed()
        & Q(status=Status.QUEUED, external=False)
        & ~Q(reason__in=SUSPECT),
        output_field=BooleanField(),
    )
    unfinished = Job.objects.using(db).filter(status__in=UNFINISHED)
    if reach is not None:
        stopped = Job.objects.filter(status__in=[Status.RUNNING, Status.PAUSED]).values("lane")
        first = (
            Job.objects.filter(queries.due(), queries.unclaimed())
            .exclude(lane__in=stopped)
            .values("lane")
            .annotate(first_at=Min("queued_at"), first_id=Min("id"))
            .order_by("first_at", "first_id")
            .values("lane")[:reach]
        )
        unfinished = unfinished.filter(lane__in=first)
    rows = (
        unfinished.annotate(
            is_due=ExpressionWrapper(queries.due(), output_field=BooleanField()),
            candidate=candidate,
            holders=Window(Sum(holding), partition_by=[F("lane")]),
            # Queued jobs of the lane so far, in lane order: a queued job's place in its
            # lane's queue. Both windows read the lane in the lane index's order: no sort.
            place=Window(
                Count("id", filter=Q(status=Status.QUEUED)),
                partition_by=[F("lane")],
                order_by=[F("queued_at").asc(), F("id").asc()],
                frame=RowRange(start=None, end=0),
            ),
        )
        .order_by()
        .values(
            "id",
            "lane",
            "status",
            "queued_at",
            "claim_token",
            "external",
            "reason",
            "is_due",
            "candidate",
            "holders",
            "place",
        )
    )
    return _compiled(rows, db)


def _followers_sql(limit: int) -> str:
    """The next queued jobs of the heads' lanes (at most ``limit``): lane followers.

    A follower stays ``queued`` (a lane has one running job, its head) with the claim's token and
    one more attempt, and runs in its head's group, after it, on the record as the head left it.
    Its outcome is recorded with the others'; if its turn does not come, it is given back.
    Only an unbroken run behind the head: no queued job it must wait for (an external or
    suspect job, one reserved or not due) comes before it in its lane (``block``: the first
    such place). Not behind an external head (internal jobs run first: they would overtake it),
    nor a suspect one (it runs alone). Ordered by place and cut at ``limit``, each lane's
    followers are the first of its queue.
    """
    queued = Status.QUEUED
    suspect = ", ".join(f"'{reason}'" for reason in SUSPECT)
    # Per lane: the first place a follower may not pass, and whether a head that may lead
    # followers (internal, not suspect) was taken in it. Hashed lookups into claim_heads, so
    # that the plan stays one pass.
    lanes = (
        'SELECT "id", "status", "queued_at", "candidate", "place", '
        f'MIN(CASE WHEN "status" = \'{queued}\' AND NOT "candidate" THEN "place" END) '
        'OVER (PARTITION BY "lane") AS "block", '
        'MAX(CASE WHEN "id" IN (SELECT "id" FROM "claim_heads") AND NOT "external" '
        f'AND "reason" NOT IN ({suspect}) THEN 1 ELSE 0 END) OVER (PARTITION BY "lane") AS "led" '
        'FROM "claim_lanes"'
    )
    return (
        f'SELECT "id" FROM ({lanes}) "queue" WHERE "status" = \'{queued}\' AND "candidate" '
        'AND "led" = 1 AND ("block" IS NULL OR "place" < "block") '
        'AND "id" NOT IN (SELECT "id" FROM "claim_heads") '
        f'ORDER BY "queued_at", "id" LIMIT {int(limit)}'
    )


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
