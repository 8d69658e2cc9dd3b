"""Every statement that changes a job row: claim, outcome, release, take-back, lease.

One claim function (:func:`claim`) and one outcome writer (:func:`_write`, behind
:func:`record` for a worker's claim and :func:`transition` for the sweep and staff): each is a
conditional UPDATE, and every outcome appends its events and logs one line after commit, with
ids, reason codes and versions in ``extra`` and never a record's field values.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, models, router, transaction
from django.db.models import BooleanField, Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.utils import timezone

from . import job_query
from .conf import tombstone_settings
from .exceptions import LeaseLost
from .models import Job, JobEvent
from .signals import job_escalated, job_finished

logger = logging.getLogger("tombstones")

Status = Job.Status
Reason = Job.Reason
Event = JobEvent.Event

# Log level per outcome: a rejection never reads like a success.
_LEVELS: dict[str, int] = {
    Status.SUCCEEDED: logging.INFO,
    Status.ESCALATED: logging.ERROR,
    Status.FAILED: logging.ERROR,
    Status.CANCELLED: logging.INFO,
    Status.QUEUED: logging.INFO,
}

EVENT_FOR_STATUS: dict[str, str] = {
    Status.SUCCEEDED: Event.SUCCEEDED,
    Status.REJECTED: Event.REJECTED,
    Status.RETRY_WAIT: Event.RETRY,
    Status.PAUSED: Event.PAUSED,
    Status.UNCERTAIN: Event.UNCERTAIN,
    Status.SUPERSEDED: Event.SUPERSEDED,
    Status.ESCALATED: Event.ESCALATED,
    Status.EXPIRED: Event.EXPIRED,
    Status.FAILED: Event.FAILED,
    Status.CANCELLED: Event.CANCELLED,
    Status.QUEUED: Event.REQUEUED,
}

Found = tuple[int | None, int | None]

EMPTY_PARAMS = Value({}, models.JSONField())  # params erased


def worker_id() -> str:
    """host:pid of this process (read each time: workers are forked)."""
    return f"{socket.gethostname()}:{os.getpid()}"


# --- claim ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Claim:
    """Jobs one worker took with one UPDATE: they share a token and a lease.

    Shared by the worker's thread, which runs the jobs, and the lease keeper's, which may give
    the jobs not started yet back while a slow one runs (:meth:`begin`, :func:`give_back`).
    """

    token: str
    worker: str
    using: str
    jobs: Sequence[Job]
    left: int = 0  # due lane heads seen and not taken (for the other workers)
    workers: int = 1  # worker processes of the cluster, as the claim saw them
    # The database's clock at the claim's look, and this process's monotonic clock then: events
    # are stamped in database time at the step they record, without asking the database again.
    clock: tuple[datetime, float] | None = None
    started: set[int] = field(default_factory=set)  # jobs whose turn came (worker thread)
    returned: set[int] = field(default_factory=set)  # jobs given back (keeper thread)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def db_now(self) -> datetime:
        """The database's time now, as read at the claim plus the time elapsed here since."""
        return _clock_now(self.clock) if self.clock is not None else timezone.now()

    @property
    def claimed_at(self) -> datetime:
        """When the claim was made (the database's clock at its look)."""
        return self.clock[0] if self.clock is not None else timezone.now()

    def begin(self, job_id: int) -> bool:
        """The worker starts this job's turn: False if it was given back meanwhile."""
        with self.lock:
            if job_id in self.returned:
                return False
            self.started.add(job_id)
            return True


def _clock_now(clock: tuple[datetime, float]) -> datetime:
    at, then = clock
    return at + timedelta(seconds=time.monotonic() - then)


def lease_until() -> Any:
    return Now() + Value(tombstone_settings.LEASE)


def _too_old() -> Case:
    cutoff = Now() - Value(tombstone_settings.JOB_MAX_AGE)
    return Case(When(created_at__lt=cutoff, then=True), default=False, output_field=BooleanField())


