"""A job as Django's ``TaskResult``: a view of the ledger, never a second record of it.

Queued, retry-waiting and paused jobs are READY, running ones RUNNING, succeeded ones SUCCESSFUL;
every other end is FAILED, with a ``TaskError`` naming the exception class the task raised, or
the library's class for the outcome, and its reason code. A rejection is never SUCCESSFUL.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..jobs.states import Event, Reason, Status
from ..logfields import fence_text
from .arguments import stored
from .compat import TaskError, TaskResult, TaskResultStatus

if TYPE_CHECKING:
    from ..jobs.models import Job
    from .task import TombstoneTask

STATUSES: dict[str, TaskResultStatus] = {
    Status.QUEUED: TaskResultStatus.READY,
    Status.RETRY_WAIT: TaskResultStatus.READY,
    Status.PAUSED: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
}

_EXC = "tombstones.exceptions."
# The library's exception class for each reason of a job that did not succeed ...
ERROR_CLASSES: dict[str, str] = {
    Reason.SOURCE_DELETED: _EXC + "RecordDeleted",
    Reason.DELETED_DURING_SEND: _EXC + "RecordDeleted",
    Reason.GENERATION_CHANGED: _EXC + "GenerationChanged",
    Reason.STALE_VERSION: _EXC + "StaleVersion",
    Reason.MISSING_FENCE: _EXC + "MissingFence",
    Reason.RECORD_MISSING: _EXC + "RecordMissing",
    Reason.OBJECT_ID_INVALID: _EXC + "RecordMissing",  # no record can have that pk
    Reason.HANDLER_UNKNOWN: _EXC + "UnknownHandler",
    Reason.QUEUE_EXPIRED: _EXC + "JobExpired",
    Reason.OUTCOME_UNKNOWN: _EXC + "OutcomeUncertain",
    Reason.CANCELLED_BY_STAFF: _EXC + "JobCancelled",
    Reason.COALESCED: _EXC + "JobSuperseded",
}
# ... and for each status, when its reason names none.
STATUS_ERROR_CLASSES: dict[str, str] = {
    Status.UNCERTAIN: _EXC + "OutcomeUncertain",
    Status.SUPERSEDED: _EXC + "OutcomeUncertain",
    Status.EXPIRED: _EXC + "JobExpired",
    Status.CANCELLED: _EXC + "JobCancelled",
}


def status_of(job: Job) -> TaskResultStatus:
    return STATUSES.get(job.status, TaskResultStatus.FAILED)


def errors_of(job: Job) -> list[TaskError]:
    """One TaskError for a job that ended without succeeding: the exception class the task
    raised (or the library's class for the outcome) and the traceback the ledger keeps (frames
    and class, never the message or a frame's locals), then a line with the status, the reason
    code and the ids."""
    if status_of(job) != TaskResultStatus.FAILED:
        return []
    # An uncertain end is uncertain whatever its reason (deleted_during_send: sent all the same).
    # (A coalesced job is superseded without being uncertain: its reason says so.)
    cls = None if job.reason == Reason.COALESCED else STATUS_ERROR_CLASSES.get(job.status)
    if cls is None and job.reason in RAISED:
        cls = _importable(job.error_class)
    cls = cls or ERROR_CLASSES.get(job.reason)
    text = f"job {job.pk} {job.status}: {job.reason or '-'}"
    # A plain task has no record and so no fence: nothing to say rather than "gNone/vNone".
    if job.generation is not None:
        found = (
            f"found {fence_text(job.found_generation, job.found_version)}"
            if job.found_generation is not None
            else "nothing found"  # ended before its check read the record
        )
        text += f" (expected {fence_text(job.generation, job.version)}, {found})"
    if job.error_class:
        text += f"; the handler raised {job.error_class}"
    trace = job.error_trace if isinstance(job.error_trace, str) else ""
    return [
        TaskError(
            exception_class_path=cls or _EXC + "JobFailed",
            traceback=f"{trace}{text}" if trace else text,
        )
    ]


# Failures whose error_class is what the task raised (or, out of attempts, its last error).
RAISED = frozenset({Reason.HANDLER_ERROR, Reason.RETRIES_EXHAUSTED, Reason.TRANSACTION_BROKEN})
_classes: dict[str, str | None] = {}


def _importable(path: str) -> str | None:
    """``path`` if it names an exception class that can be imported here (Django's
    ``TaskError.exception_class`` imports it), else None: the library's class stands in (a
    class defined in a function, or gone since)."""
    if not path:
        return None
    if path not in _classes:
        from django.utils.module_loading import import_string

        try:
            found = import_string(path)
        except ImportError:
            found = None
        ok = isinstance(found, type) and issubclass(found, BaseException)
        _classes[path] = path if ok else None
    return _classes[path]


def result_for(
    job: Job,
    task: TombstoneTask,
    backend: str,
    *,
    claims: list[tuple[str, datetime]] | None = None,
    status: TaskResultStatus | None = None,
) -> TaskResult:
    """The job's TaskResult. ``claims``: (worker, time) of each claim, oldest first (read from
    the ledger's ``claimed`` events when not given)."""
    if claims is None:
        claims = claims_of(job)
    workers = [worker for worker, _ in claims]
    args, kwargs = stored(job)
    result: TaskResult = TaskResult(
        task=task,
        id=str(job.pk),
        status=status or status_of(job),
        enqueued_at=_when(job.created_at),
        started_at=_when(claims[0][1]) if claims else None,
        finished_at=_when(job.finished_at),
        last_attempted_at=_when(claims[-1][1]) if claims else None,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=errors_of(job),
        worker_ids=workers,
    )
    if result.status == TaskResultStatus.SUCCESSFUL:
        # Kept in the job's params (.running.keep_return_value): None once they are erased.
        object.__setattr__(result, "_return_value", (job.params or {}).get("return"))
    return result


def first_claim(job: Job) -> bool:
    """The job's running claim is its first: claimed once, and nothing gave it back with a
    reason (a take-back, a crash), so no earlier claim left an event. Its row holds the claim."""
    return job.attempts == 1 and job.reason == Reason.NONE and job.started_at is not None


def claims_of(job: Job, *, running: bool | None = None) -> list[tuple[str, datetime]]:
    """(worker, time) of each claim of the job, oldest first: the recorded ones, and the one
    running now (its event is written with its outcome; its row holds it meanwhile). A plain
    success keeps its one claim in its row (Job.row_events). A first claim running reads
    nothing: its row is all there is."""
    if running is None:
        running = job.status == Status.RUNNING
    if running and first_claim(job):
        return [(job.owner, job.started_at)]  # type: ignore[list-item]
    found = list(
        job.events.filter(event=Event.CLAIMED)
        .order_by("created_at", "id")
        .values_list("worker", "created_at")
    )
    # A plain success stores no events for its last claim: its row holds it.
    found += [(e.worker, e.created_at) for e in job.row_events() if e.event == Event.CLAIMED]
    if running and job.started_at is not None:
        found.append((job.owner, job.started_at))
    return found


def _when(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else None
