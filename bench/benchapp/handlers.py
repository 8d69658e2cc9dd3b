"""The fenced twin of bench.tasks.plain_touch (imported by tombstones.registry autodiscovery)."""

from __future__ import annotations

from django.utils import timezone

import tombstones
from tombstones.context import HandlerContext


@tombstones.handler("bench.touch")
def touch(ctx: HandlerContext) -> None:
    """The same write as the baseline, fenced on (pk, generation, version, live)."""
    ctx.update(synced_at=timezone.now())