def claim(
    limit: int,
    *,
    workers: int = 1,
    whole: bool = False,
    ids: Sequence[int] | None = None,
    using: str | None = None,
) -> Claim | None:
    """Take due lane heads with one conditional UPDATE (committed): running, leased, attempt + 1.

    Looks first without a lock (an idle wake-up takes none; on SQLite the write lock is the
    database's), then takes up to ``limit`` of them: this worker's share (1/``workers`` of what
    it saw) unless ``whole``. A job whose last claim ended without an outcome (a crash) is taken
    alone, so that a job that kills its worker is told apart from its batch-mates. The UPDATE
    repeats every condition, and the unique running-lane index is the last word. A ``whole``
    claim also reserves its lanes' next queued jobs in the same statement (:func:`_followers`).
    Returns None when nothing is due.
    """
    db = using or router.db_for_write(Job)
    rows = Job.objects.using(db).select_related("content_type").annotate(too_old=_too_old())
    heads = rows.claimable()
    if ids is not None:
        heads = heads.filter(pk__in=list(ids))
    if whole and ids is None:
        # Whether the lane has a job queued behind: only then look for followers.
        behind = Job.objects.filter(lane=OuterRef("lane"), status=Status.QUEUED).exclude(
            pk=OuterRef("pk")
        )
        heads = heads.annotate(more=Exists(behind))
    looked = heads.annotate(db_now=Now()).order_by("queued_at", "id")
    seen: list[Job] = list(looked[: limit * max(workers, 1)])
    if not seen:
        return None
    clock = (seen[0].db_now, time.monotonic())  # type: ignore[attr-defined]
    if _suspect(seen[0]):
        chosen = seen[:1]
    else:
        share = limit if whole else max(1, min(limit, math.ceil(len(seen) / max(workers, 1))))
        chosen = [job for job in seen if not _suspect(job)][:share]
    followers = _followers(rows, chosen, limit) if whole and ids is None else []
    token, wid = uuid.uuid4().hex, worker_id()
    head_ids = [job.pk for job in chosen]
    mine = [*head_ids, *(job.pk for job in followers)]
    # One statement claims the heads (running, leased) and reserves their lanes' followers
    # (queued, this token; nobody else can take them while their head holds the lane).
    take = Job.objects.using(db).filter(
        (Q(pk__in=head_ids) & job_query.claimable())
        | Q(pk__in=[job.pk for job in followers], status=Status.QUEUED, claim_token="")
        & ~Q(_queued_before(exclude=mine))
    )
    is_head = Q(pk__in=head_ids)
    values = {
        "status": Case(When(is_head, then=Value(Status.RUNNING)), default=F("status")),
        "lease_expires_at": Case(When(is_head, then=lease_until()), default=None),
        "owner": wid,
        "claim_token": token,
        "attempts": F("attempts") + 1,
        "started_at": Now(),
        "sending_at": None,
    }
    try:
        # One statement, no transaction of its own. Its row (owner, started_at) is the record of
        # the claim: the ``claimed`` event is written with the outcome, or by the take-back when
        # the worker died without one.
        matched = _update(db, take, values)
    except IntegrityError:
        # The unique running-lane index refused a second running job of a lane: look again.
        return Claim(token, wid, db, [], left=len(seen), workers=workers, clock=clock)
    if matched == len(mine):
        for job in chosen:
            job.status = Status.RUNNING
        jobs = [*chosen, *followers]
        for job in jobs:
            job.claim_token, job.owner = token, wid
            job.attempts += 1
    else:  # another worker took some of them meanwhile
        jobs = _read_back(rows, token, db)
    return Claim(
        token,
        wid,
        db,
        sorted(jobs, key=_place),
        left=len(seen) - sum(job.status == Status.RUNNING for job in jobs),
        workers=workers,
        clock=clock,
    )


