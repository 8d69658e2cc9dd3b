"""Which jobs a claim takes: the lanes its hints name, each lane's first jobs, the choice.

A lane's head is its first unfinished job in lane order, (queued_at, id), if a worker may take
it now: queued or waiting to be retried, due, and not reserved by another claim. Anything else
first in line (a running, paused or reserved job, or one not due yet) holds the lane: nothing
of it is taken. So no later job can pass an earlier one, whatever took the earlier one back or
gave it away.

The claim does not search the backlog for heads. Every change of a job's state leaves a hint on
its row (``ready_at``: look at this lane from then on), and a claim looks only at the lanes of
the hints that came due, in the queues its worker serves (one range of the hint index each): a
lane held by a running, paused or retry-waiting job costs nothing until that job moves on (a
retry's hint comes due with it). The hints of a lane the claim looked at are cleared, except
those of a head it could not take (its batch was full, another claim holds it), which the next
claim sees first.

:func:`pick` makes the choice from what was read (no SQL); :func:`read_lanes`,
:func:`read_lanes_jobs`, :func:`lock`, :func:`take` and :func:`settle_hints` are its statements.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from django.db import connections
from django.db.models import BooleanField, Case, ExpressionWrapper, F, Q, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery

from ...conf import tombstone_settings
from .. import queries
from ..models import Job
from ..queues import DEFAULT
from ..states import CLAIMABLE, SUSPECT, UNFINISHED, Status
from . import hint_floor, priorities, reading

# The most hints of a lane one claim clears (a burst of enqueues into one lane: the rest go to
# the next claims, a bounded statement each).
HINTS_PER_LANE = 1000


@dataclass(frozen=True)
class Front:
    """One of the first unfinished jobs of a lane, as the claim read it."""

    id: int
    lane: str
    status: str
    claim_token: str
    external: bool
    reason: str
    due: bool
    queued_at: datetime
    ready_at: datetime | None
    run_after: datetime
    delayed: bool = False  # placed by its due time, not its enqueue (see .lanes)

    @property
    def reserved(self) -> bool:
        """Held by a claim (a running head, or a follower it reserved)."""
        return self.claim_token != ""

    @property
    def claimable(self) -> bool:
        return self.status in CLAIMABLE and not self.reserved and self.due

    @property
    def waits(self) -> bool:
        """First in line, but not due yet (a delayed job, a retry): its own hint says when."""
        return self.status in CLAIMABLE and not self.reserved and not self.due

    @property
    def suspect(self) -> bool:
        """Its last claim ended without an outcome: it runs alone."""
        return self.reason in SUSPECT

    @property
    def may_lead(self) -> bool:
        """A head that followers may run behind, in its group (internal, not suspect)."""
        return not self.external and not self.suspect

    @property
    def may_follow(self) -> bool:
        return self.status == Status.QUEUED and self.claimable and self.may_lead


Hint = tuple[int, datetime]  # a hinted job of a lane, and its hint as read


@dataclass
class Picked:
    """What a claim takes, and what becomes of the hints it read."""

    heads: list[Front] = field(default_factory=list)
    followers: list[Front] = field(default_factory=list)
    clear: list[Hint] = field(default_factory=list)  # looked at: cleared
    rearm: list[int] = field(default_factory=list)  # first in line, not due: hint at its time
    guard: list[str] = field(default_factory=list)  # a delayed head: take its lane's row first
    unclaimed: int = 0  # lanes with a head this claim leaves to the next (full, or kept alone)

    @property
    def ids(self) -> list[int]:
        return [f.id for f in self.heads] + [f.id for f in self.followers]


def pick(
    lanes: Sequence[str],
    fronts: dict[str, list[Front]],
    hints: dict[str, list[Hint]],
    *,
    size: int,
    whole: bool,
    ids: Iterable[int] | None = None,
    held: set[int] | None = None,
    guarded: set[str] | None = None,
) -> Picked:
    """The heads (at most ``size``, lanes in the order given) and, for a ``whole`` claim, their
    lanes' followers (as many as the heads leave room for in ``size``, earliest places first:
    each lane's unbroken run of queued internal jobs behind an internal head).

    ``ids``: only these jobs may be heads (the race fixture). ``held``: the jobs the claim could
    lock (PostgreSQL); a head it could not lock is not taken and its lane's hints stay for the
    next look, and a lane's followers stop at the first it could not lock. A suspect head (its
    last claim ended without an outcome) is taken alone, or left for the next claim to take
    alone.

    ``guarded``: the lanes whose row the claim holds (None: the database needs no such lock).
    A delayed head elsewhere is not taken: its lane goes to ``guard``, to be locked and read
    again first (:mod:`.lanes`).
    """
    wanted = set(ids) if ids is not None else None
    out = Picked()
    runs: list[Front] = []
    for lane in lanes:
        queue = fronts.get(lane, [])
        first = queue[0] if queue else None
        lane_hints = hints.get(lane, [])
        if first is None or not (first.claimable or first.waits):
            out.clear += lane_hints  # empty, or held: its holder's next change hints again
            continue
        if first.waits:
            out.clear += [h for h in lane_hints if h[0] != first.id]
            if first.ready_at != first.run_after:
                out.rearm.append(first.id)
            continue
        if wanted is not None and first.id not in wanted:
            continue
        if held is not None and first.id not in held:
            continue  # another transaction holds it: its hints stay for the next look
        if first.delayed and guarded is not None and lane not in guarded:
            out.guard.append(lane)
            continue
        if len(out.heads) >= size or (first.suspect and out.heads):
            out.unclaimed += 1
            continue
        out.heads.append(first)
        out.clear += lane_hints
        if first.suspect:
            break  # alone
        if whole and first.may_lead:
            for job in queue[1:]:
                if not job.may_follow or (held is not None and job.id not in held):
                    break
                runs.append(job)
    if whole:
        # Heads and followers together at most ``size``: a claim as large as the group that
        # runs it, none of its followers given back unstarted for want of room.
        room = max(0, size - len(out.heads))
        by_place = sorted(runs, key=lambda f: (f.queued_at, f.id))[:room]
        # A lane's run sorted by place is cut to a prefix: no follower skips an earlier one.
        out.followers = by_place
    mine = set(out.ids)  # the statement that takes them clears their hints
    out.clear = [h for h in out.clear if h[0] not in mine]
    return out


# --- statements -------------------------------------------------------------------------------


def read_lanes(
    db: str,
    scan: int,
    ids: Sequence[int] | None = None,
    floor: datetime | None = None,
    queues: Sequence[str] = (DEFAULT,),
) -> tuple[list[str], bool, dict[str, list[Hint]]]:
    """The lanes of ``queues`` to look at, in the order their hints came due (at most ``scan``
    hints read, none below ``floor``: see :mod:`.hint_floor`), whether more hints may be due
    than were read, and the hints read on finished jobs by lane (a job that ends hints its lane;
    :func:`read_lanes_jobs` reads a lane's unfinished jobs only: it takes these as the lanes'
    own). For ``ids``: those jobs' lanes, whatever their queue."""
    jobs = Job.objects.using(db)
    if ids is not None:
        found = jobs.filter(pk__in=list(ids)).order_by("queued_at", "id").values_list("lane")
        return _distinct(lane for (lane,) in found), False, {}
    first: list[str] = []  # the lanes of due jobs above priority 0, read with the hints
    fields = ("lane", "id", "ready_at", "status", "priority")
    rows = _scan(db, floor, fields, scan, queues, first)
    ended: dict[str, list[Hint]] = {}
    for lane, pk, at, status, _ in rows:
        if status not in UNFINISHED and at is not None:
            ended.setdefault(lane, []).append((pk, at))
    # Lanes of a job below priority 0 after the others this look read (a stable sort: in the
    # order their hints came due otherwise).
    hinted = [row[0] for row in sorted(rows, key=lambda row: row[4] < 0)]
    keys = _distinct([*first, *hinted])
    return keys[:scan], len(rows) >= scan or len(keys) > scan, ended


