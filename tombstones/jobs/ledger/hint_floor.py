"""Where a worker's scan of the hints starts: above the hints it has already seen cleared.

A hint cleared leaves its entry in the hints' index until ``VACUUM`` removes the old row
version, and ``VACUUM`` may not while a long transaction (a report, a backup, a replica's query)
pins the database's horizon. Those entries sit below every live hint (hints are read and cleared
oldest first), so a scan from the first hint steps over all of them: 1 ms a scan became 20 ms by
the end of a one-minute pin, and the drain halved (bench/horizon.py, issue 35).

So a process starts its scans at its floor: the first hint its last scan read, less
:data:`MARGIN`, for the transactions that wrote an earlier time (their start: ``NOW()``) and
commit after the scan. A hint older than the floor still comes to light: a scan from the first
hint runs at least every :data:`WHOLE_EVERY` seconds, and whenever a scan finds no hint due
above the floor. (A claim that takes nothing clears the hints it looked at, so the pump's look
once more before it stops, or the timer's next claim, reads from the first hint.) The floor picks
which lanes are looked at first, never what is taken from a lane, so order is not at stake here,
only when: at most a second later.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime, timedelta
from time import monotonic

MARGIN = timedelta(seconds=2)
WHOLE_EVERY = 1.0  # seconds between scans from the first hint, at most, in a busy worker


@dataclass
class _Floor:
    at: datetime | None = None  # no live hint below this, as this process last read them
    whole_at: float = -float("inf")  # when it last scanned from the first hint (monotonic)


# By (database, queues scanned): a process's pumps serve one set of queues; tests, several.
_floors: dict[Hashable, _Floor] = {}


def current(key: Hashable) -> datetime | None:
    """Where this process's next scan of the hints (of ``key``: a database and its queues)
    starts; None: at the first hint."""
    floor = _floors.get(key)
    if floor is None or floor.at is None:
        return None
    if monotonic() - floor.whole_at >= WHOLE_EVERY:
        return None
    return floor.at


def scanned(key: Hashable, floor: datetime | None, first: datetime | None) -> None:
    """A scan that started at ``floor`` (None: the first hint) read ``first`` as its first hint
    (None: it read none)."""
    state = _floors.setdefault(key, _Floor())
    if floor is None:
        state.whole_at = monotonic()
    if first is not None:
        state.at = first - MARGIN


def forget() -> None:
    """Every floor of this process (a test starts as a fresh worker)."""
    _floors.clear()
