"""The fast path: many lane heads per wake-up; their writes and outcomes in one transaction.

Same guarantees as :mod:`tombstones.phases`, fewer statements: one claim for the batch, one read
per model for the records, the handlers' fenced writes, one UPDATE and one INSERT for all the
outcomes — in one transaction with the writes. Anything off the happy path (a stop condition,
a tombstone, an external handler, a lost fence, an exception) goes to the classic phases, which
repeat the check and classify it exactly as a single job would be.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from . import coalesce, ledger, phases
from .context import HandlerContext
from .exceptions import UnknownHandler
from .models import Job
from .registry import Handler, get_handler

logger = logging.getLogger("tombstones")


class _Fallback(Exception):
    """The batch transaction is rolled back; every job of it takes the classic path."""


def run_batch(claims: list[ledger.Claim], *, chain: int = 0) -> list[phases.Outcome]:
    """Run claimed lane heads; with ``chain`` > 0, up to that many of their lanes' next jobs too."""
    attempts = [phases.Attempt(claim=claim) for claim in claims]
    fast, slow, records = _split(attempts)
    outcomes = _act_together(fast, records, chain)
    if outcomes is None:
        slow = fast + slow
        outcomes = []
    for attempt in sorted(slow, key=lambda a: a.job.pk):
        ledger.add_event(attempt.job, ledger.Event.CLAIMED, worker=attempt.claim.worker)
        attempt.record = None
        outcomes.append(phases.run_claimed(attempt))
    return outcomes


Records = dict[tuple[int, str], Any]


def _split(
    attempts: list[phases.Attempt],
) -> tuple[list[phases.Attempt], list[phases.Attempt], Records]:
    """Jobs ready for the fast path (internal, fenced, record live at its generation) and others."""
    try:
        records = _read_records([a.job for a in attempts])
    except DatabaseError:
        return [], attempts, {}  # the classic check pauses them one by one
    fast, slow = [], []
    for attempt in attempts:
        handler = _fast_handler(attempt.job, records)
        if handler is None:
            slow.append(attempt)
            continue
        attempt.handler = handler
        attempt.record = records[(attempt.job.content_type_id, attempt.job.object_id)]
        fast.append(attempt)
    return fast, slow, records


def _fast_handler(job: Job, records: Records) -> Handler | None:
    """The job's handler if the fast path may run it: internal, fenced, its record live."""
    try:
        handler = get_handler(job.handler)
    except UnknownHandler:
        return None
    record = records.get((job.content_type_id, job.object_id))
    if (
        not job.is_fenced
        or handler.external
        or handler.accepts_tombstones
        or record is None
        or record.generation != job.generation
        or record.deleted_at is not None
    ):
        return None
    return handler


def _read_records(jobs: list[Job], found: Records | None = None) -> Records:
    """One read per model for the jobs' records not in ``found`` (tombstones included)."""
    found = {} if found is None else found
    wanted: dict[int, set[str]] = defaultdict(set)
    for job in jobs:
        if (job.content_type_id, job.object_id) not in found:
            wanted[job.content_type_id].add(job.object_id)
    for job in jobs:
        content_type = job.content_type
        pks = wanted.pop(content_type.pk, None)
        model = content_type.model_class()
        if pks is None or model is None or not hasattr(model, "all_objects"):
            continue
        for record in model.all_objects.using(job._state.db).filter(pk__in=pks):
            found[(content_type.pk, str(record.pk))] = record
    return found


def _act_together(
    fast: list[phases.Attempt], records: Records, chain: int
) -> list[phases.Outcome] | None:
    if not fast:
        return []
    db = fast[0].job._state.db
    found: dict[int, tuple[int, int]] = {}
    writes: dict[int, int] = {}
    try:
        with transaction.atomic(using=db):
            started = time.monotonic()
            for attempt in fast:
                ctx = HandlerContext(attempt.claim, attempt.record, 0)
                attempt.handler.func(ctx)  # type: ignore[union-attr]
                if ctx.fence_lost is not None:
                    raise _Fallback
                found[attempt.job.pk] = (attempt.record.generation, attempt.record.version)
                writes[attempt.job.pk] = ctx.writes
            _learn_pace(time.monotonic() - started, len(fast))
            ledger.record_succeeded([a.claim for a in fast], found)
            worker = fast[0].claim.worker
            followers = _run_followers(fast, records, chain, worker, found, writes)
            done = [(a.job, a.claim.worker) for a in fast] + [(j, worker) for j in followers]
            ledger.add_success_events(done, found)
    except Exception:  # noqa: BLE001 - rolled back; the classic path re-runs and classifies each
        logger.debug("batch of %s jobs falls back to the classic path", len(fast))
        return None
    return [
        phases.Outcome(job.pk, ledger.Status.SUCCEEDED, "", 0, writes[job.pk]) for job, _ in done
    ]


