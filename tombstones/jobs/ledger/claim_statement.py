"""The claim statement: one ``WITH claim_lanes, claim_heads, claim_followers UPDATE ...
RETURNING *`` that picks due lane heads and their followers and takes them.

Apart from :mod:`.claims` (who holds a job) because it is the engine's one hand-written piece of
SQL around the ORM's compiled conditions (:mod:`..queries`): window functions number the lanes,
so that its plan is one pass whatever the planner's statistics say.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from django.db import connections
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

from ...conf import tombstone_settings
from .. import queries
from ..models import Job
from ..states import HOLDING, SUSPECT, UNFINISHED, Status


def lease_until() -> Any:
    return Now() + Value(tombstone_settings.LEASE)


# The claim statement by (database, size, reach, whole, lease), compiled once per process:
# building it through the ORM costs more than running it. The token and the worker are filled
# in per claim.
_compiled_claims: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}
_TOKEN, _WORKER = "\x00token", "\x00worker"


def statement(
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