def due_lanes(
    limit: int,
    *,
    using: str,
    floor: datetime | None = None,
    queues: Sequence[str] = (DEFAULT,),
) -> int:
    """How many lanes of ``queues`` have a hint that came due (at most ``limit``, none below
    ``floor``): an estimate of the due heads, for sizing a worker's share."""
    rows = _scan(using, floor, ("lane", "ready_at"), limit * 4, queues)
    return min(limit, len({row[0] for row in rows}))


def _scan(
    db: str,
    floor: datetime | None,
    fields: tuple[str, ...],
    limit: int,
    queues: Sequence[str],
    first: list[str] | None = None,
) -> list[Any]:
    """The first ``limit`` hints of ``queues`` that came due, oldest first (``fields`` of each,
    ``ready_at`` among them), from ``floor`` on, or from the first hint when none is above it:
    an index range per queue. ``first``: filled with the lanes of the due jobs above priority
    0, highest first, read in the same statement (:mod:`.priorities`)."""
    look, slots = _look(db, floor is not None, fields, limit, tuple(queues), first is not None)
    params = _with_floor(db, look.params, slots, floor) if floor is not None else look.params
    rows = priorities.read(db, look, params, limit, first)
    if floor is not None:
        rows = [row[:-1] for row in rows if row[-1]]
    at = fields.index("ready_at")
    hint_floor.scanned((db, tuple(queues)), floor, rows[0][at] if rows else None)
    if rows or floor is None:
        return rows
    # Nothing due above the floor: perhaps a hint below it committed late (see .hint_floor).
    return _scan(db, None, fields, limit, queues)