def _run_followers(
    fast: list[phases.Attempt],
    records: Records,
    limit: int,
    worker: str,
    found: dict[int, tuple[int, int]],
    writes: dict[int, int],
) -> list[Job]:
    """Drain the batch's lanes: their next queued jobs, in lane order, in the batch's transaction.

    Each lane's jobs run one after the other, and one UPDATE claims and records them all
    (:func:`ledger.succeed_followers`, which re-checks that each is its lane's head once the jobs
    before it are done). A lane stops at a job the fast path may not run. Anything wrong (a lost
    fence, an exception, a job no longer claimable) rolls back the followers only: they stay
    queued for the next claim.
    """
    if limit <= 0:
        return []
    db = fast[0].job._state.db
    lanes = {a.job.lane for a in fast}
    now = timezone.now()
    try:
        with transaction.atomic(using=db):
            queued = (
                Job.objects.using(db)
                .select_related("content_type")
                .filter(lane__in=list(lanes), status__in=Job.UNFINISHED)
                .order_by("id")[:limit]
            )
            rows = list(queued)
            _read_records(rows, records)
            blocked: set[str] = set()
            done: list[Job] = []
            for job in rows:
                if job.lane in blocked:
                    continue
                due = job.status == Job.Status.QUEUED and job.run_after <= now
                if not due or _fast_handler(job, records) is None:
                    blocked.add(job.lane)
                    continue
                record = records[(job.content_type_id, job.object_id)]
                ctx = HandlerContext(ledger.Claim(job=job, token="", worker=worker), record, 0)
                get_handler(job.handler).func(ctx)
                if ctx.fence_lost is not None:
                    raise _Fallback
                found[job.pk] = (record.generation, record.version)
                writes[job.pk] = ctx.writes
                done.append(job)
            if not ledger.succeed_followers(done, worker, found):
                raise _Fallback
    except Exception:  # noqa: BLE001 - the followers roll back and stay queued
        logger.debug("lane followers of a batch roll back; they stay queued")
        return []
    return done


# Handlers that recently took less than this per job (their fenced writes included) are "fast":
# the next batch takes every due head it sees (up to the batch size) instead of its 1/workers
# share. One worker running short handlers back to back in one transaction beats several
# splitting them; slow handlers still spread over the workers.
FAST_JOB_SECONDS = 0.01

_pace: float | None = None  # this process's recent seconds per job on the fast path


def _learn_pace(seconds: float, jobs: int) -> None:
    global _pace
    per_job = seconds / max(jobs, 1)
    _pace = per_job if _pace is None else 0.7 * _pace + 0.3 * per_job


def _cluster_workers() -> int:
    """Worker processes of the django-q2 cluster this runs in (the batch takes its share)."""
    from django_q.conf import Conf

    return max(1, int(Conf.WORKERS or 1))


def pump(using: str | None = None) -> list[phases.Outcome]:
    """Claim and run batches of due lane heads until none is left or the wake budget is spent.

    Serves coalesced wake-ups (:mod:`tombstones.coalesce`): before it stops it opens the gate and
    looks once more, and it calls a helper when it leaves due heads to other workers.
    """
    from .conf import tombstone_settings
    from .dispatch import wake

    size, budget = tombstone_settings.BATCH_SIZE, tombstone_settings.WAKE_BUDGET
    outcomes: list[phases.Outcome] = []
    if not size:
        return outcomes
    coalesce.helper_arrived()
    looked_again = False
    while len(outcomes) < budget:
        spread = _pace is None or _pace >= FAST_JOB_SECONDS
        claims, left = ledger.claim_share(
            min(size, budget - len(outcomes)),
            workers=_cluster_workers(),
            spread=spread,
            using=using,
        )
        if not claims:
            if looked_again or not coalesce.open_gate():
                return outcomes
            looked_again = True
            continue
        if left and coalesce.call_helper():
            wake(left[0])
        # Fast handlers also drain their lanes in the batch's transaction (budget permitting).
        room = 0 if spread else min(size, budget - len(outcomes) - len(claims))
        outcomes += run_batch(claims, chain=room)
    # Budget spent with work left: hand it to another message rather than hog this worker.
    head = ledger.claimable(using).order_by("id").values_list("id", flat=True).first()
    if head is not None:
        wake(head)
    return outcomes
