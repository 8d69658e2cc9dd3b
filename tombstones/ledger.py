"""Every statement on the job table: claim, lease, outcome; each fenced by the claim token.

Outcome lines go to the ``tombstones`` logger after commit, one per outcome, with ids, reason
codes and versions in ``extra`` and never a record's field values.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Exists, F, OuterRef, PositiveIntegerField, Q, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from .conf import tombstone_settings
from .models import Job, JobEvent
from .signals import job_escalated, job_finished

logger = logging.getLogger("tombstones")

Status = Job.Status
Reason = Job.Reason
Event = JobEvent.Event

# Log level and wording per outcome: a rejection never reads like a success.
_LEVELS: dict[str, int] = {
    Status.SUCCEEDED: logging.INFO,
    Status.REJECTED: logging.WARNING,
    Status.RETRY_WAIT: logging.WARNING,
    Status.PAUSED: logging.WARNING,
    Status.UNCERTAIN: logging.WARNING,
    Status.EXPIRED: logging.WARNING,
    Status.ESCALATED: logging.ERROR,
    Status.FAILED: logging.ERROR,
    Status.CANCELLED: logging.INFO,
    Status.QUEUED: logging.INFO,
}

_EVENT_FOR_STATUS: dict[str, str] = {
    Status.SUCCEEDED: Event.SUCCEEDED,
    Status.REJECTED: Event.REJECTED,
    Status.RETRY_WAIT: Event.RETRY,
    Status.PAUSED: Event.PAUSED,
    Status.UNCERTAIN: Event.UNCERTAIN,
    Status.ESCALATED: Event.ESCALATED,
    Status.EXPIRED: Event.EXPIRED,
    Status.FAILED: Event.FAILED,
    Status.CANCELLED: Event.CANCELLED,
    Status.QUEUED: Event.REQUEUED,
}


def worker_id() -> str:
    """host:pid of this process (read each time: workers are forked)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaseLost(Exception):
    """The job's lease was taken over: this worker must write nothing more for it."""


@dataclass
class Claim:
    job: Job
    token: str
    worker: str


def lease_until() -> Any:
    return Now() + Value(tombstone_settings.LEASE)


def _head_blocked(behind: Collection[int] = ()) -> Exists:
    earlier = Job.objects.filter(
        lane=OuterRef("lane"), id__lt=OuterRef("id"), status__in=Job.UNFINISHED
    )
    if behind:
        earlier = earlier.exclude(pk__in=behind)
    return Exists(earlier)


def claimable(using: str | None = None, *, behind: Collection[int] = ()) -> Any:
    """Jobs a worker may take now: claimable, due, young enough, and the head of their lane.

    Unfinished jobs in ``behind`` do not block their lanes: lane followers taken together with
    the jobs before them (:func:`succeed_unclaimed`).
    """
    return (
        Job.objects.using(using)
        .filter(status__in=Job.CLAIMABLE, run_after__lte=Now())
        .filter(created_at__gte=Now() - Value(tombstone_settings.JOB_MAX_AGE))
        .filter(~_head_blocked(behind))
    )


def _claimed_by(worker: str, token: str) -> dict[str, Any]:
    """The columns a claim sets: running, leased in database time, one more attempt."""
    return {
        "status": Status.RUNNING,
        "reason": Reason.NONE,
        "owner": worker,
        "claim_token": token,
        "attempts": F("attempts") + 1,
        "started_at": Now(),
        "lease_expires_at": lease_until(),
        "sending_at": None,
    }


def claim(job_id: int, *, using: str | None = None) -> Claim | None:
    """Take the lease on one job with a conditional UPDATE; None when it is not claimable."""
    token = uuid.uuid4().hex
    wid = worker_id()
    try:
        with transaction.atomic(using=using):
            matched = claimable(using).filter(pk=job_id).update(**_claimed_by(wid, token))
    except IntegrityError:
        # The unique running-lane index refused a second running job in this lane.
        return None
    if not matched:
        return None
    job = Job.objects.using(using).select_related("content_type").get(pk=job_id)
    add_event(job, Event.CLAIMED, worker=wid)
    return Claim(job=job, token=token, worker=wid)


