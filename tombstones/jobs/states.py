"""The job table's vocabulary, written once: statuses, reasons, events and their groups.

The engine, the ledger, the queries and the admin all import it; it imports nothing of theirs.
``Job.Status``, ``Job.Reason`` and ``JobEvent.Event`` are these same classes.
"""

from __future__ import annotations

from django.db import models


class Status(models.TextChoices):
    QUEUED = "queued"  # waiting for a worker (or for its lane's earlier jobs)
    RUNNING = "running"  # claimed by a worker under a lease
    SUCCEEDED = "succeeded"  # the fenced write or the external call went through
    REJECTED = "rejected"  # the record was deleted or re-created: never retried
    RETRY_WAIT = "retry_wait"  # temporary failure before any write; retried with backoff
    PAUSED = "paused"  # the record could not be read: state unknown, resumed later
    UNCERTAIN = "uncertain"  # an external call may or may not have landed: staff decide
    # Never repeated, never run: an uncertain external call overtaken by a later job of its
    # lane, which sends the record's newer state; or a coalescing handler's job that a newer
    # one for its record replaced before it started (reason coalesced).
    SUPERSEDED = "superseded"
    ESCALATED = "escalated"  # a stop condition: an operator acts
    EXPIRED = "expired"  # waited longer than TOMBSTONES_JOB_MAX_AGE
    FAILED = "failed"  # the handler raised a non-temporary error, or retries ran out
    CANCELLED = "cancelled"  # cancelled by staff before it ran


class Reason(models.TextChoices):
    NONE = "", "-"  # no reason: queued, running or succeeded
    SOURCE_DELETED = "source_deleted"  # the record is a tombstone
    GENERATION_CHANGED = "generation_changed"  # the record was re-created since the enqueue
    STALE_VERSION = "stale_version"  # re-reads ran out while the record kept changing
    MISSING_FENCE = "missing_fence"  # the job row has no generation or version
    RECORD_MISSING = "record_missing"  # neither record nor tombstone exists
    OBJECT_ID_INVALID = "object_id_invalid"  # the job's object_id is no value of its model's pk
    TOMBSTONE_UNREADABLE = "tombstone_unreadable"  # a database error while reading the record
    # No handler registered under the job's name: waits (retry_wait, uncharged) for a
    # worker that has it; escalated once older than TOMBSTONES_JOB_MAX_AGE.
    HANDLER_UNKNOWN = "handler_unknown"
    QUEUE_EXPIRED = "queue_expired"  # older than the maximum queue age
    OUTCOME_UNKNOWN = "outcome_unknown"  # timeout or crash after an external call was sent
    DELETED_DURING_SEND = "deleted_during_send"  # the record was deleted during the send
    RETRIES_EXHAUSTED = "retries_exhausted"  # temporary failures past TOMBSTONES_MAX_ATTEMPTS
    HANDLER_ERROR = "handler_error"  # the handler raised; its writes rolled back
    # The handler caught a database error and went on: its transaction could not commit.
    TRANSACTION_BROKEN = "transaction_broken"
    TRANSIENT = "transient"  # a temporary failure (retry_wait)
    LEASE_EXPIRED = "lease_expired"  # the worker vanished; returned to the queue
    CRASHED = "crashed"  # its claim ended without an outcome (the worker died or exited)
    CANCELLED_BY_STAFF = "cancelled_by_staff"  # cancelled in the admin
    # A newer job of its record, handler and coalescing key was queued before it started.
    COALESCED = "coalesced"


# Not finished yet: the job still has a place in its lane (see tombstones.jobs.queries).
QUEUED = Status.QUEUED
RUNNING = Status.RUNNING
RETRY_WAIT = Status.RETRY_WAIT
PAUSED = Status.PAUSED
# Statuses that hold a lane: no other job of it runs until this one moves on.
HOLDING = (Status.RUNNING, Status.RETRY_WAIT, Status.PAUSED)
UNFINISHED = (Status.QUEUED, *HOLDING)
# Unfinished and not running: waiting for a worker, a retry or a resume.
WAITING = (Status.QUEUED, Status.RETRY_WAIT, Status.PAUSED)
# Statuses a worker may claim.
CLAIMABLE = (Status.QUEUED, Status.RETRY_WAIT)
TERMINAL = (
    Status.SUCCEEDED,
    Status.REJECTED,
    Status.UNCERTAIN,
    Status.SUPERSEDED,
    Status.ESCALATED,
    Status.EXPIRED,
    Status.FAILED,
    Status.CANCELLED,
)
# A claim that ended without an outcome: such a job is claimed alone next time.
SUSPECT = (Reason.LEASE_EXPIRED, Reason.CRASHED)
# A claim's jobs: its heads (running) and its lane followers (queued, reserved by its token).
HELD = (Status.RUNNING, Status.QUEUED)
# Finished, but waiting for staff to decide (the dashboard's lists, the health check).
AWAITING_STAFF = (Status.UNCERTAIN, Status.ESCALATED)


class Event(models.TextChoices):
    # Not stored: the job row records its enqueue (Job.enqueued_event); kept for old rows.
    ENQUEUED = "enqueued"
    CLAIMED = "claimed"  # a worker took the lease
    CHECKED = "checked"  # the record read live at the job's generation
    REREAD = "reread"  # a version conflict: the record was read again
    SENDING = "sending"  # an external call is about to be made
    SENT = "sent"  # the external call returned
    SUCCEEDED = "succeeded"
    REJECTED = "rejected"
    RETRY = "retry"
    PAUSED = "paused"
    UNCERTAIN = "uncertain"
    SUPERSEDED = "superseded"  # overtaken by a later job of its lane (uncertain, coalesced)
    ESCALATED = "escalated"
    EXPIRED = "expired"
    FAILED = "failed"
    REQUEUED = "requeued"  # back in the queue: from a vanished worker, or by staff
    RESUMED = "resumed"  # a paused job was resumed
    CANCELLED = "cancelled"
    RESOLVED = "resolved"  # staff resolved an uncertain job
    SKIPPED = "skipped"  # staff skipped a blocked lane head
    PARAMS_ERASED = "params_erased"  # its record became a tombstone or was purged


# The event that records a change to each status.
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