# A look's statement by (database, vendor, from a floor, fields, limit, queues, priorities),
# compiled once per process (building it through the ORM cost more than running it at idle: two
# looks a wake-up); the floor is a parameter, written as _FLOOR when compiled, and where it is
# (its slots) is found then.
_looks: dict[tuple[Any, ...], tuple[priorities.Look, tuple[tuple[int, bool], ...]]] = {}
_FLOOR = datetime(1111, 1, 1, tzinfo=UTC)


def _look(
    db: str,
    floored: bool,
    fields: tuple[str, ...],
    limit: int,
    queues: tuple[str, ...],
    first: bool,
) -> tuple[priorities.Look, tuple[tuple[int, bool], ...]]:
    key = (db, connections[db].vendor, floored, fields, limit, queues, first)
    found = _looks.get(key)
    if found is None:
        if floored:
            scans = {queue: _in_queue(db, _hints_from(db), queue, _FLOOR) for queue in queues}
            fields = (*fields, "due")
        else:
            hinted = Job.objects.using(db).hinted()
            scans = {queue: _in_queue(db, hinted, queue) for queue in queues}
        look = priorities.compile_look(db, scans, fields, limit, first)
        slots = _floor_slots(db, look.params)
        if floored and len(slots) < len(queues):  # (one range of the hint index per queue)
            raise RuntimeError("a look from a floor does not take its floor as a parameter")
        found = _looks[key] = (look, slots)
    return found


def _floor_slots(db: str, params: tuple[Any, ...]) -> tuple[tuple[int, bool], ...]:
    """Where a look compiled from _FLOOR has it among its parameters, and whether as the
    backend writes a datetime (where a lookup compared it) or as given (where the statement
    casts it: PostgreSQL's index range)."""
    written = connections[db].ops.adapt_datetimefield_value(_FLOOR)
    return tuple(
        (n, p is not _FLOOR)
        for n, p in enumerate(params)
        if p is _FLOOR or (isinstance(p, str) and p == written)
    )


def _with_floor(
    db: str, params: tuple[Any, ...], slots: tuple[tuple[int, bool], ...], floor: datetime
) -> list[Any]:
    """The look's parameters with ``floor`` in its slots."""
    out = list(params)
    written = connections[db].ops.adapt_datetimefield_value(floor)
    for n, adapted in slots:
        out[n] = written if adapted else floor
    return out


def hints_from(db: str, floor: datetime, fields: Sequence[str], queue: str = DEFAULT) -> Any:
    """``queue``'s hints from ``floor`` on, due or not, oldest first: ``fields`` of each and
    whether it is due (as a claim's scan reads them)."""
    return _in_queue(db, _hints_from(db), queue, floor).values_list(*fields, "due")


def _hints_from(db: str) -> Any:
    """The jobs, each with whether its hint is due (the condition "due" as a column, not a
    bound: see :func:`.queries.hint_range`, which :func:`_in_queue` adds with the floor and
    the index's order). Hints come in time order, so the due ones come first."""
    due = ExpressionWrapper(queries.hinted(), output_field=BooleanField())
    return Job.objects.using(db).annotate(due=due)