def claim_share(
    limit: int, *, workers: int = 1, using: str | None = None
) -> tuple[list[Claim], list[int]]:
    """Take the lease on this worker's share of the due lane heads (one token for the batch).

    Returns the claims and the due heads seen and left to the other workers (it looks at up to
    ``limit`` x ``workers``). A batch runs its jobs one after the other, so it takes only its
    share of the due heads (1/``workers`` of them, at least one, at most ``limit``): the other
    workers find the rest and different lanes run in parallel. (Handlers fast enough that one
    worker serves them best take the other road, :func:`due_heads`.)

    PostgreSQL: the candidates are locked with SKIP LOCKED so concurrent workers take disjoint
    sets; SQLite serialises writers (IMMEDIATE transactions). The UPDATE re-checks "claimable and
    head of its lane", and the unique running-lane index stays the last word.
    """
    token = uuid.uuid4().hex
    wid = worker_id()
    db = using or router.db_for_write(Job)
    # External calls stay one per message: a batch runs its jobs one after the other, and slow
    # sends must spread over the workers.
    candidates = claimable(db).filter(external=False).order_by("id")
    skip_locked = connections[db].features.has_select_for_update_skip_locked
    # Look before locking: idle wake-ups take no lock (SQLite's is the single writer lock), and
    # the count sets this batch's share.
    seen = list(candidates.values_list("id", flat=True)[: limit * max(workers, 1)])
    if not seen:
        return [], []
    share = max(1, min(limit, -(-len(seen) // max(workers, 1))))
    ids, left = seen[:share], seen[share:]
    # Built before BEGIN: on SQLite the transaction holds the database's one write lock.
    take, values = claimable(db).filter(pk__in=ids), _claimed_by(wid, token)
    try:
        with transaction.atomic(using=db):
            if skip_locked:
                locked = candidates.select_for_update(skip_locked=True, of=("self",))
                ids = list(locked.values_list("id", flat=True)[:share])
                if not ids:
                    return [], left
                take = claimable(db).filter(pk__in=ids)
            matched = take.update(**values)
    except IntegrityError:
        return [], left
    if not matched:
        return [], left
    jobs = (
        Job.objects.using(db)
        .select_related("content_type")
        .filter(claim_token=token, status=Status.RUNNING)
    )
    return [Claim(job=job, token=token, worker=wid) for job in jobs.order_by("id")], left


def record_succeeded(claims: list[Claim], found: dict[int, tuple[int, int]]) -> None:
    """Record many successes in one UPDATE, inside the transaction that made their writes.

    Raises LeaseLost unless every claim is still ours, so a zombie's batch rolls back whole.
    """
    if not claims:
        return
    db = claims[0].job._state.db
    ids = [c.job.pk for c in claims]
    tokens = {c.token for c in claims}
    matched = (
        Job.objects.using(db)
        .filter(pk__in=ids, status=Status.RUNNING, claim_token__in=tokens)
        .update(
            status=Status.SUCCEEDED,
            reason=Reason.NONE,
            finished_at=Now(),
            lease_expires_at=None,
            claim_token="",
            error_class="",
            **_found_columns(db, found),
        )
    )
    if matched != len(ids):
        raise LeaseLost(ids)
    for claim in claims:
        claim.job.status, claim.job.reason = Status.SUCCEEDED, Reason.NONE


def due_heads(limit: int, *, using: str | None = None) -> list[Job]:
    """The first ``limit`` due internal lane heads, read without a lock or a claim (the fast path).

    :func:`take_heads` and :func:`succeed_unclaimed` decide, in the transaction that runs them,
    which jobs this worker takes.
    """
    heads = claimable(using).filter(external=False).select_related("content_type")
    return list(heads.order_by("id")[:limit])


def take_heads(looked: list[Job], *, using: str | None = None) -> list[Job]:
    """In the batch's transaction: the due lane heads this worker runs, at most ``len(looked)``.

    SQLite: those of ``looked`` still claimable; the transaction holds the database's write
    lock, so they are this worker's until it commits. PostgreSQL: due heads locked with SKIP
    LOCKED (held until commit), the looked ones unless another worker holds them, so concurrent
    batches take disjoint jobs. Either way :func:`succeed_unclaimed` re-checks.
    """
    db = using or router.db_for_write(Job)
    candidates = claimable(db).filter(external=False)
    if not connections[db].features.has_select_for_update_skip_locked:
        still = set(candidates.filter(pk__in=[j.pk for j in looked]).values_list("id", flat=True))
        return [job for job in looked if job.pk in still]
    locked = candidates.select_related("content_type").select_for_update(
        skip_locked=True, of=("self",)
    )
    return list(locked.order_by("id")[: len(looked)])


def succeed_unclaimed(jobs: list[Job], worker: str, found: dict[int, tuple[int, int]]) -> bool:
    """Claim and record the success of jobs in one UPDATE: True if all of them were taken.

    For jobs run on the fast path without a claim (lane heads of fast handlers, and their lane
    followers), inside the transaction that made their fenced writes: they are never seen
    running and hold no lease, and their writes and outcome commit together or not at all. The
    UPDATE repeats the claim's conditions (claimable, due, young, internal, and head of its lane
    once the jobs before it in ``jobs`` count as done); when any job fails them the caller rolls
    its writes back.
    """
    if not jobs:
        return True
    ids = [job.pk for job in jobs]
    db = jobs[0]._state.db
    matched = (
        claimable(db, behind=ids)
        .filter(pk__in=ids, external=False)
        .update(
            status=Status.SUCCEEDED,
            reason=Reason.NONE,
            owner=worker,
            claim_token="",
            attempts=F("attempts") + 1,
            started_at=Now(),
            finished_at=Now(),
            lease_expires_at=None,
            sending_at=None,
            error_class="",
            **_found_columns(db, {pk: found[pk] for pk in ids}),
        )
    )
    if matched != len(ids):
        return False
    for job in jobs:
        job.status, job.reason = Status.SUCCEEDED, Reason.NONE
    return True


def _found_columns(db: str | None, found: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """found_generation and found_version of many jobs: a CASE on the job id each.

    Written as SQL with parameters: When() objects compile one lookup per job, and this runs
    inside the batch's transaction (on SQLite, while holding the database's write lock).
    """
    ops = connections[db or router.db_for_write(Job)].ops
    column = ops.quote_name(str(Job._meta.pk.column))
    sql = f"CASE {column} {' '.join(['WHEN %s THEN %s'] * len(found))} END"

    def case(index: int) -> RawSQL:
        params = [value for pk, seen in found.items() for value in (pk, seen[index])]
        return RawSQL(sql, params, output_field=PositiveIntegerField())

    return {"found_generation": case(0), "found_version": case(1)}


def add_success_events(done: list[tuple[Job, str]], found: dict[int, tuple[int, int]]) -> None:
    """claimed, checked and succeeded events of many jobs in one INSERT; log lines after commit."""
    if not done:
        return
    events = []
    for job, worker in done:
        g, v = found[job.pk]
        for event, seen in (
            (Event.CLAIMED, (None, None)),
            ("checked", (g, v)),
            (Event.SUCCEEDED, (g, v)),
        ):
            events.append(_event_row(job, event, Reason.NONE, seen, worker))
        announce(job, Status.SUCCEEDED, Reason.NONE, (g, v))
    JobEvent.objects.using(done[0][0]._state.db).bulk_create(events)


def _event_row(
    job: Job, event: str, reason: str, found: tuple[int | None, int | None], worker: str
) -> JobEvent:
    return JobEvent(
        job_id=job.pk,
        content_type_id=job.content_type_id,
        object_id=job.object_id,
        event=event,
        reason=reason,
        expected_generation=job.generation,
        expected_version=job.version,
        found_generation=found[0],
        found_version=found[1],
        worker=worker,
    )


def extend_lease(claim: Claim) -> bool:
    """Push the lease forward (database clock); False if it was taken over."""
    return bool(_mine(claim).update(lease_expires_at=lease_until()))


def _mine(claim: Claim) -> Any:
    return Job.objects.using(claim.job._state.db).filter(
        pk=claim.job.pk, status=Status.RUNNING, claim_token=claim.token
    )


def mark_sending(claim: Claim, source_live: Q | Exists) -> bool:
    """Commit 'sending' for an external call, only while the source record is still live."""
    return bool(_mine(claim).filter(source_live).update(sending_at=Now()))


def mark_sent(claim: Claim) -> bool:
    return bool(_mine(claim).update(sent_at=Now()))


def finish(
    claim: Claim,
    status: str,
    reason: str = Reason.NONE,
    *,
    found: tuple[int | None, int | None] = (None, None),
    run_after: Any = None,
    error_class: str = "",
) -> None:
    """Record the outcome of a claimed job; raises LeaseLost when the claim is no longer ours.

    Call it inside the transaction that made the handler's writes: both commit or neither.
    """
    job = claim.job
    fields: dict[str, Any] = {
        "status": status,
        "reason": reason,
        "rereads": job.rereads,
        "found_generation": found[0],
        "found_version": found[1],
        "lease_expires_at": None,
        "error_class": error_class[:200],
    }
    if status in Job.TERMINAL:
        fields["finished_at"] = Now()
    if run_after is not None:
        fields["run_after"] = run_after
    if status != Status.RUNNING:
        fields["claim_token"] = ""
    with transaction.atomic(using=job._state.db):
        if not _mine(claim).update(**fields):
            raise LeaseLost(job.pk)
        job.status, job.reason = status, reason
        add_event(job, _EVENT_FOR_STATUS[status], reason, found=found, worker=claim.worker)
        announce(job, status, reason, found)


def transition(
    job: Job,
    status: str,
    reason: str,
    *,
    from_status: tuple[str, ...],
    event: str | None = None,
    extra_filter: Q | None = None,
    **fields: Any,
) -> bool:
    """A conditional status change made outside a claim (sweep, admin): True if it applied."""
    qs = Job.objects.using(job._state.db).filter(pk=job.pk, status__in=from_status)
    if extra_filter is not None:
        qs = qs.filter(extra_filter)
    if status in Job.TERMINAL:
        fields.setdefault("finished_at", Now())
    with transaction.atomic(using=job._state.db):
        if not qs.update(status=status, reason=reason, **fields):
            return False
        job.status, job.reason = status, reason
        add_event(job, event or _EVENT_FOR_STATUS[status], reason, worker=worker_id())
        announce(job, status, reason, (None, None))
    return True


def add_event(
    job: Job,
    event: str,
    reason: str = Reason.NONE,
    *,
    found: tuple[int | None, int | None] = (None, None),
    worker: str = "",
) -> None:
    _event_row(job, event, reason, found, worker).save(using=job._state.db)


def record_ref(content_type_id: int, object_id: str) -> str:
    """``app_label.model:pk`` from the (cached) content type: ids only."""
    from django.contrib.contenttypes.models import ContentType

    ct = ContentType.objects.get_for_id(content_type_id)
    return f"{ct.app_label}.{ct.model}:{object_id}"


def announce(job: Job, status: str, reason: str, found: tuple[int | None, int | None]) -> None:
    """Log the outcome (after commit) and send the signals."""
    extra = {
        "job_id": job.pk,
        "handler": job.handler,
        "record": record_ref(job.content_type_id, job.object_id),
        "status": status,
        "reason": reason,
        "expected_generation": job.generation,
        "expected_version": job.version,
        "found_generation": found[0],
        "found_version": found[1],
    }
    level = _LEVELS.get(status, logging.INFO)
    message = (
        "job %(job_id)s %(status)s reason=%(reason)s handler=%(handler)s record=%(record)s "
        "expected=g%(expected_generation)s/v%(expected_version)s "
        "found=g%(found_generation)s/v%(found_version)s"
    )

    def emit() -> None:
        logger.log(level, message, extra, extra={"tombstones": extra})
        if status in Job.TERMINAL:
            job_finished.send(sender=Job, job=job, status=status, reason=reason)
        if status == Status.ESCALATED:
            job_escalated.send(sender=Job, job=job, reason=reason)

    transaction.on_commit(emit, using=job._state.db)
