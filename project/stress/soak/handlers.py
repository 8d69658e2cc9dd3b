"""The soak's job handlers, on :class:`~project.stress.models.StressEntity` (no personal fields).

Internal ones make one fenced update of ``counter`` and insert a :class:`SoakEffect` in the same
savepoint, so an effect row exists exactly when the write committed. Every handler journals its
start and end (:mod:`.journal`) before it touches anything: the order check reads those.

- ``soak.increment``: ``counter = F("counter") + 1``;
- ``soak.rmw``: read-modify-write, ``counter = ctx.record.counter + 1`` (a stale copy would
  lose an update);
- ``soak.transient``: raises :class:`TransientError` while ``attempts <= params["fail"]``,
  then increments;
- ``soak.external`` / ``soak.forget`` (on tombstones too): a fake external call, journaled with
  the job's idempotency key, then ``params["ms"]`` milliseconds of "network" at most;
- ``soak.tick`` / ``soak.ping``: plain jobs (no record): an effect row of record 0, or a fake
  external call.

Params are ids and timings only.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any

from django.db.models import F

import tombstones
from tombstones.context import HandlerContext

from ..models import SoakEffect
from . import journal

Handler = Callable[[HandlerContext], str]
# The record of a plain job's effect rows: none (no StressEntity has pk 0).
PLAIN = 0


def traced(func: Handler) -> Callable[[HandlerContext], None]:
    """Journal the handler's start and how it ended (``result``, or what it raised)."""

    @functools.wraps(func)
    def run(ctx: HandlerContext) -> None:
        journal.started(ctx.job)
        try:
            result = func(ctx)
        except tombstones.TransientError:
            journal.ended(ctx.job, "transient")
            raise
        except BaseException as exc:
            journal.ended(ctx.job, type(exc).__name__)
            raise
        journal.ended(ctx.job, result)

    return run


def _pause(params: dict[str, Any]) -> None:
    ms = float(params.get("ms", 0))
    if ms > 0:
        time.sleep(random.uniform(0, ms) / 1000)


def _increment(ctx: HandlerContext, value: Any) -> str:
    if not ctx.update(counter=value):
        return "fence"
    record = ctx.record
    SoakEffect.objects.create(
        job_id=ctx.job.pk,
        entity_id=record.pk,
        generation=record.generation,
        version=record.version,
        counter=record.counter,
        claim=journal.claim_key(ctx.job.owner, ctx.job.started_at),
    )
    return "ok"


@tombstones.handler("soak.increment")
@traced
def increment(ctx: HandlerContext) -> str:
    return _increment(ctx, F("counter") + 1)


@tombstones.handler("soak.rmw")
@traced
def read_modify_write(ctx: HandlerContext) -> str:
    seen = ctx.record.counter
    _pause(ctx.params)
    return _increment(ctx, seen + 1)


@tombstones.handler("soak.transient")
@traced
def transient(ctx: HandlerContext) -> str:
    if ctx.job.attempts <= int(ctx.params.get("fail", 1)):
        raise tombstones.TransientError("soak: a temporary failure, as asked")
    return _increment(ctx, F("counter") + 1)


def _call(ctx: HandlerContext) -> str:
    journal.called(ctx.idempotency_key, ctx.job)
    _pause(ctx.params)
    return "sent"


@tombstones.handler("soak.external", external=True)
@traced
def external(ctx: HandlerContext) -> str:
    return _call(ctx)


@tombstones.handler("soak.forget", external=True, accepts_tombstones=True)
@traced
def forget(ctx: HandlerContext) -> str:
    return _call(ctx)


@tombstones.handler("soak.tick", plain=True)
@traced
def tick(ctx: HandlerContext) -> str:
    """A plain job: no record, no fence; its effect row (record 0) commits with its outcome."""
    _pause(ctx.params)
    SoakEffect.objects.create(
        job_id=ctx.job.pk,
        entity_id=PLAIN,
        generation=0,
        version=0,
        counter=0,
        claim=journal.claim_key(ctx.job.owner, ctx.job.started_at),
    )
    return "ok"


@tombstones.handler("soak.ping", external=True, plain=True)
@traced
def ping(ctx: HandlerContext) -> str:
    return _call(ctx)
