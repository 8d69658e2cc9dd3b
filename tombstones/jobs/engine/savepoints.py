"""A job's savepoint inside its group's transaction, and what the connection says about the
statements a handler ran in it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DatabaseError, connections
from django.db.transaction import TransactionManagementError


class Savepoint:
    """A job's savepoint: :meth:`discard` rolls back to it when its block ends."""

    def __init__(self) -> None:
        self.discarded = False

    def discard(self) -> None:
        """What the job wrote is not kept (a lost fence, a broken transaction)."""
        self.discarded = True


@contextlib.contextmanager
def own_savepoint(db: str) -> Iterator[Savepoint]:
    """A job's savepoint inside its group's transaction, kept until the commit (no RELEASE: one
    statement less per job). An exception, or a :meth:`Savepoint.discard`, rolls back to it,
    with the ``on_commit`` callbacks registered meanwhile (Django ties them to the savepoints in
    ``savepoint_ids``)."""
    conn = connections[db]
    sid = conn.savepoint()
    if sid is None:  # outside a transaction (autocommit): nothing to roll back to
        raise TransactionManagementError("A job's savepoint needs its group's transaction.")
    conn.savepoint_ids.append(sid)
    savepoint = Savepoint()
    try:
        yield savepoint
    except BaseException:
        _roll_back(db, sid)
        raise
    if savepoint.discarded:
        _roll_back(db, sid)
    else:
        conn.savepoint_ids.remove(sid)


def _roll_back(db: str, sid: str) -> None:
    conn = connections[db]
    conn.savepoint_ids.remove(sid)
    # As Django's atomic() does: back before whatever the handler broke (an error inside its ORM
    # calls marks the transaction for rollback), or the group's if that fails.
    conn.needs_rollback = False
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