def _in_queue(db: str, hints: Any, queue: str, floor: datetime | None = None) -> Any:
    """``hints`` of ``queue`` (from ``floor`` on), in the hint index's order: one range of it
    (:func:`.queries.hint_range`)."""
    return hints.filter(queries.hint_range(db, queue, floor)).order_by(*queries.HINT_ORDER)


_FRONT_FIELDS = (
    "id",
    "lane",
    "status",
    "claim_token",
    "external",
    "reason",
    "due",
    "queued_at",
    "ready_at",
    "run_after",
    "delayed",
)
_UTC_FIELDS = ("queued_at", "ready_at", "run_after")  # a front's datetimes
_LANE = "\x00lane"
# One lane's first jobs, and its hints, compiled once per (database, vendor, count): the lane is
# a parameter. Both read in one statement, so that on PostgreSQL they come from one snapshot: a
# hint cleared stands for a change the claim saw.
_lane_sql: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}
# Lanes one look reads at most (two SELECTs each in one compound: SQLite allows 500).
MAX_LANES = 240


def _lane_statement(db: str, count: int) -> tuple[str, tuple[Any, ...]]:
    """One lane's part (SQLite: a compound of one such part per lane) or, on PostgreSQL, the
    whole statement for an array of lanes (``LATERAL``: one statement text, planned once, however
    many lanes)."""
    key = (db, connections[db].vendor, count)
    if key not in _lane_sql and connections[db].vendor == "postgresql":
        _lane_sql[key] = _lateral_statement(db, count)
    if key not in _lane_sql:
        due = ExpressionWrapper(queries.due(), output_field=BooleanField())
        delayed = ExpressionWrapper(Q(run_after__gt=F("created_at")), output_field=BooleanField())
        jobs = Job.objects.using(db).filter(lane=_LANE).annotate(delayed=delayed)
        fronts = (
            jobs.filter(status__in=UNFINISHED)
            .annotate(due=due, hint=Value(False))
            .order_by("queued_at", "id")
            .values_list(*_FRONT_FIELDS, "hint")[:count]
        )
        hints = (
            jobs.filter(queries.hinted())
            .annotate(due=due, hint=Value(True))
            .order_by("ready_at")
            .values_list(*_FRONT_FIELDS, "hint")[:HINTS_PER_LANE]
        )
        parts, params = [], []
        for n, qs in enumerate((fronts, hints)):
            sql, more = qs.query.get_compiler(db).as_sql()
            parts.append(f"SELECT * FROM ({sql}) AS part_{n}")
            params += list(more)
        if params.count(_LANE) != 2:
            raise RuntimeError("the lane statement does not take its lane as a parameter")
        _lane_sql[key] = (" UNION ALL ".join(parts), tuple(params))
    return _lane_sql[key]


def _lateral_statement(db: str, count: int) -> tuple[str, tuple[Any, ...]]:
    conn = connections[db]
    table = conn.ops.quote_name(Job._meta.db_table)
    claimable = ", ".join(f"'{status}'" for status in CLAIMABLE)
    computed = {
        "due": f"(j.run_after <= STATEMENT_TIMESTAMP() AND j.status IN ({claimable}))",
        "delayed": "(j.run_after > j.created_at)",
        # As UTC without a zone, made aware again when read (see .reading).
        **{name: reading.utc_sql(f"j.{conn.ops.quote_name(name)}") for name in _UTC_FIELDS},
    }
    columns = ", ".join(
        computed.get(name, f"j.{conn.ops.quote_name(name)}") for name in _FRONT_FIELDS
    )
    unfinished = ", ".join(f"'{status}'" for status in UNFINISHED)
    # A lane's hints through the lane's own index (its unfinished jobs), never an index over
    # every hint: COALESCE keeps the hint indexes' condition (ready_at IS NOT NULL) unproven,
    # so the planner has one road. With statistics taken when no job waited (a VACUUM between
    # bursts) it rated both hint indexes free and read every hint per lane: 12 ms a look at
    # 10 M finished jobs. The hints of the lane's finished jobs (a job that ends hints its lane)
    # come from read_lanes' scan of the hints, read before this statement.
    sql = (
        f"SELECT f.* FROM unnest(%s::text[]) AS wanted(lane) CROSS JOIN LATERAL ("
        f"SELECT {columns}, false AS hint FROM {table} j WHERE j.lane = wanted.lane "
        f"AND j.status IN ({unfinished}) ORDER BY j.queued_at, j.id LIMIT {int(count)}) f "
        f"UNION ALL SELECT h.* FROM unnest(%s::text[]) AS wanted(lane) CROSS JOIN LATERAL ("
        f"SELECT {columns}, true AS hint FROM {table} j WHERE j.lane = wanted.lane "
        f"AND j.status IN ({unfinished}) "
        "AND COALESCE(j.ready_at, 'infinity'::timestamptz) <= STATEMENT_TIMESTAMP() "
        f"ORDER BY j.ready_at LIMIT {HINTS_PER_LANE}) h"
    )
    return sql, (_LANE, _LANE)


