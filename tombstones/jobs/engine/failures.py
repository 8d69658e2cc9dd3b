"""What a handler's failure or a lost fence means for its job, and the failure's log line."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError

from ...conf import tombstone_settings
from ...exceptions import TransientError
from ...logfields import job_fields
from ...records.fencing import Observation, State
from ..ledger import Outcome
from .attempt import Attempt, Reason, Status, error_class, error_trace
from .savepoints import in_failed_transaction

logger = logging.getLogger("tombstones")

# Exceptions that mean "temporary, nothing was written or sent": retried with backoff.
TRANSIENT = (TransientError, TimeoutError, ConnectionError)


def after_error(attempt: Attempt, exc: Exception, first: BaseException | None) -> Outcome:
    """What the handler's error means for its job (its writes rolled back)."""
    if in_failed_transaction(exc):
        # A statement refused because of an earlier database error the handler swallowed.
        return broke_transaction(attempt, first if first is not exc else None)
    if isinstance(exc, TRANSIENT):
        log_failure(attempt, exc, "retried")
        return retry(attempt, Reason.TRANSIENT, error_class(exc), exc)
    if isinstance(exc, IntegrityError):
        # A constraint the handler broke will break again: not temporary.
        return failed(attempt, exc)
    if isinstance(exc, DatabaseError):
        # Deadlock, lock timeout, serialization failure: rolled back, retried.
        log_failure(attempt, exc, "retried")
        return retry(attempt, Reason.TRANSIENT, error_class(exc), exc)
    return failed(attempt, exc)


def broke_transaction(attempt: Attempt, first: BaseException | None) -> Outcome:
    """The handler caught a database error and went on: on PostgreSQL its transaction is then
    unusable and nothing it wrote can commit. Its own failure, never a pause or a retry."""
    if first is not None:
        log_failure(attempt, first, "failed")
    return attempt.end(
        Status.FAILED,
        Reason.TRANSACTION_BROKEN,
        error_class=error_class(first) if first is not None else "",
        error_trace=error_trace(first) if first is not None else "",
        erase_params=True,
    )


def failed(attempt: Attempt, exc: BaseException) -> Outcome:
    log_failure(attempt, exc, "failed")
    return attempt.end(
        Status.FAILED,
        Reason.HANDLER_ERROR,
        error_class=error_class(exc),
        error_trace=error_trace(exc),
        erase_params=True,
    )


def retry(
    attempt: Attempt, reason: str, error: str = "", exc: BaseException | None = None
) -> Outcome:
    """Retried after a backoff, or failed once the job was claimed TOMBSTONES_MAX_ATTEMPTS times.
    ``exc``: the error that made it (its trace is kept)."""
    job = attempt.job
    trace = error_trace(exc) if exc is not None else ""
    if job.attempts >= tombstone_settings.MAX_ATTEMPTS:
        return attempt.end(
            Status.FAILED,
            Reason.RETRIES_EXHAUSTED,
            error_class=error,
            error_trace=trace,
            erase_params=True,
        )
    delay = tombstone_settings.backoff(job.attempts)
    return attempt.end(
        Status.RETRY_WAIT, reason, error_class=error, error_trace=trace, retry_in=delay
    )


def rejection(attempt: Attempt, seen: Observation) -> Outcome:
    """The record is not the job's any more: a tombstone, another generation, or gone."""
    found = (seen.generation, seen.version)
    if seen.state == State.TOMBSTONE:
        reason = Reason.SOURCE_DELETED
    elif seen.state == State.GENERATION_CHANGED:
        reason = Reason.GENERATION_CHANGED
    else:
        return attempt.end(Status.ESCALATED, Reason.RECORD_MISSING, found=found, erase_params=True)
    return attempt.end(Status.REJECTED, reason, found=found, erase_params=True)


def log_failure(attempt: Attempt, exc: BaseException, then: str) -> None:
    """The handler's error for a developer: class and traceback frames (file, line, function).

    The message and the frames' locals may carry personal data: only with
    ``TOMBSTONES_LOG_ERROR_DETAILS`` (default: ``DEBUG``).
    """
    frames = traceback.extract_tb(exc.__traceback__)
    where = [f"{f.filename}:{f.lineno} in {f.name}" for f in frames]
    details = tombstone_settings.LOG_ERROR_DETAILS
    if details is None:
        details = bool(settings.DEBUG)
    extra: dict[str, Any] = {
        "error_class": error_class(exc),
        "frames": where,
    }
    text = f"job {attempt.job.pk} handler {attempt.job.handler} raised {error_class(exc)} ({then})"
    if details:
        extra["error_message"] = str(exc)
        extra["locals"] = _locals(exc)
        text += f": {exc}"
    lines = "\n".join(f"  {w}" for w in where)
    level = logging.WARNING if then == "retried" else logging.ERROR
    # The status the job is in as the handler raised (running); the outcome's line follows.
    fields = job_fields(attempt.job, reason=Reason.HANDLER_ERROR, **extra)
    logger.log(level, "%s\n%s", text, lines, extra=fields)


def _locals(exc: BaseException) -> list[dict[str, str]]:
    found = []
    tb = exc.__traceback__
    while tb is not None:
        found.append({name: _short(value) for name, value in tb.tb_frame.f_locals.items()})
        tb = tb.tb_next
    return found


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that raises must not hide the handler's error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 200 else text[:197] + "..."
