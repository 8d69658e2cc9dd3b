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

from django.db import DatabaseError, router, transaction
from django.utils import timezone

from . import coalesce, ledger, phases
from .context import HandlerContext
from .exceptions import UnknownHandler
from .models import Job
from .registry import Handler, get_handler

logger = logging.getLogger("tombstones")


class _Fallback(Exception):
    """The batch transaction is rolled back; every job of it takes the classic path."""


def run_batch(claims: list[ledger.Claim]) -> list[phases.Outcome]:
    """Run claimed lane heads (slow handlers: their lanes' next jobs wait for their own turn)."""
    attempts = [phases.Attempt(claim=claim) for claim in claims]
    fast, slow, records = _split(attempts)
    outcomes: list[phases.Outcome] = []
    if fast:
        try:
            with transaction.atomic(using=fast[0].job._state.db):
                outcomes = _run_fast(fast, records, 0, claimed=True)
        except Exception:  # noqa: BLE001 - rolled back; the classic path re-runs and classifies each
            logger.debug("batch of %s jobs falls back to the classic path", len(fast))
            slow = fast + slow
    for attempt in sorted(slow, key=lambda a: a.job.pk):
        ledger.add_event(attempt.job, ledger.Event.CLAIMED, worker=attempt.claim.worker)
        attempt.record = None
        outcomes.append(phases.run_claimed(attempt))
    return outcomes


def run_due(
    limit: int, *, budget: int = 0, workers: int = 1, using: str | None = None
) -> tuple[list[phases.Outcome], list[int]]:
    """Fast handlers: run up to ``limit`` due lane heads, claimed in the transaction that runs them.

    It looks first (no lock: an idle wake-up takes none), then its transaction takes the heads
    (:func:`ledger.take_heads`), runs them and their lanes' next jobs (up to ``limit``, and
    ``budget`` jobs in all), and claims and records them all with the UPDATEs that repeat the
    claim's conditions (:func:`ledger.succeed_unclaimed`). A job that the fast path may not run,
    or a batch that rolls back, takes the classic path: a claim with a lease, one job at a time.
    Returns the outcomes and the due heads seen and left to other workers (it looks at up to
    ``limit`` x ``workers``).
    """
    db = using or router.db_for_write(Job)
    seen = ledger.due_heads(limit * max(workers, 1), using=db)
    if not seen:
        return [], []
    looked, left = seen[:limit], [job.pk for job in seen[limit:]]
    worker = ledger.worker_id()
    try:
        records = _read_records(looked)  # before BEGIN: SQLite's write lock is held from BEGIN on
    except DatabaseError:
        records = {}  # read again in the transaction, where a failure sends all to the classic path
    attempts: list[phases.Attempt] = []
    outcomes: list[phases.Outcome] = []
    try:
        with transaction.atomic(using=db):
            taken = ledger.take_heads(looked, using=db)
            attempts = [phases.Attempt(claim=ledger.Claim(job, "", worker)) for job in taken]
            fast, slow, records = _split(attempts, records)
            outcomes = _run_fast(fast, records, min(limit, budget - len(taken)), claimed=False)
    except Exception:  # noqa: BLE001 - rolled back; the classic path claims and runs each
        logger.debug("batch of %s jobs falls back to the classic path", len(attempts))
        slow = attempts
    for attempt in sorted(slow, key=lambda a: a.job.pk):
        claimed = phases.claim(attempt.job.pk, using=db)
        if claimed is not None:  # None: another worker took it meanwhile
            outcomes.append(phases.run_claimed(claimed))
    return outcomes, left


Records = dict[tuple[int, str], Any]


def _split(
    attempts: list[phases.Attempt], records: Records | None = None
) -> tuple[list[phases.Attempt], list[phases.Attempt], Records]:
    """Jobs ready for the fast path (internal, fenced, record live at its generation) and others.

    Reads the records not already in ``records``.
    """
    try:
        records = _read_records([a.job for a in attempts], records)
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


def _run_fast(
    fast: list[phases.Attempt], records: Records, chain: int, *, claimed: bool
) -> list[phases.Outcome]:
    """In the caller's transaction: run the fast jobs' handlers and record their outcomes.

    ``claimed``: the jobs hold this worker's claim (:func:`run_batch`); otherwise the one UPDATE
    that records them also claims them (:func:`run_due`). Raises when anything is off the happy
    path, so that the caller's transaction rolls back whole.
    """
    if not fast:
        return []
    found: dict[int, tuple[int, int]] = {}
    writes: dict[int, int] = {}
    worker = fast[0].claim.worker
    started = time.monotonic()
    for attempt in fast:
        ctx = HandlerContext(attempt.claim, attempt.record, 0)
        attempt.handler.func(ctx)  # type: ignore[union-attr]
        if ctx.fence_lost is not None:
            raise _Fallback
        found[attempt.job.pk] = (attempt.record.generation, attempt.record.version)
        writes[attempt.job.pk] = ctx.writes
    _learn_pace(time.monotonic() - started, len(fast))
    if claimed:
        ledger.record_succeeded([a.claim for a in fast], found)
    elif not ledger.succeed_unclaimed([a.job for a in fast], worker, found):
        raise _Fallback
    followers = _run_followers(fast, records, chain, worker, found, writes)
    done = [(a.job, a.claim.worker) for a in fast] + [(job, worker) for job in followers]
    ledger.add_success_events(done, found)
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
    (:func:`ledger.succeed_unclaimed`, which re-checks that each is its lane's head once the jobs
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
            if not ledger.succeed_unclaimed(done, worker, found):
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


def _call_helper(left: list[int]) -> None:
    from .dispatch import wake

    if left and coalesce.call_helper():
        wake(left[0])


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
        room, workers = budget - len(outcomes), _cluster_workers()
        limit = min(size, room)
        if _pace is None or _pace >= FAST_JOB_SECONDS:
            # Slow (or not yet timed) handlers: this worker's share, claimed with leases; the
            # heads left go to a helper before the batch runs, so that they run in parallel.
            claims, left = ledger.claim_share(limit, workers=workers, using=using)
            if claims:
                _call_helper(left)
            ran = run_batch(claims) if claims else []
        else:
            # Fast handlers: every due head (up to the batch size), claimed in the transaction
            # that runs them, and their lanes' next jobs in that transaction too.
            ran, left = run_due(limit, budget=room, workers=workers, using=using)
            if ran:
                _call_helper(left)
        if not ran:
            if looked_again or not coalesce.open_gate():
                return outcomes
            looked_again = True
            continue
        outcomes += ran
    # Budget spent with work left: hand it to another message rather than hog this worker.
    head = ledger.claimable(using).order_by("id").values_list("id", flat=True).first()
    if head is not None:
        wake(head)
    return outcomes