def read_lanes_jobs(
    db: str, lanes: Sequence[str], count: int, ended: Mapping[str, list[Hint]] | None = None
) -> tuple[dict[str, list[Front]], dict[str, list[Hint]]]:
    """The first ``count`` unfinished jobs of each lane in lane order, and the lane's hints that
    came due: one statement, index ranges of the lane's own index per lane (PostgreSQL). The
    hints of its finished jobs are ``ended``'s, from :func:`read_lanes`."""
    fronts: dict[str, list[Front]] = {lane: [] for lane in lanes}
    hints: dict[str, list[Hint]] = {lane: list((ended or {}).get(lane, ())) for lane in lanes}
    if not lanes:
        return fronts, hints
    sql, params = _lane_statement(db, count)
    conn = connections[db]
    values: list[Any] = []
    if conn.vendor == "postgresql":
        values = [list(lanes) if p == _LANE else p for p in params]
    else:
        for lane in lanes:
            values += [lane if p == _LANE else p for p in params]
        sql = " UNION ALL ".join([sql] * len(lanes))
    with conn.cursor() as cursor:
        cursor.execute(sql, values)
        rows = cursor.fetchall()
    # SQLite returns datetimes as text: its backend's own converter; PostgreSQL, as UTC
    # without a zone (see _lateral_statement).
    convert = getattr(conn.ops, "convert_datetimefield_value", None)
    if conn.vendor == "postgresql":
        convert = reading.as_utc
    datetime_field = Job._meta.get_field("queued_at")
    # A lane's hints already listed (a set: a hot lane has up to HINTS_PER_LANE of them).
    seen = {lane: {pk for pk, _ in listed} for lane, listed in hints.items()}
    for *row, hint in rows:
        found = dict(zip(_FRONT_FIELDS, row, strict=True))
        if convert is not None:
            for name in _UTC_FIELDS:
                found[name] = convert(found[name], datetime_field, conn)
        if hint:
            # Once each: ``ended`` may hold it already, and SQLite's compound reads it twice.
            if found["id"] not in seen.setdefault(found["lane"], set()):
                seen[found["lane"]].add(found["id"])
                hints[found["lane"]].append((found["id"], found["ready_at"]))
            continue
        for flag in ("due", "external", "delayed"):
            found[flag] = bool(found[flag])
        front = Front(**found)
        fronts[front.lane].append(front)
    for queue in fronts.values():
        queue.sort(key=lambda f: (f.queued_at, f.id))
    return fronts, hints