def _followers(rows: Any, heads: Sequence[Job], limit: int) -> list[Job]:
    """The next queued jobs of the heads' lanes (at most ``limit``): lane followers.

    A follower stays ``queued`` (a lane has one running job, its head) with the claim's token and
    one more attempt, and runs in its head's group, after it, on the record as the head left it.
    Its outcome is recorded with the others'; if its turn does not come, it is given back.
    """
    if not heads or _suspect(heads[0]):
        return []
    lanes = {job.lane for job in heads if not job.external and getattr(job, "more", False)}
    if not lanes:
        return []
    queued = rows.filter(
        lane__in=lanes, status=Status.QUEUED, run_after__lte=Now(), external=False
    ).exclude(reason__in=SUSPECT)  # a suspect is claimed alone
    return list(queued.exclude(pk__in=[j.pk for j in heads]).order_by("queued_at", "id")[:limit])


def _queued_before(*, exclude: Sequence[int]) -> Exists:
    """A queued job of the outer job's lane placed before it, other than ``exclude``."""
    before = Q(queued_at__lt=OuterRef("queued_at")) | Q(
        queued_at=OuterRef("queued_at"), id__lt=OuterRef("id")
    )
    return Exists(
        Job.objects.filter(before, lane=OuterRef("lane"), status=Status.QUEUED).exclude(
            pk__in=list(exclude)
        )
    )


def _read_back(rows: Any, token: str, db: str) -> list[Job]:
    """What a partly matched claim took; followers whose head it did not get go back."""
    jobs = list(rows.filter(claim_token=token, status__in=HELD))
    led = {job.lane for job in jobs if job.status == Status.RUNNING}
    stray = [job.pk for job in jobs if job.status == Status.QUEUED and job.lane not in led]
    if stray:
        Job.objects.using(db).filter(pk__in=stray, claim_token=token, status=Status.QUEUED).update(
            claim_token="", attempts=F("attempts") - 1
        )
    return [job for job in jobs if job.pk not in stray]


def _update(db: str, qs: Any, values: dict[str, Any]) -> int:
    if connections[db].in_atomic_block:
        with transaction.atomic(using=db):  # a savepoint: the caller's transaction survives
            return int(qs.update(**values))
    return int(qs.update(**values))  # one statement in autocommit: no BEGIN/COMMIT


def _place(job: Job) -> tuple[Any, int]:
    return (job.queued_at, job.pk)


# Reasons of a job whose last claim ended without an outcome.
SUSPECT = (Reason.LEASE_EXPIRED, Reason.CRASHED)


def _suspect(job: Job) -> bool:
    return job.reason in SUSPECT


def give_back(claim: Claim) -> list[int]:
    """From the lease keeper, while a slow job holds the claim: the jobs whose turn has not come
    go back to the queue, uncharged, for the other workers (the worker thread then skips them).

    Its own connection: the worker's transaction holds none of these rows.
    """
    with claim.lock:
        ids = [job.pk for job in claim.jobs if job.pk not in claim.started | claim.returned]
        if not ids:
            return []
        try:
            _mine(claim, ids).update(
                status=Status.QUEUED,
                attempts=F("attempts") - 1,
                lease_expires_at=None,
                claim_token="",
            )
        except DatabaseError as exc:
            logger.warning("could not give back the jobs of a slow claim (%s)", type(exc).__name__)
            return []
        claim.returned.update(ids)
    return ids


def renew(tokens: Iterable[str], *, using: str | None = None) -> int:
    """Push the leases of these claims forward (database clock); the number renewed."""
    tokens = list(tokens)
    if not tokens:
        return 0
    held = Job.objects.using(using).filter(claim_token__in=tokens, status=Status.RUNNING)
    return held.update(lease_expires_at=lease_until())


def holds_any(token: str, *, using: str | None = None) -> bool:
    """True while the claim holds a job (running, or a lane follower it reserved)."""
    return Job.objects.using(using).filter(claim_token=token, status__in=HELD).exists()


# A claim's jobs: its heads (running) and its lane followers (queued, reserved by the token).
HELD = (Status.RUNNING, Status.QUEUED)


