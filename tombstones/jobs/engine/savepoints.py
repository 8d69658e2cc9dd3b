"""A job's savepoint inside its group's transaction, and what the connection says about the
statements a handler ran in it."""

from __future__ import annotations

import _thread
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DatabaseError, connections
from django.db.transaction import TransactionManagementError


class Savepoint:
    """A job's savepoint, made lazily: the SAVEPOINT goes with the first statement its job runs
    (on PostgreSQL in that statement's round trip), so a job pays no round trip of its own for
    it. :meth:`discard` rolls back to it when its block ends."""

    def __init__(self, db: str) -> None:
        conn = connections[db]
        if not (conn.features.uses_savepoints and conn.in_atomic_block):
            raise TransactionManagementError("A job's savepoint needs its group's transaction.")
        self.db = db
        # Named as Django names its own (BaseDatabaseWrapper.savepoint), from the same counter.
        conn.savepoint_state += 1
        thread = str(_thread.get_ident()).replace("-", "")
        self.sid = f"s{thread}_x{conn.savepoint_state}"
        self.made = False
        self.discarded = False

    def discard(self) -> None:
        """What the job wrote is not kept (a lost fence, a broken transaction)."""
        self.discarded = True

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        """The connection's execute wrapper while the job runs: its first statement makes the
        savepoint first."""
        if self.made:
            return execute(sql, params, many, context)
        self.made = True
        conn = connections[self.db]
        create = conn.ops.savepoint_create_sql(self.sid)
        raw = getattr(context.get("cursor"), "cursor", None)
        if raw is not None and not many and _merges(raw):
            # One round trip: psycopg 3 binds the parameters in the client and sends both as one
            # simple query; the cursor then moves on to the statement's own result. Bound
            # before the savepoint is put in front: psycopg keeps its parse of a statement's
            # text, and a text with a savepoint name in it is new for every job (each one
            # parsed again, and pushing the engine's statements out of that cache).
            bound = raw.mogrify(sql, params) if params is not None else sql
            result = execute(f"{create}; {bound}", None, many, context)
            raw.nextset()
            return result
        with conn.cursor() as cursor:  # a statement of its own (SQLite's costs no round trip)
            cursor.execute(create)
        return execute(sql, params, many, context)


def _merges(raw: Any) -> bool:
    """A psycopg 3 client-side binding cursor (Django's default), not a named one: it runs
    several statements sent as one string."""
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(raw, psycopg.ClientCursor) and getattr(raw, "name", None) is None


@contextlib.contextmanager
def own_savepoint(db: str) -> Iterator[Savepoint]:
    """A job's savepoint inside its group's transaction, kept until the commit (no RELEASE: one
    statement less per job), made with the job's first statement (none if it runs none). An
    exception, or a :meth:`Savepoint.discard`, rolls back to it, with the ``on_commit``
    callbacks registered meanwhile (Django ties them to the savepoints in ``savepoint_ids``)."""
    conn = connections[db]
    savepoint = Savepoint(db)
    conn.savepoint_ids.append(savepoint.sid)
    try:
        with conn.execute_wrapper(savepoint):
            yield savepoint
    except BaseException:
        _roll_back(savepoint)
        raise
    if savepoint.discarded:
        _roll_back(savepoint)
    else:
        conn.savepoint_ids.remove(savepoint.sid)


def _roll_back(savepoint: Savepoint) -> None:
    conn = connections[savepoint.db]
    sid = savepoint.sid
    conn.savepoint_ids.remove(sid)
    conn.needs_rollback = False
    if not savepoint.made:  # no statement ran: only the callbacks registered meanwhile go
        conn.run_on_commit = [entry for entry in conn.run_on_commit if sid not in entry[0]]
        return
    # As Django's atomic() does: back before whatever the handler broke (an error inside its ORM
    # calls marks the transaction for rollback), or the group's if that fails.
    try:
        conn.savepoint_rollback(sid)
    except DatabaseError:
        conn.needs_rollback = True


class StatementErrors:
    """An execute wrapper around a handler: the first database error any statement raised."""

    def __init__(self) -> None:
        self.first: BaseException | None = None

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        try:
            return execute(sql, params, many, context)
        except DatabaseError as exc:
            if self.first is None:
                self.first = exc
            raise


def in_failed_transaction(exc: BaseException) -> bool:
    """PostgreSQL's "current transaction is aborted" (SQLSTATE 25P02), or Django's refusal to
    run a query after an error inside an ``atomic(savepoint=False)`` block."""
    if isinstance(exc, TransactionManagementError):
        return True
    return isinstance(exc, DatabaseError) and getattr(exc.__cause__, "sqlstate", None) == "25P02"


def aborted(db: str) -> bool:
    """True when the connection's transaction is in PostgreSQL's failed state."""
    conn = connections[db]
    raw = conn.connection
    if conn.vendor != "postgresql" or raw is None:
        return False
    info = getattr(raw, "info", None)  # psycopg 3: its TransactionStatus enum, by name
    if info is not None:
        return getattr(info.transaction_status, "name", None) == "INERROR"
    status = getattr(raw, "get_transaction_status", None)  # psycopg2
    return status is not None and status() == 3  # TRANSACTION_STATUS_INERROR
