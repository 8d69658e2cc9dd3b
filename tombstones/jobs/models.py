"""The job table (``Job``, ``JobEvent``) and its admin proxies (``Rejection``, ``Dashboard``)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.db.models import DurationField, Exists, ExpressionWrapper, F, Min, OuterRef, Q
from django.db.models.functions import Now

from . import queries, states
from .queues import known as known_queues
from .states import CLAIMABLE, HOLDING, QUEUED, RUNNING, SUSPECT, UNFINISHED, WAITING

__all__ = ["Dashboard", "Job", "JobEvent", "Lane", "OutcomeRollup", "Rejection"]

# The lanes of plain jobs (tasks for no record): one lane each, never locked (ledger.insert).
PLAIN_LANE_PREFIX = "plain:"


class JobQuerySet(models.QuerySet["Job"]):
    """The job table's questions, by name (the conditions are :mod:`.queries`')."""

    def unfinished(self) -> JobQuerySet:
        return self.filter(status__in=UNFINISHED)

    def for_record(self, content_type_id: int | None, object_id: Any) -> JobQuerySet:
        return self.filter(content_type_id=content_type_id, object_id=str(object_id))

    def waiting(self) -> JobQuerySet:
        """Unfinished and not running: waiting for a worker, a retry or a resume."""
        return self.filter(status__in=WAITING)

    def unfenced(self) -> JobQuerySet:
        """Without the (generation, version) snapshot a fenced job needs."""
        return self.filter(Q(generation__isnull=True) | Q(version__isnull=True))

    def due(self) -> JobQuerySet:
        """Waiting for a worker (queued or retry_wait) and not held back by ``run_after``."""
        return self.filter(queries.due())

    def too_old(self) -> JobQuerySet:
        """Waited longer than ``TOMBSTONES_JOB_MAX_AGE`` since its enqueue."""
        return self.filter(queries.too_old())

    def lapsed(self) -> JobQuerySet:
        """Running, but its lease ran out: its worker vanished (or stalled)."""
        return self.filter(queries.lapsed())

    def lane_heads(self) -> JobQuerySet:
        """Jobs that no other job of their lane runs before (see the module docstring)."""
        return self.filter(queries.lane_head())

    def claimable(self) -> JobQuerySet:
        """What a worker may take now: due lane heads not reserved by a claim (too old ones
        included: the worker records them expired, so that their lane moves on)."""
        return self.filter(queries.claimable())

    def orphaned(self) -> JobQuerySet:
        """Lane followers reserved by a claim that holds no running job any more: a worker that
        died between its heads' outcomes and giving its followers back."""
        holder = self.model.objects.filter(claim_token=OuterRef("claim_token"), status=RUNNING)
        return self.filter(status=QUEUED).exclude(queries.unclaimed()).exclude(Exists(holder))

    def suspects(self) -> JobQuerySet:
        """Jobs whose last claim ended without an outcome: they are claimed alone next time."""
        return self.filter(status__in=CLAIMABLE, reason__in=SUSPECT)

    def resolved_before(self) -> JobQuerySet:
        """Jobs staff resolved once already: an uncertain job is resent at most once."""
        return self.filter(queries.resolved_before())

    def waiting_behind(self, job: Job) -> JobQuerySet:
        """The unfinished jobs of ``job``'s lane that run after it."""
        same_lane = self.unfinished().filter(lane=job.lane).exclude(pk=job.pk)
        return same_lane.exclude(queries.placed_before(job.queued_at, job.pk))

    def blocking(self, job: Job) -> JobQuerySet:
        """The jobs of ``job``'s lane that keep it from running (empty for a lane head)."""
        same_lane = self.unfinished().filter(lane=job.lane).exclude(pk=job.pk)
        if job.status in HOLDING:
            return same_lane.filter(status__in=HOLDING)
        earlier = queries.placed_before(job.queued_at, job.pk)
        return same_lane.filter(Q(status__in=HOLDING) | (Q(status=QUEUED) & earlier))

    def hinted(self) -> JobQuerySet:
        """Jobs whose lane a claim should look at now (``ready_at`` has come), oldest first: the
        engine's own notion of "something may be due", read from a small index."""
        return self.filter(queries.hinted()).order_by("ready_at", "id")

    def first_hints(self, queues: Iterable[str]) -> dict[str, int]:
        """The job of each of ``queues``' first due hint (queues with none left out)."""
        return self._first_of_each(queues, "id", due=True)

    def oldest_hint_wait(self, queues: Iterable[str] | None = None) -> timedelta | None:
        """How long the oldest due hint of ``queues`` (default: every queue) has waited for a
        claim to look at it; None if none."""
        return max(self.hint_waits(queues).values(), default=None)

    def hint_waits(self, queues: Iterable[str] | None = None) -> dict[str, timedelta]:
        """How long each queue's oldest due hint has waited (queues with none left out): how
        long its longest-due job has waited for a worker, in one index probe per queue."""
        waited = ExpressionWrapper(Now() - F("ready_at"), output_field=DurationField())
        return self._first_of_each(queues, waited, due=True)

    def _first_of_each(
        self, queues: Iterable[str] | None, value: Any, *, due: bool
    ) -> dict[str, Any]:
        """``value`` of the first hint (a due one, with ``due``) of each of ``queues`` (default:
        every queue), queues with none left out: one probe of the hint index per queue, in its
        order (one range of it each, :func:`.queries.hint_range`)."""
        found: dict[str, Any] = {}
        for queue in known_queues() if queues is None else queues:
            hints = self.filter(queries.hint_range(self.db, queue))
            if due:
                hints = hints.filter(queries.hinted())
            first = hints.order_by(*queries.HINT_ORDER).values_list(value, flat=True).first()
            if first is not None:
                found[queue] = first
        return found

    def oldest_due(self) -> JobQuerySet:
        """The due jobs, the one due longest ago first, each with ``waited``: how long it has
        been due (database clock).

        "Due" as the dashboard says it: a worker may take it now (claimable). A job behind
        another of its lane is "behind", and a follower reserved by a claim runs in a moment.
        """
        waited = ExpressionWrapper(Now() - F("run_after"), output_field=DurationField())
        return self.claimable().annotate(waited=waited).order_by("run_after", "id")

    def next_due_in(self, queues: Iterable[str] | None = None) -> timedelta | None:
        """How long until something of ``queues`` (default: every queue) becomes due (a delayed
        job, a retry, a lease's end), in the database's clock; None when nothing waits.

        Reads of small indexes: each queue's first hint (a delayed job's or a retry's lane is
        looked at when it is due) and the jobs claims hold (their leases).
        """
        # Each queue's first hint in the hint index's order (MIN of an expression would read
        # them all).
        waits = self._first_of_each(queues, queries.from_now("ready_at"), due=False)
        lease = self.filter(queries.held()).aggregate(
            at=Min(queries.from_now("lease_expires_at"), filter=Q(status=RUNNING))
        )["at"]
        found = [w for w in (*waits.values(), lease) if w is not None]
        return max(min(found), timedelta(0)) if found else None


