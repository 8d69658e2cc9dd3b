"""The job ledger (``Job``, ``JobEvent``) and the public record mixin."""

from __future__ import annotations

from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.db.models.functions import Now

from . import job_query
from .job_query import JobQuerySet
from .records import TombstoneModel

__all__ = ["Dashboard", "Job", "JobEvent", "Rejection", "TombstoneModel"]


class Job(models.Model):
    """One fenced job: the record it is for, the (generation, version) snapshot, its outcome."""

    class Status(models.TextChoices):
        QUEUED = "queued"  # waiting for a worker (or for its lane's earlier jobs)
        RUNNING = "running"  # claimed by a worker under a lease
        SUCCEEDED = "succeeded"  # the fenced write or the external call went through
        REJECTED = "rejected"  # the record was deleted or re-created: never retried
        RETRY_WAIT = "retry_wait"  # temporary failure before any write; retried with backoff
        PAUSED = "paused"  # the record could not be read: state unknown, resumed later
        UNCERTAIN = "uncertain"  # an external call may or may not have landed: staff decide
        # An uncertain external call overtaken by a later job of its lane, which sends the
        # record's newer state: never repeated, nothing for staff to decide.
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

    # Not finished yet: the job still has a place in its lane (see tombstones.job_query).
    UNFINISHED = job_query.UNFINISHED
    # Statuses that hold a lane: no other job of it runs meanwhile.
    HOLDING = job_query.HOLDING
    # Statuses a worker may claim.
    CLAIMABLE = job_query.CLAIMABLE
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

    handler = models.CharField(max_length=200, db_index=True)
    content_type = models.ForeignKey(ContentType, on_delete=models.PROTECT, related_name="+")
    object_id = models.CharField(max_length=64, db_index=True)
    generation = models.PositiveIntegerField(null=True, help_text="Snapshot at enqueue.")
    version = models.PositiveIntegerField(null=True, help_text="Snapshot at enqueue.")
    lane = models.CharField(
        "ordering key", max_length=255, help_text="Jobs of one key run one at a time, in order."
    )
    status = models.CharField(max_length=16, choices=Status, default=Status.QUEUED, db_index=True)
    reason = models.CharField(max_length=32, choices=Reason, default=Reason.NONE, blank=True)
    error_class = models.CharField(max_length=200, blank=True, help_text="Exception class only.")
    params = models.JSONField(default=dict, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    rereads = models.PositiveIntegerField(default=0)
    external = models.BooleanField(default=False)
    created_at = models.DateTimeField(db_default=Now(), db_index=True)
    run_after = models.DateTimeField(db_default=Now(), help_text="Not claimable before.")
    queued_at = models.DateTimeField(
        db_default=Now(),
        help_text="Its place in its lane: the enqueue, or a delayed job's due time.",
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    owner = models.CharField(max_length=200, blank=True, help_text="Worker holding the lease.")
    claim_token = models.CharField(max_length=32, blank=True)
    sending_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    found_generation = models.PositiveIntegerField(null=True, blank=True)
    found_version = models.PositiveIntegerField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ("-id",)
        indexes = [
            models.Index(
                fields=["lane", "queued_at", "id"],
                name="tombstones_job_lane_place",
                condition=models.Q(status__in=["queued", "running", "retry_wait", "paused"]),
            ),
            models.Index(fields=["status", "run_after"], name="tombstones_job_due"),
            models.Index(fields=["content_type", "object_id"], name="tombstones_job_record"),
        ]
        constraints = [
            # At most one running job per lane, enforced by the database itself.
            models.UniqueConstraint(
                fields=["lane"],
                condition=models.Q(status="running"),
                name="tombstones_job_one_running_per_lane",
            ),
        ]
        # Staff actions in the admin, each checked on its own (view-only auditors have none).
        permissions = [
            ("resolve_job", "Can resolve an uncertain job (delivered, or resend once)"),
            ("resume_job", "Can resume a paused job"),
            ("cancel_job", "Can cancel a queued job"),
            ("skip_lane_head", "Can skip the blocked head of a lane"),
        ]

    def __str__(self) -> str:
        return f"Job {self.pk} ({self.handler})"

    @property
    def sequence(self) -> int:
        """Enqueue order: ties of ``queued_at`` within a lane are broken by it."""
        return int(self.pk)

    @property
    def record_ref(self) -> str:
        """``app_label.model:pk`` — ids only, never field values."""
        return f"{self.content_type.app_label}.{self.content_type.model}:{self.object_id}"

    @property
    def idempotency_key(self) -> str:
        """Stable for the job across any manual resend."""
        return f"tombstones-job-{self.pk}-g{self.generation}"

    @property
    def is_fenced(self) -> bool:
        return self.generation is not None and self.version is not None

    def enqueued_event(self) -> JobEvent:
        """The enqueue as an (unsaved) event: the job row itself is the record of it."""
        return JobEvent(
            job=self,
            content_type_id=self.content_type_id,
            object_id=self.object_id,
            event=JobEvent.Event.ENQUEUED,
            expected_generation=self.generation,
            expected_version=self.version,
            created_at=self.created_at,
        )

    def history(self) -> list[JobEvent]:
        """The job's audit trail in order: its enqueue, then its stored events."""
        return [self.enqueued_event(), *self.events.order_by("created_at", "id")]


class JobEvent(models.Model):
    """Append-only audit trail of a job: what was expected, what was found, and when."""

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
        SUPERSEDED = "superseded"  # an uncertain call overtaken by a later job of its lane
        ESCALATED = "escalated"
        EXPIRED = "expired"
        FAILED = "failed"
        REQUEUED = "requeued"  # back in the queue: from a vanished worker, or by staff
        RESUMED = "resumed"  # a paused job was resumed
        CANCELLED = "cancelled"
        RESOLVED = "resolved"  # staff resolved an uncertain job
        SKIPPED = "skipped"  # staff skipped a blocked lane head
        PARAMS_ERASED = "params_erased"  # its record became a tombstone or was purged

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    content_type = models.ForeignKey(ContentType, on_delete=models.PROTECT, related_name="+")
    object_id = models.CharField(max_length=64)
    event = models.CharField(max_length=16, choices=Event)
    reason = models.CharField(max_length=32, choices=Job.Reason, default="", blank=True)
    expected_generation = models.PositiveIntegerField(null=True, blank=True)
    expected_version = models.PositiveIntegerField(null=True, blank=True)
    found_generation = models.PositiveIntegerField(null=True, blank=True)
    found_version = models.PositiveIntegerField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(db_default=Now(), db_index=True)

    class Meta:
        ordering = ("id",)
        indexes = [models.Index(fields=["event", "created_at"], name="tombstones_event_kind")]

    def __str__(self) -> str:
        return f"{self.event} job={self.job_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise TypeError("JobEvent rows are append-only.")
        super().save(*args, **kwargs)

    @property
    def record_ref(self) -> str:
        return f"{self.content_type.app_label}.{self.content_type.model}:{self.object_id}"


class RejectionManager(models.Manager["Rejection"]):
    def get_queryset(self) -> models.QuerySet[Rejection]:
        return super().get_queryset().filter(event=JobEvent.Event.REJECTED)


class Rejection(JobEvent):
    """The rejection log: the ``rejected`` events only (a proxy, for its own admin entry)."""

    objects = RejectionManager()  # type: ignore[misc]  # narrows JobEvent's default manager

    class Meta:
        proxy = True
        ordering = ("-id",)
        verbose_name = "rejection"
        verbose_name_plural = "rejections"


class Dashboard(Job):
    """The job dashboard's entry in the admin index (a proxy: no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
