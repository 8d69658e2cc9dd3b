"""Outcomes: what became of a job, written by one UPDATE with its events, announced after commit.

One writer (:func:`_write`) behind the three roads that end a claim's hold on a job: a worker's
outcomes (:func:`record`), a change outside a claim by the sweep or staff (:func:`transition`),
and a crash or hand-back (:func:`release`). Log lines and signals follow the commit, with ids,
reason codes and versions in ``extra`` and never a record's field values.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from django.contrib.contenttypes.models import ContentType
from django.db import connections, models, router, transaction
from django.db.models import Case, Exists, F, Q, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery

from ...conf import tombstone_settings
from ...exceptions import LeaseLost
from ...logfields import fence_text, job_fields
from ...signals import job_escalated, job_finished
from .. import tracing
from ..models import Job, JobEvent
from ..states import EVENT_FOR_STATUS, TERMINAL, Event, Reason, Status
from .claims import Claim, given_back, mine, place
from .params import EMPTY_PARAMS, params_after

logger = logging.getLogger("tombstones")

# Log level per outcome: a rejection never reads like a success.
_LEVELS: dict[str, int] = {
    Status.SUCCEEDED: logging.INFO,
    Status.ESCALATED: logging.ERROR,
    Status.FAILED: logging.ERROR,
    Status.CANCELLED: logging.INFO,
    Status.QUEUED: logging.INFO,
}

Found = tuple[int | None, int | None]


@dataclass
class Outcome:
    """What became of one claimed job, and the audit events that lead to it."""

    job: Job
    status: str
    reason: str = Reason.NONE
    found: Found = (None, None)
    error_class: str = ""
    error_trace: str = ""  # a failure's frames and class, never its message or locals
    retry_in: timedelta | None = None  # retry_wait: when it becomes due again
    erase_params: bool = False  # the job ended: nothing of its params is kept (params_after)
    refund: bool = False  # the claim did not count: its attempt is given back
    writes: int = 0
    events: list[JobEvent] = field(default_factory=list)
    # A plain success keeps its trail in its row: the version its check found (Job.row_events).
    checked_version: int | None = None

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


def write_outcomes(claim: Claim, outcomes: Sequence[Outcome]) -> None:
    """Record the outcomes of claimed jobs: one UPDATE, one INSERT of their events.

    Call it inside the transaction that made the handlers' writes: both commit or neither.
    Raises LeaseLost unless every job is still this claim's, so a zombie's writes roll back.
    """
    if not outcomes:
        return
    for outcome in outcomes:
        if _kept_in_row(outcome):
            outcome.checked_version = next(
                (e.found_version for e in outcome.events if e.event == Event.CHECKED), None
            )
            outcome.events = []  # its row is its trail (Job.row_events)
            continue
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
    matched = _write(mine(claim, [o.job_id for o in outcomes]), outcomes, claim.using)
    if matched != len(outcomes):
        raise LeaseLost(model="tombstones.Job", pk=[o.job_id for o in outcomes])
    _after(outcomes, claim.using)


# The events a plain success has before its outcome: its row holds them, and the outcome.
_ROW_EVENTS = frozenset({Event.CLAIMED, Event.CHECKED})


def _kept_in_row(outcome: Outcome) -> bool:
    """An internal job that succeeded at its first claim, without a re-read, stores no events:
    most of the ledger, and nothing an auditor asks of it that its row does not answer
    (:meth:`Job.row_events`)."""
    job = outcome.job
    return (
        outcome.status == Status.SUCCEEDED
        and not job.external
        and job.attempts == 1
        and job.rereads == 0
        and all(e.event in _ROW_EVENTS for e in outcome.events)
        # A plain job checks no record (Job.trail_in_row reads its attempts instead).
        and [e.event for e in outcome.events].count(Event.CHECKED) == (0 if job.is_plain else 1)
    )


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
    erasure = params_after(job, status, db)
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


def _write(qs: models.QuerySet[Job], outcomes: Sequence[Outcome], db: str, **extra: Any) -> int:
    """The one UPDATE that writes outcomes: a column's value, or a CASE on the id when it varies."""
    by_id = {o.job_id: o for o in outcomes}
    terminal = {pk for pk, o in by_id.items() if o.status in TERMINAL}
    fields: dict[str, Any] = {
        "status": _column(db, {pk: str(o.status) for pk, o in by_id.items()}),
        "reason": _column(db, {pk: str(o.reason) for pk, o in by_id.items()}),
        "error_class": _column(db, {pk: o.error_class[:200] for pk, o in by_id.items()}),
        "error_trace": _column(db, {pk: o.error_trace for pk, o in by_id.items()}),
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
    checked = {pk: o.checked_version for pk, o in by_id.items()}
    if any(v is not None for v in checked.values()):
        fields["checked_version"] = _column(db, checked)
    retries = {pk: o.retry_in for pk, o in by_id.items() if o.retry_in is not None}
    if retries:
        fields["run_after"] = Case(
            *[When(pk=pk, then=Now() + Value(delay)) for pk, delay in retries.items()],
            default=F("run_after"),
        )
    fields["ready_at"] = _hints(by_id)
    erase = {pk for pk, o in by_id.items() if o.erase_params}
    if erase:
        fields["params"] = _only(erase, by_id, EMPTY_PARAMS, F("params"))
    refund = {pk for pk, o in by_id.items() if o.refund}
    if refund:
        fields["attempts"] = _only(refund, by_id, F("attempts") - 1, F("attempts"))
    fields.update(extra)
    written = _update_returning(qs, fields, db)
    for outcome in outcomes:
        if outcome.job_id in written:
            _as_written(outcome, written[outcome.job_id])
    if written and "params" in extra:  # an expression the database decided: read it back
        stored = Job.objects.using(db).filter(pk__in=list(written)).values_list("pk", "params")
        for pk, params in stored:
            by_id[pk].job.params = params
    return len(written)


def _update_returning(
    qs: models.QuerySet[Job], fields: dict[str, Any], db: str
) -> dict[int, datetime | None]:
    """``qs.update(**fields)``, returning each changed row's ``finished_at``: the database's
    time, which a receiver of ``job_finished`` reads from the job it is sent (no SELECT after)."""
    query = cast(UpdateQuery, qs.query.chain(UpdateQuery))
    query.add_update_values(fields)
    sql, params = query.get_compiler(db).as_sql()
    if not sql:
        return {}
    conn = connections[db]
    returning = f"{conn.ops.quote_name('id')}, {conn.ops.quote_name('finished_at')}"
    with conn.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {returning}", params)
        rows = cursor.fetchall()
    # SQLite returns datetimes as text: its backend's converter (PostgreSQL's are typed).
    convert = getattr(conn.ops, "convert_datetimefield_value", None)
    column = Job._meta.get_field("finished_at")
    return {
        pk: convert(at, column, conn) if convert is not None and at is not None else at
        for pk, at in rows
    }


def _as_written(outcome: Outcome, finished_at: datetime | None) -> None:
    """The job's instance as its row now is, in what a finished job's receivers read."""
    job = outcome.job
    job.status, job.reason = outcome.status, outcome.reason
    job.error_class = outcome.error_class[:200]
    job.error_trace = outcome.error_trace
    job.finished_at = finished_at
    job.lease_expires_at, job.claim_token = None, ""
    if outcome.found != (None, None):
        job.found_generation, job.found_version = outcome.found
    if outcome.checked_version is not None:
        job.checked_version = outcome.checked_version
    if outcome.erase_params:
        job.params = {}
    if outcome.refund:
        job.attempts -= 1


def _hints(by_id: dict[int, Outcome]) -> Any:
    """When a claim should look at each job's lane: now (it ended, or went back to the queue),
    when its retry is due (it keeps holding its lane), or never for a paused job (its resume
    hints).

    Of the jobs of one lane written together only the last in lane order hints: it ended or
    went back (its hint says "now"), or it holds the lane (its retry or resume hints when it
    moves on). The hints of the others would say nothing more, and each costs the next claim a
    row to clear (a hot lane's group: 50 of them)."""
    last: dict[str, Outcome] = {}
    for o in sorted(by_id.values(), key=lambda o: place(o.job)):
        last[o.job.lane] = o  # in lane order: the lane's last one stays
    silent = {
        pk for pk, o in by_id.items() if o.status == Status.PAUSED or last[o.job.lane] is not o
    }
    cases = [
        When(pk=pk, then=Now() + Value(o.retry_in))
        for pk, o in by_id.items()
        if o.retry_in is not None and pk not in silent
    ]
    if silent:
        none = Value(None, output_field=models.DateTimeField())
        cases.insert(0, When(pk__in=sorted(silent), then=none))
    if not cases:
        return Now()
    return Case(*cases, default=Now(), output_field=models.DateTimeField())


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


# --- crashes and hand-backs -------------------------------------------------------------------


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
            back = given_back()
            if suspects:
                back["reason"] = Reason.CRASHED
            mine(claim, [job.pk for job in others]).update(**back)
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
            if _write(mine(claim, [culprit.pk]).exclude(sending), [outcome], db):
                _after([outcome], db)
            else:  # its external call was sent: the outcome is unknown, never repeated
                uncertain = Outcome(
                    culprit, Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN, error_class=error_class
                )
                uncertain.events = [
                    event_row(culprit, Event.UNCERTAIN, Reason.OUTCOME_UNKNOWN, at=claim.db_now())
                ]
                params = params_after(culprit, Status.UNCERTAIN, db)
                sent = mine(claim, [culprit.pk]).filter(sending)
                if _write(sent, [uncertain], db, params=params):
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


# --- identity and logging ---------------------------------------------------------------------


def record_ref(content_type_id: int | None, object_id: str) -> str:
    """``app_label.model:pk`` from the (cached) content type: ids only; "-" for a plain job."""
    if content_type_id is None:
        return "-"
    ct = ContentType.objects.get_for_id(content_type_id)
    return f"{ct.app_label}.{ct.model}:{object_id}"


def announce(job: Job, status: str, reason: str, found: Found) -> None:
    """Log the outcome (after commit) and send the signals."""
    extra = {
        "job_id": job.pk,
        "handler": job.handler,
        "queue": job.queue,
        "record": record_ref(job.content_type_id, job.object_id),
        "status": status,
        "reason": reason,
        "expected_generation": job.generation,
        "expected_version": job.version,
        "found_generation": found[0],
        "found_version": found[1],
    }
    # A coalesced job is the feature working (the web process logs it): no warning.
    level = logging.INFO if reason == Reason.COALESCED else _LEVELS.get(status, logging.WARNING)
    message = (
        "job %(job_id)s %(status)s reason=%(reason)s handler=%(handler)s record=%(record)s "
        "expected=%(expected)s found=%(found)s"
    )
    # Their own keys: a plain job has no fence (never "gNone/vNone").
    args = {**extra, "expected": fence_text(job.generation, job.version)}
    args["found"] = fence_text(found[0], found[1])

    def emit() -> None:
        fields = job_fields(job, status, reason, **extra)
        logger.log(level, message, args, extra=fields)
        tracing.job_ran(job, status, reason)
        if status in TERMINAL:
            job_finished.send(sender=Job, job=job, status=status, reason=reason)
        if status == Status.ESCALATED:
            job_escalated.send(sender=Job, job=job, reason=reason)

    transaction.on_commit(emit, using=job._state.db)
