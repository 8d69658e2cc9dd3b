"""Riding out the soak's own PostgreSQL restarts in the feeder, the editor and the chaos."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection

T = TypeVar("T")

# How long a process waits for the database to come back before it gives up (seconds).
PATIENCE = 120.0


class DatabaseGone(RuntimeError):
    """The database did not come back within PATIENCE seconds."""


def retrying(step: Callable[[], T], *, patience: float = PATIENCE) -> T:
    """Run ``step`` (one transaction at most) until it gets through a database outage.

    A step cut by a restart may or may not have committed: the callers count what they did
    from the database afterwards, never from their own tally of attempts.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            return step()
        except (OperationalError, InterfaceError) as exc:
            # The connection died with the server: a new one is opened on the next query.
            connection.close()
            if time.monotonic() > deadline:
                raise DatabaseGone(f"no database for {patience:.0f}s: {exc}") from exc
            time.sleep(0.1)