def lock(db: str, picked: Picked, size: int) -> set[int] | None:
    """Of the picked heads (in their order) the first ``size`` this claim can hold, and their
    lanes' followers: on PostgreSQL locked, skipping rows another transaction holds (a worker
    claiming them, staff), never waiting for them, and still waiting for a worker. None on SQLite
    (one writer at a time: all of them).

    The limit applies after the lock, so that claims at once take different heads: pick them
    with no limit of its own, then :func:`pick` again with what this returns."""
    conn = connections[db]
    if not picked.heads or not conn.features.has_select_for_update_skip_locked:
        return None
    table = conn.ops.quote_name(Job._meta.db_table)
    claimable = ", ".join(f"'{status}'" for status in CLAIMABLE)
    # COALESCE: a status the planner cannot match to the partial index of unfinished jobs
    # (see _waiting_by_id), so that it looks the heads up by id.
    waiting = (
        f"COALESCE(j.status, '') IN ({claimable}) AND j.run_after <= STATEMENT_TIMESTAMP() "
        "AND j.claim_token = ''"
    )
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT j.id FROM {table} j JOIN unnest(%s::bigint[]) WITH ORDINALITY AS c(id, n) "
            f"ON j.id = c.id WHERE j.id = ANY(%s::bigint[]) AND {waiting} ORDER BY c.n LIMIT %s "
            "FOR UPDATE OF j SKIP LOCKED",  # (= ANY: by primary key, whatever the statistics)
            [[f.id for f in picked.heads], [f.id for f in picked.heads], size],
        )
        held = {row[0] for row in cursor.fetchall()}
        lanes = {f.lane for f in picked.heads if f.id in held}
        behind = [f.id for f in picked.followers if f.lane in lanes]
        if behind:
            cursor.execute(
                f"SELECT j.id FROM {table} j WHERE j.id = ANY(%s) AND {waiting} "
                "FOR UPDATE OF j SKIP LOCKED",
                [behind],
            )
            held.update(row[0] for row in cursor.fetchall())
    return held


def settle_hints(db: str, picked: Picked) -> None:
    """Clear the hints the claim looked at (each only as it was read: one set again since is
    kept), and move the hint of a lane's not-yet-due first job to its due time. A row another
    transaction holds keeps its hint: the next claim looks at it again (no waiting)."""
    conn = connections[db]
    table = conn.ops.quote_name(Job._meta.db_table)
    if picked.clear and conn.vendor == "postgresql":
        with conn.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET ready_at = NULL WHERE id IN ("
                f"SELECT j.id FROM {table} j "
                "JOIN unnest(%s::bigint[], %s::timestamptz[]) AS h(id, at) "
                "ON j.id = h.id AND j.ready_at = h.at WHERE j.id = ANY(%s::bigint[]) "
                "FOR UPDATE OF j SKIP LOCKED)",
                [
                    [pk for pk, _ in picked.clear],
                    [at for _, at in picked.clear],
                    [pk for pk, _ in picked.clear],
                ],
            )
    elif picked.clear:  # one writer at a time: nothing changed since it was read
        Job.objects.using(db).filter(pk__in=[pk for pk, _ in picked.clear]).update(ready_at=None)
    if picked.rearm:
        rows = Job.objects.using(db).filter(
            queries.unclaimed(), pk__in=picked.rearm, status__in=CLAIMABLE
        )
        if conn.features.has_select_for_update_skip_locked:
            rows = Job.objects.using(db).filter(
                pk__in=rows.select_for_update(skip_locked=True).values("id")
            )
        rows.update(ready_at=F("run_after"))


_TOKEN, _WORKER, _HEADS, _ALL = "\x00token", "\x00worker", "\x00heads", "\x00all"
# The claim's UPDATE by (database, vendor, lease), compiled once per process: building it
# through the ORM costs more than running it. Ids, token and worker are filled in per claim.
_take_sql: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}


def _waiting_by_id(conn: Any) -> Q | RawSQL:
    """``queries.due()``, for statements that name their jobs by id. On PostgreSQL its status
    is read through COALESCE: ``status IN (queued, retry_wait)`` lets the planner read the
    partial index of unfinished jobs instead of the primary key, which it does, whole, when its
    statistics predate a burst (they said almost no job was queued: a scan of every queued
    job per claim)."""
    if conn.vendor != "postgresql":
        return queries.due()
    column = f"{conn.ops.quote_name(Job._meta.db_table)}.{conn.ops.quote_name('status')}"
    claimable = ", ".join(f"'{status}'" for status in CLAIMABLE)
    opaque = RawSQL(f"COALESCE({column}, '') IN ({claimable})", (), output_field=BooleanField())
    return opaque & Q(run_after__lte=Now())


