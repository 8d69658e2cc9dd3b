"""The race harness's job handlers (imported automatically: modules named ``handlers``).

``stress.upsert`` and ``stress.delete`` deliver to :class:`DownstreamRecord` the way the seed's
downstream API would: blind writes keyed by business key, no version check. They are external
(bracketed sending/sent), and only lane order keeps the downstream store right.

``stress.apply`` is an internal write (record + :class:`AppliedWrite` in the act transaction), used
by the crash tests together with the rendezvous params below.

Params understood by all three (ids and timings only):
    ``delay_ms`` / ``delay_min_ms``: deliver after a random delay of delay_min_ms..delay_ms
    milliseconds (widens race windows);
    ``signal``: a file path written when the handler is reached (a barrier for tests);
    ``release`` / ``hold``: then wait until that file exists, at most ``hold`` seconds;
    ``heartbeat``: seconds to run while extending the lease every ``heartbeat_every`` seconds;
    ``transient_attempts`` (``stress.apply``): raise a TransientError on attempts up to this one;
    ``crash`` (``stress.apply``): ``"sigkill"`` kills the worker process, ``"exit"`` raises
    SystemExit, on attempts up to ``crash_attempts`` (default: every attempt).

``stress.count`` is the most ordinary handler there is: read a field, write a value computed from
it (``how="read"``: from ``ctx.record``; ``how="f"``: an ``F()`` expression).

``stress.added_in_deploy`` exists only in processes started with ``STRESS_DEPLOYED=1``: the new
code of a rolling deploy, which the old workers lack.

The chaos soak's handlers (``soak.*``) live in ``soak/handlers.py`` and are registered here.
"""

from __future__ import annotations

import os
import random
import signal as signals
import time
from pathlib import Path
from typing import Any

from django.db.models import F

import tombstones
from tombstones.context import HandlerContext
from tombstones.exceptions import TransientError
from tombstones.jobs.ledger import worker_id

from .models import AppliedWrite, Delivery, DownstreamRecord
from .soak import handlers as soak_handlers  # noqa: F401 - the chaos soak's, registered here

MAX_HOLD = 120.0


def rendezvous(params: dict[str, Any]) -> None:
    """Tell a test the handler was reached, then block until released (bounded)."""
    signal = params.get("signal")
    if signal:
        Path(signal).write_text(str(worker_id()))
    release = params.get("release")
    if release:
        deadline = time.monotonic() + min(float(params.get("hold", 30)), MAX_HOLD)
        while not Path(release).exists() and time.monotonic() < deadline:
            time.sleep(0.01)


def _delay(params: dict[str, Any]) -> None:
    high = float(params.get("delay_ms", 0))
    low = min(float(params.get("delay_min_ms", 0)), high)
    if high > 0:
        time.sleep(random.uniform(low, high) / 1000)


def _log(ctx: HandlerContext, op: str, phase: str) -> None:
    job = ctx.job
    Delivery.objects.create(
        job_id=job.pk,
        lane=job.lane,
        sequence=job.sequence,
        key=ctx.record.key,
        op=op,
        phase=phase,
        generation=job.generation or 0,
        worker=worker_id(),
    )


@tombstones.handler("stress.upsert", external=True)
def upsert(ctx: HandlerContext) -> None:
    """Blind upsert of the entity's current content downstream."""
    record = ctx.record
    _log(ctx, "upsert", Delivery.Phase.START)
    rendezvous(ctx.params)
    _delay(ctx.params)
    DownstreamRecord.objects.update_or_create(
        key=record.key, defaults={"payload": record.payload, "generation": record.generation}
    )
    _log(ctx, "upsert", Delivery.Phase.END)


@tombstones.handler("stress.delete", external=True, accepts_tombstones=True)
def delete(ctx: HandlerContext) -> None:
    """Blind delete downstream, by business key (propagates a tombstone)."""
    _log(ctx, "delete", Delivery.Phase.START)
    rendezvous(ctx.params)
    _delay(ctx.params)
    DownstreamRecord.objects.filter(key=ctx.record.key).delete()
    _log(ctx, "delete", Delivery.Phase.END)


@tombstones.handler("stress.apply")
def apply(ctx: HandlerContext) -> None:
    """Internal: a fenced update of the record and an AppliedWrite row, in one transaction."""
    params = ctx.params
    if ctx.job.attempts <= int(params.get("transient_attempts", 0)):
        raise TransientError("stress.apply: a temporary failure, as asked")
    crash = params.get("crash")
    if crash and ctx.job.attempts <= int(params.get("crash_attempts", 1_000)):
        if crash == "sigkill":
            os.kill(os.getpid(), signals.SIGKILL)
        raise SystemExit("stress.apply: exits, as asked")
    seconds = float(params.get("heartbeat", 0))
    if seconds:
        every = float(params.get("heartbeat_every", 0.2))
        deadline = time.monotonic() + min(seconds, MAX_HOLD)
        while time.monotonic() < deadline:
            time.sleep(every)
            ctx.heartbeat()
    if not ctx.update(payload=f"applied-by-job-{ctx.job.pk}"):
        return
    AppliedWrite.objects.create(
        job_id=ctx.job.pk, key=ctx.record.key, version=ctx.record.version, worker=worker_id()
    )
    rendezvous(params)
    _delay(params)


@tombstones.handler("stress.count")
def count(ctx: HandlerContext) -> None:
    """Internal read-modify-write of ``counter`` (+1), after the optional rendezvous and delay."""
    rendezvous(ctx.params)
    _delay(ctx.params)
    if ctx.params.get("how") == "f":
        ctx.update(counter=F("counter") + 1)
    else:
        ctx.update(counter=ctx.record.counter + 1)


def added_in_deploy(ctx: HandlerContext) -> None:
    """A handler of the new code: marks the record (payload) as the deploy's."""
    ctx.update(payload=f"deployed-by-job-{ctx.job.pk}")


if os.environ.get("STRESS_DEPLOYED") == "1":
    tombstones.handler("stress.added_in_deploy")(added_in_deploy)
