"""The lane rows: what keeps a lane's places in commit order on PostgreSQL.

A job's place in its lane is taken when its INSERT runs, but other sessions see the job only
once its transaction commits: a job enqueued earlier in a long transaction would appear *ahead*
of a later job that committed, and perhaps already ran, in the meantime. So an enqueue holds its
lane's row (``FOR NO KEY UPDATE``) from before its INSERT until it commits, and takes its place
only once it holds it: the enqueues of a lane commit one after the other, each placed behind
every job of its lane anyone can see. A claim needs no lock for that: whatever it sees of a lane
is placed before whatever it does not see yet.

Except a delayed job: its place is its due time, taken at its enqueue, so an immediate job
enqueued just before that time, still in flight, would come before it. A claim takes a delayed
job that is first in its lane only after locking the lane's row (``FOR UPDATE SKIP LOCKED``,
skipping a lane with an enqueue in flight) and reading the lane again. SQLite runs one write
transaction at a time and needs none of it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from django.db import connections

from ..models import Lane

_TABLE = Lane._meta.db_table
# Lanes this process saw a row of, by (database, key): an enqueue into one of them takes the row
# in its INSERT (:func:`.insert.insert_job`). A cache, bounded; a row can only be missing after
# the transaction that made it rolled back, which the INSERT notices.
_KNOWN: OrderedDict[tuple[str, str], None] = OrderedDict()
_KNOWN_MAX = 10_000


def known(db: str, key: str) -> bool:
    return (db, key) in _KNOWN


def remember(db: str, key: str, *, exists: bool = True) -> None:
    if not exists:
        _KNOWN.pop((db, key), None)
        return
    _KNOWN[(db, key)] = None
    _KNOWN.move_to_end((db, key))
    if len(_KNOWN) > _KNOWN_MAX:
        _KNOWN.popitem(last=False)


def guard_sql() -> str:
    """The CTE an INSERT of a job names its lane and its place through: the lane's row held
    (``FOR NO KEY UPDATE``) before the row is formed, until the commit."""
    return f"guard AS MATERIALIZED (SELECT key FROM {_TABLE} WHERE key = %s FOR NO KEY UPDATE)"


def make_sql() -> str:
    """The CTE an INSERT of a lane's first job makes the lane's row in (nothing when it exists;
    a row of our own needs no lock: no other session sees it before we commit)."""
    return (
        f"made AS (INSERT INTO {_TABLE} (key) VALUES (%s) ON CONFLICT (key) DO NOTHING "
        "RETURNING key)"
    )


def guarded(db: str) -> bool:
    """Whether lanes are locked on this database (PostgreSQL: concurrent writers)."""
    return bool(connections[db].features.has_select_for_update_skip_locked)


def hold(db: str, key: str) -> None:
    """Hold ``key``'s lane row until the caller's transaction ends (an enqueue, before its
    INSERT: the INSERT that follows takes its place after every job of the lane that committed).
    Creates the row on a lane's first job."""
    if not guarded(db):
        return
    lock = f"SELECT 1 FROM {_TABLE} WHERE key = %s FOR NO KEY UPDATE"
    with connections[db].cursor() as cursor:
        cursor.execute(lock, [key])
        if cursor.fetchone() is not None:
            remember(db, key)
            return
        # The first job of the lane: the row is new (or another enqueue just made it). An
        # uncommitted row of ours is invisible to the claims until we commit, our job with it.
        insert = f"INSERT INTO {_TABLE} (key) VALUES (%s) ON CONFLICT (key) DO NOTHING"
        cursor.execute(insert, [key])
        if cursor.rowcount == 0:
            cursor.execute(lock, [key])
    remember(db, key)


def hold_many(db: str, keys: Sequence[str]) -> None:
    """:func:`hold` for many lanes at once (a bulk enqueue): the rows made where missing, then
    all held, in key order (two bulk enqueues of the same lanes never wait on each other in a
    circle). Two statements, whatever the number of lanes."""
    if not guarded(db) or not keys:
        return
    wanted = sorted(set(keys))
    with connections[db].cursor() as cursor:
        new = [key for key in wanted if not known(db, key)]
        if new:
            cursor.execute(
                f"INSERT INTO {_TABLE} (key) SELECT k FROM unnest(%s::text[]) AS k ORDER BY k "
                "ON CONFLICT (key) DO NOTHING",
                [new],
            )
        cursor.execute(
            f"SELECT key FROM {_TABLE} WHERE key = ANY(%s) ORDER BY key FOR NO KEY UPDATE",
            [wanted],
        )
        held = {row[0] for row in cursor.fetchall()}
    missing = set(wanted) - held
    if missing:  # made and committed by another session, and gone again since: rare
        for key in sorted(missing):
            hold(db, key)
    for key in wanted:
        remember(db, key)


def take(db: str, keys: Sequence[str], limit: int, *, wait: bool = False) -> tuple[list[str], int]:
    """Of ``keys`` (in the claim's order), up to ``limit`` lanes a claim may take a delayed job
    from, and how many of ``keys`` it went through to find them. Their rows stay locked until the
    claim's transaction ends; a lane another claim or an unfinished enqueue holds is skipped. A
    lane without a row (a job written by hand) is not guarded: taken as is.

    ``wait``: wait for the rows instead (a claim of given jobs, the race fixture's: a claim of
    another job of the lane holds its row only for a moment).

    Call inside the claim's transaction, before it reads the lanes' jobs.
    """
    if not keys or limit < 1:
        return [], 0
    if not guarded(db):
        return list(keys[:limit]), min(limit, len(keys))
    with connections[db].cursor() as cursor:
        cursor.execute(
            f"SELECT l.key, wanted.n FROM {_TABLE} l "
            "JOIN unnest(%s::text[]) WITH ORDINALITY AS wanted(key, n) ON wanted.key = l.key "
            "ORDER BY wanted.n LIMIT %s FOR UPDATE OF l" + ("" if wait else " SKIP LOCKED"),
            [list(keys), limit],
        )
        rows = cursor.fetchall()
        locked = {key for key, _ in rows}
        went = int(max(n for _, n in rows)) if len(rows) >= limit else len(keys)
        seen = list(keys[:went])
        missing: set[str] = set()
        rest = [key for key in seen if key not in locked]
        if rest:
            cursor.execute(f"SELECT key FROM {_TABLE} WHERE key = ANY(%s)", [rest])
            missing = set(rest) - {row[0] for row in cursor.fetchall()}
    return [key for key in seen if key in locked or key in missing][:limit], went