def _among(conn: Any, marker: str) -> Q | RawSQL:
    """The job's id is one of a list given as one parameter. On PostgreSQL ``id = ANY(array)``:
    the primary key answers it whatever the planner believes of the table (``id IN (SELECT
    unnest(...))`` became a scan of the whole table on a backlog queued since the last ANALYZE:
    21.7 ms per claim at 20,000 jobs, half the drain)."""
    if conn.vendor == "postgresql":
        column = f"{conn.ops.quote_name(Job._meta.db_table)}.{conn.ops.quote_name('id')}"
        return RawSQL(f"{column} = ANY(%s::bigint[])", (marker,), output_field=BooleanField())
    return Q(pk__in=RawSQL("SELECT value FROM json_each(%s)", (marker,)))


def take(
    db: str, heads: Sequence[int], followers: Sequence[int], token: str, wid: str
) -> list[Job]:
    """The statement that takes the picked jobs: the heads running under a lease, the
    followers reserved (queued, with the claim's token), each one attempt more, every hint of
    theirs cleared. Returns the jobs as the statement left them (every column).

    Only the claim's own lanes are in it (locked on PostgreSQL), so no other claim takes these
    jobs meanwhile; the unique running-lane index settles a lane without a row.
    """
    conn = connections[db]
    key = (db, conn.vendor, tombstone_settings.LEASE)
    if key not in _take_sql:
        head = _among(conn, _HEADS)
        values = {
            "status": Case(When(head, then=Value(Status.RUNNING)), default=F("status")),
            "lease_expires_at": Case(
                When(head, then=Now() + Value(tombstone_settings.LEASE)), default=None
            ),
            "owner": _WORKER,
            "claim_token": _TOKEN,
            "attempts": F("attempts") + 1,
            "started_at": Now(),
            "sending_at": None,
            "ready_at": None,
        }
        # Checked again on each row as it is when the UPDATE reaches it (PostgreSQL): a job
        # cancelled or expired meanwhile is left as it is (it ended: the jobs behind it may run).
        chosen = Job.objects.using(db).filter(
            _waiting_by_id(conn), queries.unclaimed(), _among(conn, _ALL)
        )
        query = cast(UpdateQuery, chosen.query.chain(UpdateQuery))
        query.add_update_values(values)
        sql, params = query.get_compiler(db).as_sql()
        if conn.vendor == "sqlite":
            # By id only: SQLite's planner would walk the due-jobs index instead (every queued
            # job behind a blocked head), a cost that follows the backlog, not the claim.
            table = conn.ops.quote_name(Job._meta.db_table)
            sql = sql.replace(f"UPDATE {table} SET", f"UPDATE {table} NOT INDEXED SET", 1)
        _take_sql[key] = (f"{sql} RETURNING {_every_column(conn)}", tuple(params))
    sql, params = _take_sql[key]
    every = [*heads, *followers]
    filled = {
        _TOKEN: token,
        _WORKER: wid,
        _HEADS: list(heads) if conn.vendor == "postgresql" else json.dumps(list(heads)),
        _ALL: every if conn.vendor == "postgresql" else json.dumps(every),
    }
    bound = tuple(filled.get(p, p) if isinstance(p, str) else p for p in params)
    if conn.vendor != "postgresql":
        return list(Job.objects.db_manager(db).raw(sql, bound))
    with conn.cursor() as cursor:
        cursor.execute(sql, bound)
        rows = cursor.fetchall()
    # Every column in the model's order (_every_column): the instances as Model.from_db makes
    # them, each column converted as the ORM converts it (a raw queryset matched the columns
    # to the fields by name and found their converters again at every claim).
    fields = Job._meta.concrete_fields
    if conn.alias not in _take_converters:
        _take_converters[conn.alias] = reading.converters(conn, fields, utc=True)
    found = _take_converters[conn.alias]
    names = [f.attname for f in fields]
    return [Job.from_db(db, names, reading.converted(row, found, conn)) for row in rows]


_take_converters: dict[str, reading.Converters] = {}  # by database: found once


def _every_column(conn: Any) -> str:
    """``*``, and on PostgreSQL every column named, each datetime as UTC without a zone
    (:mod:`.reading`; :func:`take` makes it aware again)."""
    if conn.vendor != "postgresql":
        return "*"
    quote = conn.ops.quote_name
    return ", ".join(
        f"{reading.utc_sql(quote(f.column))} AS {quote(f.column)}"
        if f.attname in reading.DATETIMES
        else quote(f.column)
        for f in Job._meta.concrete_fields
    )


def _distinct(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))