class Job(models.Model):
    """One fenced job: the record it is for, the (generation, version) snapshot, its outcome."""

    Status = states.Status
    Reason = states.Reason
    # The status groups (see tombstones.jobs.states).
    UNFINISHED = states.UNFINISHED
    HOLDING = states.HOLDING
    CLAIMABLE = states.CLAIMABLE
    TERMINAL = states.TERMINAL

    handler = models.CharField(max_length=200, db_index=True)
    # Looked up as (content_type, object_id): the record index below, never alone. Every index
    # of this table is written by each of a job's three UPDATEs (status is indexed, so none is
    # HOT): the engine's own are partial, over unfinished jobs, so finished ones cost it nothing.
    # None for a plain job (a task that names no record): no fence, a lane of its own.
    content_type = models.ForeignKey(
        ContentType,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        null=True,
        blank=True,
        help_text="The record's model; empty for a plain job (no record, no fence).",
    )
    object_id = models.CharField(max_length=64, blank=True)
    generation = models.PositiveIntegerField(null=True, help_text="Snapshot at enqueue.")
    version = models.PositiveIntegerField(null=True, help_text="Snapshot at enqueue.")
    lane = models.CharField(
        "ordering key", max_length=255, help_text="Jobs of one key run one at a time, in order."
    )
    # Its queue: the first key of the hint and priority indexes, so that a worker serving some
    # queues reads only theirs (tombstones.jobs.queues).
    queue = models.CharField(
        max_length=64, default="default", db_default="default", help_text="Its named queue."
    )
    status = models.CharField(max_length=16, choices=Status, default=Status.QUEUED)
    reason = models.CharField(max_length=32, choices=Reason, default=Reason.NONE, blank=True)
    error_class = models.CharField(max_length=200, blank=True, help_text="Exception class only.")
    # db_default: the rows bulk and bench inserts write by SQL, naming their columns, get it too.
    error_trace = models.TextField(
        blank=True,
        db_default="",
        editable=False,
        help_text="Frames (file, line, function, source line) and class: no message, no locals.",
    )
    params = models.JSONField(default=dict, blank=True)
    # Among due lanes, a claim looks first at those with a job of a higher priority (a lane's
    # own order never changes); 0 for most jobs: only others are in their index.
    priority = models.SmallIntegerField(
        default=0, db_default=0, help_text="-100 to 100; higher runs sooner, in lane order."
    )
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
    # A plain success stores no events: the version its check found (see row_events).
    checked_version = models.PositiveIntegerField(null=True, blank=True)
    # A hint for the claims: look at this job's lane from this moment (its enqueue or due time,
    # its retry's end, the moment it ended or went back to the queue). Set with each change of a
    # job's state, cleared by the claim that looked; only hinted rows are in its index, so a
    # claim's cost follows the lanes that changed, not the lanes that wait.
    ready_at = models.DateTimeField(null=True, blank=True, db_default=Now(), editable=False)
    # The W3C traceparent of the span that enqueued it (with opentelemetry-api installed): ids
    # and flags only, never baggage or trace state (:mod:`tombstones.jobs.tracing`).
    traceparent = models.CharField(
        max_length=55, blank=True, default="", db_default="", editable=False
    )
    # A coalescing handler's job (tombstones.jobs.coalescing): its key (None: the handler does
    # not coalesce), and when its debounce window opened (carried by each job that supersedes
    # an earlier one, so that max_delay counts from the window's first job).
    coalesce_key = models.CharField(max_length=200, null=True, blank=True, editable=False)
    window_started_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ("-id",)
        indexes = [
            models.Index(
                fields=["lane", "queued_at", "id"],
                name="tombstones_job_lane_place",
                condition=models.Q(status__in=["queued", "running", "retry_wait", "paused"]),
            ),
            # The audit's: the jobs that ended without succeeding, by status (the admin's
            # filters); succeeded ones, most of the ledger, are read in id order.
            models.Index(
                fields=["status", "id"],
                name="tombstones_job_audit",
                condition=models.Q(
                    status__in=[
                        "rejected",
                        "uncertain",
                        "superseded",
                        "escalated",
                        "expired",
                        "failed",
                        "cancelled",
                    ]
                ),
            ),
            models.Index(fields=["content_type", "object_id"], name="tombstones_job_record"),
            # The claims' hints, in the order they came due, and by lane (a claim clears every
            # hint of a lane it looked at); a few rows at any time.
            models.Index(
                fields=["queue", "ready_at", "id"],
                name="tombstones_job_hint",
                condition=models.Q(ready_at__isnull=False),
            ),
            models.Index(
                fields=["lane", "ready_at"],
                name="tombstones_job_hint_lane",
                condition=models.Q(ready_at__isnull=False),
            ),
            # The jobs claims hold (running heads, reserved followers): leases, take-backs.
            models.Index(
                fields=["claim_token"],
                name="tombstones_job_held",
                condition=~models.Q(claim_token=""),
            ),
            # The admin's reason filter asks which reasons occur, one probe each (most jobs
            # have none: they stay out of the index).
            models.Index(
                fields=["reason"], name="tombstones_job_reason", condition=~models.Q(reason="")
            ),
            # purge_jobs' batches (a final status's oldest jobs) and the dashboard's outcomes;
            # a job enters it when it ends. (finished_at < x implies the condition, for SQLite's
            # planner too, which does not match a status IN (...) given as parameters.)
            models.Index(
                fields=["status", "finished_at"],
                name="tombstones_job_finished",
                condition=models.Q(finished_at__isnull=False),
            ),
            # The waiting jobs of a priority above 0, highest first (ledger.priorities):
            # only they are in it, so a claim's look at it costs nothing when no job has one.
            models.Index(
                "queue",
                F("priority").desc(),
                "run_after",
                "id",
                name="tombstones_job_priority",
                condition=models.Q(priority__gt=0, status__in=["queued", "retry_wait"]),
            ),
            # A leading edge's look for its window's last job (debounced jobs only).
            models.Index(
                fields=["lane", "handler", "window_started_at"],
                name="tombstones_job_window",
                condition=models.Q(window_started_at__isnull=False),
            ),
            # The paused jobs the sweep resumes: a few rows (it scanned the table for them).
            models.Index(
                fields=["id"], name="tombstones_job_paused", condition=models.Q(status="paused")
            ),
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
            ("view_metrics", "Can read the Prometheus metrics"),
        ]

    def __str__(self) -> str:
        return f"Job {self.pk} ({self.handler})"

    @property
    def sequence(self) -> int:
        """Enqueue order: ties of ``queued_at`` within a lane are broken by it."""
        return int(self.pk)

    @property
    def record_ref(self) -> str:
        """``app_label.model:pk`` — ids only, never field values ("-" for a plain job)."""
        return ref_of(self.content_type, self.object_id)

    @property
    def is_plain(self) -> bool:
        """A job for no record (a plain task): no fence, a lane of its own, never rejected."""
        return self.content_type_id is None

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
        """The job's audit trail in order: its enqueue, then its events (stored, or kept in
        its row: see :meth:`row_events`)."""
        return [self.enqueued_event(), *with_row_events([self], self.events.all())]

    @property
    def trail_in_row(self) -> bool:
        """Its row holds its last claim's events (:meth:`row_events`): none was stored."""
        if self.status != states.Status.SUCCEEDED or self.external or self.started_at is None:
            return False
        # A plain job checks no record: its first claim's success is the mark.
        return self.attempts == 1 if self.is_plain else self.checked_version is not None

    def row_events(self) -> list[JobEvent]:
        """The (unsaved) events a job's row stands for when it has none stored.

        An internal job that succeeded at its first claim, without a re-read, stores no event
        rows: its row already holds its claim (``owner``, ``started_at``; the check is shown at
        that moment, the row keeps no time of its own for it), what its check found
        (``checked_version``, at the job's generation) and its outcome (``finished_at``, the
        ``found_*`` columns). Rejections, failures, retries, re-reads and external calls keep
        their stored trail.
        """
        started = self.started_at
        if not self.trail_in_row or started is None:
            return []
        common = {
            "job": self,
            "content_type_id": self.content_type_id,
            "object_id": self.object_id,
            "expected_generation": self.generation,
            "expected_version": self.version,
            "worker": self.owner,
        }
        checked = {"found_generation": self.generation, "found_version": self.checked_version}
        found = {"found_generation": self.found_generation, "found_version": self.found_version}
        Event = states.Event
        check = (
            []
            if self.is_plain
            else [JobEvent(event=Event.CHECKED, created_at=started, **common, **checked)]
        )
        return [
            JobEvent(event=Event.CLAIMED, created_at=started, **common),
            *check,
            JobEvent(
                event=Event.SUCCEEDED,
                created_at=self.finished_at or started,
                **common,
                **found,
            ),
        ]


