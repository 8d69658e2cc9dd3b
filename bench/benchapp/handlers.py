"""The fenced twin of bench.tasks.plain_touch (imported by tombstones.registry autodiscovery),
and bench/coalesce.py's coalescing handler."""

from __future__ import annotations

import os
from datetime import timedelta

from django.utils import timezone

import tombstones
from tombstones.context import HandlerContext


@tombstones.handler("bench.touch")
def touch(ctx: HandlerContext) -> None:
    """The same write as the baseline, fenced on (pk, generation, version, live)."""
    ctx.update(synced_at=timezone.now())


def _seconds(name: str, default: float) -> timedelta:
    """A window of bench/coalesce.py (``--debounce``, ``--max-delay``), passed by environment
    to its own process and to its cluster alike."""
    return timedelta(seconds=float(os.environ.get(name) or default))


@tombstones.handler(
    "bench.coalesce_sync",
    coalesce=True,
    debounce=_seconds("BENCH_COALESCE_DEBOUNCE", 1.0),
    max_delay=_seconds("BENCH_COALESCE_MAX_DELAY", 5.0),
)
def coalesce_sync(ctx: HandlerContext) -> None:
    """The newest of a record's queued syncs (issue 39): the same fenced write as ``touch``."""
    ctx.update(synced_at=timezone.now())
