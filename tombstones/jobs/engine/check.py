"""The check: one plain read per model of the claimed jobs' records (no lock, outside the act's
transaction), and the stop conditions. A job that must not act gets its outcome here.

The check holds nothing: the fence is the write (:mod:`.group`), so a delete or an edit landing
after the check makes the job's write match 0 rows.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

from django.db import DatabaseError

from ...conf import tombstone_settings
from ...exceptions import UnknownHandler
from ...logfields import job_fields
from ...records import rows
from ..ledger import Outcome
from ..models import Job
from ..registry import Handler, get_handler, registered
from .attempt import Attempt, Event, Reason, Status, Step, error_class

logger = logging.getLogger("tombstones")

Records = dict[tuple[int | None, str], Any]
# What read_records() finds for a job whose object_id is no value of its model's pk.
NOT_A_PK: Any = object()


def record_key(job: Job) -> tuple[int | None, str]:
    return (job.content_type_id, job.object_id)


def read_records(jobs: Sequence[Job], *, using: str) -> Records:
    """One plain read per model of the jobs' records, tombstones included (no lock).

    An object_id the model's pk cannot hold (a row written by hand) is left out of the read, so
    that its job alone fails (``NOT_A_PK``) and the others of the read run."""
    wanted: dict[Any, set[str]] = defaultdict(set)
    for job in jobs:
        wanted[job.content_type].add(job.object_id)
    found: Records = {}
    for content_type, pks in wanted.items():
        model = content_type.model_class()
        if model is None or not hasattr(model, "all_objects"):
            continue
        valid = {pk for pk in pks if rows.is_pk(model, pk, using)}
        found.update({(content_type.pk, pk): NOT_A_PK for pk in pks - valid})
        if valid:
            for record in model.all_objects.using(using).filter(pk__in=valid):
                found[(content_type.pk, str(record.pk))] = record
    return found


def check_all(attempts: Sequence[Attempt]) -> None:
    """Read the records of the attempts not checked yet, and apply the stop conditions.

    A job that must not act is ``STOPPED`` with its ``stop`` (recorded with its group); the
    others are ``CHECKED``, with the record to act on and their ``checked`` event.
    """
    todo = [a for a in attempts if a.step == Step.CLAIMED]
    if not todo:
        return
    for attempt in todo:
        attempt.step = Step.CHECKING  # a crash in its stops is its own
        if not _stopped(attempt, before_reading(attempt)) and attempt.job.is_plain:
            attempt.step = Step.CHECKED  # no record to read: it acts on none
    readable = [a for a in todo if a.step == Step.READING]
    if not readable:
        return
    # A crash in the read is a job's own only when it is read alone.
    if len(readable) == 1:
        readable[0].step = Step.CHECKING
    try:
        records = read_records([a.job for a in readable], using=todo[0].claim.using)
    except DatabaseError as exc:
        for attempt in readable:
            _stopped(attempt, unreadable(attempt, exc))
        return
    for attempt in readable:
        record: Any = records.get(record_key(attempt.job))
        if _stopped(attempt, against(attempt, record)):
            continue
        attempt.record = record  # against() let it through: the record exists
        attempt.step = Step.CHECKED
        attempt.event(Event.CHECKED, found=(record.generation, record.version))


def _stopped(attempt: Attempt, stop: Outcome | None) -> bool:
    """Whether the check stops the attempt; it reads on (``READING``) otherwise."""
    attempt.stop = stop
    attempt.step = Step.READING if stop is None else Step.STOPPED
    return stop is not None


def before_reading(attempt: Attempt) -> Outcome | None:
    """The stop conditions that need no read of the record."""
    job = attempt.job
    if not job.is_fenced and not job.is_plain:
        return attempt.end(Status.ESCALATED, Reason.MISSING_FENCE, erase_params=True)
    too_old = bool(getattr(job, "too_old", False))
    try:
        attempt.handler = get_handler(job.handler)
    except UnknownHandler:
        if too_old:
            # No worker knew it for TOMBSTONES_JOB_MAX_AGE: not a deploy any more.
            return attempt.end(Status.ESCALATED, Reason.HANDLER_UNKNOWN, erase_params=True)
        return _park(attempt)
    if job.is_plain and not attempt.handler.plain:
        # A job for no record, of a handler that needs one: written by hand, or a bug.
        return attempt.end(Status.ESCALATED, Reason.MISSING_FENCE, erase_params=True)
    if too_old:
        return attempt.end(Status.EXPIRED, Reason.QUEUE_EXPIRED, erase_params=True)
    return None


def _park(attempt: Attempt) -> Outcome:
    """A handler this worker does not know: a deploy in progress, most likely (new code on the
    web, old code here). The job waits, uncharged and holding its lane, for a worker that knows
    it; longer the longer nobody does."""
    job = attempt.job
    delay = tombstone_settings.unknown_handler_wait(job_age(attempt))
    logger.warning(
        "job %s: this worker has no handler %r; it waits %ss for a worker that has one. During "
        "a deploy this needs nothing. If the handler or task was added since this worker "
        "started, restart the workers: qcluster loads code only when it starts (in development, "
        "run it under watchfiles to restart it on changes). A handler that no worker has is "
        "not registered (check its module is imported); such a job is escalated after "
        "TOMBSTONES_JOB_MAX_AGE.",
        job.pk,
        job.handler,
        int(delay.total_seconds()),
        extra=job_fields(job, Status.RETRY_WAIT, Reason.HANDLER_UNKNOWN, known=_known()),
    )
    return attempt.end(Status.RETRY_WAIT, Reason.HANDLER_UNKNOWN, retry_in=delay, refund=True)


def _known() -> int:
    return len(registered())


def job_age(attempt: Attempt) -> float:
    """Seconds since the job was enqueued (the database's clock)."""
    created = attempt.job.created_at
    if created is None:
        return 0.0
    return max((attempt.claim.db_now() - created).total_seconds(), 0.0)


def against(attempt: Attempt, record: Any | None) -> Outcome | None:
    """The job against its record as read: None when it may act on it."""
    job = attempt.job
    if record is None:
        return attempt.end(Status.ESCALATED, Reason.RECORD_MISSING, erase_params=True)
    if record is NOT_A_PK:
        return attempt.end(Status.ESCALATED, Reason.OBJECT_ID_INVALID, erase_params=True)
    found = (record.generation, record.version)
    if record.generation != job.generation:
        return attempt.end(
            Status.REJECTED, Reason.GENERATION_CHANGED, found=found, erase_params=True
        )
    handler = cast(Handler, attempt.handler)
    if record.deleted_at is not None and not handler.accepts_tombstones:
        return attempt.end(Status.REJECTED, Reason.SOURCE_DELETED, found=found, erase_params=True)
    return None


def unreadable(attempt: Attempt, exc: BaseException) -> Outcome:
    """The record could not be read: state unknown, never assumed live. Paused (resumed by the
    sweep), and like any other claim it counts against TOMBSTONES_MAX_ATTEMPTS."""
    if attempt.job.attempts >= tombstone_settings.MAX_ATTEMPTS:
        return attempt.end(
            Status.FAILED,
            Reason.RETRIES_EXHAUSTED,
            error_class=error_class(exc),
            erase_params=True,
        )
    return attempt.end(Status.PAUSED, Reason.TOMBSTONE_UNREADABLE, error_class=error_class(exc))