class JobEvent(models.Model):
    """Append-only audit trail of a job: what was expected, what was found, and when."""

    Event = states.Event

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    # None for a plain job's events (see Job.content_type).
    content_type = models.ForeignKey(
        ContentType, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    object_id = models.CharField(max_length=64, blank=True)
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
        indexes = [
            models.Index(fields=["event", "created_at"], name="tombstones_event_kind"),
            # The event and rejection logs' reason filter: one probe per reason (of an event
            # kind); events without a reason stay out of the index.
            models.Index(
                fields=["reason", "event"],
                name="tombstones_event_reason",
                condition=~models.Q(reason=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} job={self.job_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise TypeError("JobEvent rows are append-only.")
        super().save(*args, **kwargs)

    @property
    def record_ref(self) -> str:
        return ref_of(self.content_type, self.object_id)


def ref_of(content_type: ContentType | None, object_id: str) -> str:
    """``app_label.model:pk``, or "-" for no record (a plain job)."""
    if content_type is None:
        return "-"
    return f"{content_type.app_label}.{content_type.model}:{object_id}"


def with_row_events(jobs: list[Job], stored: Any) -> list[JobEvent]:
    """``stored`` events of ``jobs`` (a queryset or list), with the events kept in the rows of
    those that stored none of their outcome, in time order (see :meth:`Job.row_events`)."""
    events = list(stored)
    ended = {e.job_id for e in events if e.event == states.Event.SUCCEEDED}
    for job in jobs:
        if job.pk not in ended:
            events += job.row_events()
    return sorted(events, key=lambda e: (e.created_at, e.pk is None, e.pk or 0))


class Lane(models.Model):
    """One row per ordering key: the lock that keeps a lane's places in commit order.

    On PostgreSQL an enqueue holds its lane's row (``FOR NO KEY UPDATE``) from before its INSERT
    until it commits, and takes its place once it holds it: a job whose enqueue has not committed
    yet can never be overtaken by a later job of its lane (see :mod:`.ledger.lanes`). SQLite runs
    one write transaction at a time and needs no row.
    """

    key = models.CharField("ordering key", max_length=255, unique=True)

    class Meta:
        default_permissions = ()  # the engine's, not the admin's

    def __str__(self) -> str:
        return self.key


class OutcomeRollup(models.Model):
    """Every job that finished, counted by the quarter hour (UTC) it finished in, its status and
    its reason: the dashboard's charts and the outcome counters read these rows, not the ledger.

    A count is the sum of its key's rows: a trigger on the job table appends a row (one job) in
    the transaction that finishes a job, and the sweep adds a key's rows up into one
    (:mod:`tombstones.jobs.ledger.rollup`). ``purge_jobs`` never takes a count away; periods past
    the roll-up's retention are moved into one row per status and reason at 1970-01-01.
    """

    period = models.DateTimeField(help_text="Start of the quarter hour (UTC) the jobs finished in.")
    status = models.CharField(max_length=16, choices=states.Status)
    reason = models.CharField(max_length=32, choices=states.Reason, default="", blank=True)
    jobs = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ("period", "status", "reason")
        default_permissions = ()  # not in the admin: the dashboard reads it
        indexes = [
            models.Index(fields=["period", "status", "reason"], name="tombstones_rollup_period"),
        ]

    def __str__(self) -> str:
        return f"{self.period:%Y-%m-%d %H:%M} {self.status} {self.reason or '-'}: {self.jobs}"


class WorkerBeat(models.Model):
    """A cluster worker process's last sign of life: its heartbeat thread writes it every
    :data:`~tombstones.jobs.beats.BEAT_SECONDS` (:mod:`tombstones.jobs.beats`).

    One row per process name (host and pid); the sweep deletes rows silent for an hour. The
    metrics page and ``tombstones_health`` read it: live workers per cluster, their last beat.
    """

    name = models.CharField(max_length=200, unique=True, help_text="host:pid")
    cluster = models.CharField(max_length=100, help_text="The django-q2 cluster it serves.")
    started_at = models.DateTimeField(db_default=Now())
    beat_at = models.DateTimeField(db_default=Now(), db_index=True)

    class Meta:
        default_permissions = ()  # the engine's, not the admin's

    def __str__(self) -> str:
        return f"{self.name} ({self.cluster})"


class RejectionManager(models.Manager["Rejection"]):
    def get_queryset(self) -> models.QuerySet[Rejection]:
        return super().get_queryset().filter(event__in=REJECTION_EVENTS)


# The jobs that never acted: rejected by their record's state, or superseded by a newer job of
# their lane (coalesced before they started, or an uncertain call a later one overtook).
REJECTION_EVENTS = (JobEvent.Event.REJECTED, JobEvent.Event.SUPERSEDED)


class Rejection(JobEvent):
    """The rejection log: the ``rejected`` and ``superseded`` events (a proxy, for its own admin
    entry)."""

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