def _mine(claim: Claim, ids: Sequence[int]) -> models.QuerySet[Job]:
    return Job.objects.using(claim.using).filter(
        pk__in=list(ids), status__in=HELD, claim_token=claim.token
    )


# --- outcomes ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What became of one claimed job, and the audit events that lead to it."""

    job: Job
    status: str
    reason: str = Reason.NONE
    found: Found = (None, None)
    error_class: str = ""
    retry_in: timedelta | None = None  # retry_wait: when it becomes due again
    erase_params: bool = False  # the job ended: nothing of its params is kept (_params_after)
    refund: bool = False  # the claim did not count: its attempt is given back
    writes: int = 0
    events: list[JobEvent] = field(default_factory=list)

    @property
    def job_id(self) -> int:
        return int(self.job.pk)

    def as_list(self) -> list[Any]:
        # Plain values: this is what django-q2 stores in its task table.
        return [self.job_id, str(self.status), str(self.reason)]


def event_row(
    job: Job,
    event: str,
    reason: str = Reason.NONE,
    found: Found = (None, None),
    worker: str = "",
    at: datetime | None = None,
) -> JobEvent:
    """An (unsaved) event; ``at``: its time (default: the database's when it is inserted)."""
    row = JobEvent(
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
    if at is not None:
        row.created_at = at
    return row


def record(claim: Claim, outcomes: Sequence[Outcome]) -> None:
    """Record the outcomes of claimed jobs: one UPDATE, one INSERT of their events.

    Call it inside the transaction that made the handlers' writes: both commit or neither.
    Raises LeaseLost unless every job is still this claim's, so a zombie's writes roll back.
    """
    if not outcomes:
        return
    for outcome in outcomes:
        outcome.events.append(
            event_row(
                outcome.job,
                EVENT_FOR_STATUS[outcome.status],
                outcome.reason,
                outcome.found,
                claim.worker,
                at=claim.db_now(),
            )
        )
    matched = _write(_mine(claim, [o.job_id for o in outcomes]), outcomes, claim.using)
    if matched != len(outcomes):
        raise LeaseLost(model="tombstones.Job", pk=[o.job_id for o in outcomes])
    _after(outcomes, claim.using)


def transition(
    job: Job,
    status: str,
    reason: str,
    *,
    from_status: tuple[str, ...],
    event: str | None = None,
    extra_filter: Q | Exists | None = None,
    before: Sequence[JobEvent] = (),
    **fields: Any,
) -> bool:
    """A conditional status change outside a claim (sweep, staff): True if it applied.

    ``before``: events that precede the change's own (the claim a take-back ends)."""
    db = job._state.db or router.db_for_write(Job)
    qs = Job.objects.using(db).filter(pk=job.pk, status__in=from_status)
    if extra_filter is not None:
        qs = qs.filter(extra_filter)
    erasure = _params_after(job, status, db)
    if erasure is not None:
        fields.setdefault("params", erasure)
    outcome = Outcome(job, status, reason, events=list(before))
    outcome.events.append(
        event_row(job, event or EVENT_FOR_STATUS[status], reason, worker=fields.pop("by", ""))
    )
    with transaction.atomic(using=db):
        if not _write(qs, [outcome], db, **fields):
            return False
        _after([outcome], db)
    return True


def _params_after(job: Job, status: str, db: str) -> Any:
    """What a change to ``status`` outside a claim writes to the params (None: kept).

    A job's params are erased when it ends, whatever it ends with, except a success (its record's
    tombstone erases them) and an uncertain job whose record lives (staff may resend it once).
    """
    if status not in Job.TERMINAL or status == Status.SUCCEEDED:
        return None
    if status == Status.UNCERTAIN:
        live = live_record(job, db)
        if live is not None:
            return Case(When(Exists(live), then=F("params")), default=EMPTY_PARAMS)
    return EMPTY_PARAMS


def live_record(job: Job, db: str) -> models.QuerySet[Any] | None:
    """The job's record, if it is live at the job's generation (None: not a record model)."""
    from django.contrib.contenttypes.models import ContentType

    model = ContentType.objects.db_manager(db).get_for_id(job.content_type_id).model_class()
    if model is None or not hasattr(model, "all_objects"):
        return None
    return models.QuerySet(model, using=db).filter(
        pk=job.object_id, generation=job.generation, deleted_at__isnull=True
    )


def _write(qs: models.QuerySet[Job], outcomes: Sequence[Outcome], db: str, **extra: Any) -> int:
    """The one UPDATE that writes outcomes: a column's value, or a CASE on the id when it varies."""
    by_id = {o.job_id: o for o in outcomes}
    terminal = {pk for pk, o in by_id.items() if o.status in Job.TERMINAL}
    fields: dict[str, Any] = {
        "status": _column(db, {pk: str(o.status) for pk, o in by_id.items()}),
        "reason": _column(db, {pk: str(o.reason) for pk, o in by_id.items()}),
        "error_class": _column(db, {pk: o.error_class[:200] for pk, o in by_id.items()}),
        "rereads": _column(db, {pk: o.job.rereads for pk, o in by_id.items()}),
        "lease_expires_at": None,
        "claim_token": "",
    }
    found = {pk: o.found for pk, o in by_id.items()}
    if any(f != (None, None) for f in found.values()):
        fields["found_generation"] = _column(db, {pk: f[0] for pk, f in found.items()})
        fields["found_version"] = _column(db, {pk: f[1] for pk, f in found.items()})
    if terminal:
        fields["finished_at"] = _only(terminal, by_id, Now(), F("finished_at"))
    retries = {pk: o.retry_in for pk, o in by_id.items() if o.retry_in is not None}
    if retries:
        fields["run_after"] = Case(
            *[When(pk=pk, then=Now() + Value(delay)) for pk, delay in retries.items()],
            default=F("run_after"),
        )
    erase = {pk for pk, o in by_id.items() if o.erase_params}
    if erase:
        fields["params"] = _only(erase, by_id, EMPTY_PARAMS, F("params"))
    refund = {pk for pk, o in by_id.items() if o.refund}
    if refund:
        fields["attempts"] = _only(refund, by_id, F("attempts") - 1, F("attempts"))
    fields.update(extra)
    matched = qs.update(**fields)
    if matched:
        for outcome in outcomes:
            outcome.job.status, outcome.job.reason = outcome.status, outcome.reason
    return matched


def _only(ids: set[int], by_id: dict[int, Outcome], value: Any, otherwise: Any) -> Any:
    if len(ids) == len(by_id):
        return value
    return Case(When(pk__in=list(ids), then=value), default=otherwise)


def _column(db: str, values: dict[int, Any]) -> Any:
    """One value for every job, or ``CASE id WHEN … THEN … END`` with parameters.

    Written as SQL: When() objects compile one lookup per job, and this runs inside the act
    transaction (on SQLite, while holding the database's write lock).
    """
    distinct = set(values.values())
    if len(distinct) == 1:
        return next(iter(distinct))
    ops = connections[db].ops
    column = ops.quote_name(str(Job._meta.pk.column))
    sql = f"CASE {column} {' '.join(['WHEN %s THEN %s'] * len(values))} END"
    params = [value for pk, v in values.items() for value in (pk, v)]
    sample = next(v for v in distinct if v is not None) if distinct - {None} else None
    output = models.PositiveIntegerField() if isinstance(sample, int) or sample is None else None
    return RawSQL(sql, params, output_field=output or models.CharField())


def _after(outcomes: Sequence[Outcome], db: str) -> None:
    """The outcomes' events (one INSERT) and, after commit, their log lines and signals."""
    JobEvent.objects.using(db).bulk_create([e for o in outcomes for e in o.events])
    for outcome in outcomes:
        announce(outcome.job, outcome.status, outcome.reason, outcome.found)


# --- crashes, hand-backs, lapsed leases -------------------------------------------------------


def release(
    claim: Claim,
    jobs: Sequence[Job],
    *,
    culprit: Job | None = None,
    suspects: bool = False,
    error_class: str = "",
) -> None:
    """Give claimed jobs back without an outcome (a crash in this worker, or a hand-back).

    The ``culprit`` (the job whose handler or check crashed) keeps its attempt: it waits to be
    retried, or ends ``failed``/``crashed`` once it was claimed TOMBSTONES_MAX_ATTEMPTS times
    (``uncertain`` if its external call was already sent). The others get their attempt back
    and are queued again in their place; ``suspects`` marks them to be claimed alone next time
    (the crash could not be pinned on one of them).
    """
    db = claim.using
    others = [job for job in jobs if job is not culprit]
    with transaction.atomic(using=db):
        if others:
            back: dict[str, Any] = {
                "status": Status.QUEUED,
                "attempts": F("attempts") - 1,
                "lease_expires_at": None,
                "claim_token": "",
            }
            if suspects:
                back["reason"] = Reason.CRASHED
            _mine(claim, [job.pk for job in others]).update(**back)
            for job in others:
                job.status, job.attempts = Status.QUEUED, job.attempts - 1
        if culprit is not None:
            outcome = crash_outcome(culprit, error_class)
            outcome.events.append(
                event_row(culprit, Event.CLAIMED, worker=claim.worker, at=claim.claimed_at)
            )
            outcome.events.append(
                event_row(
                    culprit, EVENT_FOR_STATUS[outcome.status], outcome.reason, at=claim.db_now()
                )
            )
            sending = Q(sending_at__isnull=False)
            if _write(_mine(claim, [culprit.pk]).exclude(sending), [outcome], db):
                _after([outcome], db)
            else:  # its external call was sent: the outcome is unknown, never repeated
                uncertain = Outcome(
                    culprit, Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN, error_class=error_class
                )
                uncertain.events = [
                    event_row(culprit, Event.UNCERTAIN, Reason.OUTCOME_UNKNOWN, at=claim.db_now())
                ]
                params = _params_after(culprit, Status.UNCERTAIN, db)
                mine = _mine(claim, [culprit.pk]).filter(sending)
                if _write(mine, [uncertain], db, params=params):
                    _after([uncertain], db)


def crash_outcome(job: Job, error_class: str = "") -> Outcome:
    """A claim of ``job`` that ended without an outcome: retried, or failed once capped.

    A lane follower goes back to its place, behind the jobs of its lane given back with it (a
    retry would hold the lane ahead of them).
    """
    if job.attempts >= tombstone_settings.MAX_ATTEMPTS:
        return Outcome(
            job, Status.FAILED, Reason.CRASHED, error_class=error_class, erase_params=True
        )
    if job.status == Status.QUEUED:
        return Outcome(job, Status.QUEUED, Reason.CRASHED, error_class=error_class)
    delay = tombstone_settings.backoff(job.attempts)
    return Outcome(job, Status.RETRY_WAIT, Reason.CRASHED, error_class=error_class, retry_in=delay)


def take_back_lapsed(using: str | None = None, *, limit: int = 500) -> dict[str, int]:
    """Jobs whose worker vanished (lease ran out): never run twice, never lost.

    - an external call was sent: ``uncertain``, never repeated by itself;
    - claimed alone: a claim without an outcome; ``failed``/``crashed`` once it was claimed
      TOMBSTONES_MAX_ATTEMPTS times, else queued again in its place;
    - claimed with others (heads or lane followers): which of them killed the worker is
      unknown; each gets its attempt back and is queued again, to be claimed alone next time.

    Each change is conditional, so two of these running at once are harmless.
    """
    counts = {"uncertain": 0, "requeued": 0, "crashed": 0}
    db = using or router.db_for_write(Job)
    lapsed = Job.objects.using(db).lapsed()
    shared = Exists(
        Job.objects.filter(claim_token=OuterRef("claim_token"), status__in=HELD).exclude(
            pk=OuterRef("pk")
        )
    )
    rows = lapsed.select_related("content_type").annotate(shared=shared).order_by("id")[:limit]
    for job in rows:
        still = Q(lease_expires_at__lt=Now(), claim_token=job.claim_token)
        common: dict[str, Any] = {"claim_token": "", "lease_expires_at": None, "by": worker_id()}
        # The claim that ends here without an outcome, as its row recorded it.
        common["before"] = [event_row(job, Event.CLAIMED, worker=job.owner, at=job.started_at)]
        if job.sending_at is not None:
            counts["uncertain"] += transition(
                job,
                Status.UNCERTAIN,
                Reason.OUTCOME_UNKNOWN,
                from_status=(Status.RUNNING,),
                extra_filter=still,
                **common,
            )
        elif not job.shared and job.attempts >= tombstone_settings.MAX_ATTEMPTS:
            counts["crashed"] += transition(
                job,
                Status.FAILED,
                Reason.CRASHED,
                from_status=(Status.RUNNING,),
                extra_filter=still,
                **common,
            )
        else:
            if job.shared:
                common["attempts"] = F("attempts") - 1
            counts["requeued"] += transition(
                job,
                Status.QUEUED,
                Reason.LEASE_EXPIRED,
                from_status=(Status.RUNNING,),
                extra_filter=still,
                **common,
            )
        if job.shared:
            # Its claim's lane followers: never started (or rolled back with it).
            Job.objects.using(db).filter(claim_token=job.claim_token, status=Status.QUEUED).update(
                claim_token="", attempts=F("attempts") - 1, reason=Reason.LEASE_EXPIRED
            )
    # Followers whose claim holds nothing running: its worker died before giving them back (or
    # is about to: then its own give-back finds nothing to do). Never started, so uncharged.
    # (Looked for first: an UPDATE would wait for SQLite's write lock even when none is found.)
    orphans = list(Job.objects.using(db).orphaned().values_list("pk", flat=True)[:limit])
    if orphans:
        counts["requeued"] += (
            Job.objects.using(db)
            .orphaned()
            .filter(pk__in=orphans)
            .update(claim_token="", attempts=F("attempts") - 1)
        )
    return counts


# --- external calls ---------------------------------------------------------------------------


def mark_sending(
    claim: Claim, job: Job, source_live: Q | Exists, events: Sequence[JobEvent] = ()
) -> bool:
    """Commit 'sending' for an external call, only while the source record is still live.

    ``events``: the attempt's events so far (claimed, checked), written before 'sending'.
    """
    with transaction.atomic(using=claim.using):
        if not _mine(claim, [job.pk]).filter(source_live).update(sending_at=Now()):
            return False
        rows = [*events, event_row(job, Event.SENDING, worker=claim.worker, at=claim.db_now())]
        JobEvent.objects.using(claim.using).bulk_create(rows)
    return True


def mark_sent(claim: Claim, job: Job) -> bool:
    with transaction.atomic(using=claim.using):
        if not _mine(claim, [job.pk]).update(sent_at=Now()):
            return False
        sent = event_row(job, Event.SENT, worker=claim.worker, at=claim.db_now())
        sent.save(using=claim.using)
    return True


def clear_sending(claim: Claim, job: Job) -> None:
    """The handler stated nothing was delivered: the call may be retried."""
    _mine(claim, [job.pk]).update(sending_at=None)


# --- identity and logging ---------------------------------------------------------------------


def record_ref(content_type_id: int, object_id: str) -> str:
    """``app_label.model:pk`` from the (cached) content type: ids only."""
    from django.contrib.contenttypes.models import ContentType

    ct = ContentType.objects.get_for_id(content_type_id)
    return f"{ct.app_label}.{ct.model}:{object_id}"


def announce(job: Job, status: str, reason: str, found: Found) -> None:
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
    level = _LEVELS.get(status, logging.WARNING)
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
