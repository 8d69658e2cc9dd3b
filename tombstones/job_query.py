"""The job table's named conditions, written once: due, lane heads, lapsed, too old...

The engine, the sweep, the admin, the dashboard, the doctor and purge all ask through these
methods (``Job.objects.claimable()``, ``.lane_heads()``, ``.lapsed()``...).

Lane order: the jobs of one ordering key run one at a time, in order of ``queued_at`` (the
moment the job took its place: its enqueue, or its ``run_after`` when it was delayed), then id.
A job that holds its lane (running, waiting to retry, paused) blocks every other job of it; a
queued job waits behind the queued jobs with an earlier place. A delayed job is not in line
before it is due, so an immediate job queued after it does not wait for it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import DurationField, Exists, ExpressionWrapper, F, Min, OuterRef, Q, Value
from django.db.models.functions import Now

if TYPE_CHECKING:
    from .models import Job

QUEUED = "queued"
RUNNING = "running"
RETRY_WAIT = "retry_wait"
PAUSED = "paused"
# Statuses that hold a lane: no other job of it runs until this one moves on.
HOLDING = (RUNNING, RETRY_WAIT, PAUSED)
UNFINISHED = (QUEUED, *HOLDING)
CLAIMABLE = (QUEUED, RETRY_WAIT)


def _max_age() -> Any:
    from .conf import tombstone_settings

    return Value(tombstone_settings.JOB_MAX_AGE)


class JobQuerySet(models.QuerySet["Job"]):
    def unfinished(self) -> JobQuerySet:
        return self.filter(status__in=UNFINISHED)

    def for_record(self, content_type_id: int, object_id: Any) -> JobQuerySet:
        return self.filter(content_type_id=content_type_id, object_id=str(object_id))

    def due(self) -> JobQuerySet:
        """Waiting for a worker (queued or retry_wait) and not held back by ``run_after``."""
        return self.filter(status__in=CLAIMABLE, run_after__lte=Now())

    def too_old(self) -> JobQuerySet:
        """Waited longer than ``TOMBSTONES_JOB_MAX_AGE`` since its enqueue."""
        return self.filter(too_old())

    def lapsed(self) -> JobQuerySet:
        """Running, but its lease ran out: its worker vanished (or stalled)."""
        return self.filter(status=RUNNING, lease_expires_at__lt=Now())

    def lane_heads(self) -> JobQuerySet:
        """Jobs that no other job of their lane runs before (see the module docstring)."""
        return self.filter(lane_head())

    def claimable(self) -> JobQuerySet:
        """What a worker may take now: due lane heads not reserved by a claim (too old ones
        included: the worker records them expired, so that their lane moves on)."""
        return self.filter(claimable())

    def orphaned(self) -> JobQuerySet:
        """Lane followers reserved by a claim that holds no running job any more: a worker that
        died between its heads' outcomes and giving its followers back."""
        holder = self.model.objects.filter(claim_token=OuterRef("claim_token"), status=RUNNING)
        return self.filter(status=QUEUED).exclude(claim_token="").exclude(Exists(holder))

    def suspects(self) -> JobQuerySet:
        """Jobs whose last claim ended without an outcome: they are claimed alone next time."""
        return self.filter(status__in=CLAIMABLE, reason__in=("lease_expired", "crashed"))

    def waiting_behind(self, job: Job) -> JobQuerySet:
        """The unfinished jobs of ``job``'s lane that run after it."""
        earlier = Q(queued_at__lt=job.queued_at) | Q(queued_at=job.queued_at, id__lt=job.pk)
        return self.unfinished().filter(lane=job.lane).exclude(pk=job.pk).exclude(earlier)

    def blocking(self, job: Job) -> JobQuerySet:
        """The jobs of ``job``'s lane that keep it from running (empty for a lane head)."""
        same_lane = self.unfinished().filter(lane=job.lane).exclude(pk=job.pk)
        if job.status in HOLDING:
            return same_lane.filter(status__in=HOLDING)
        earlier = Q(queued_at__lt=job.queued_at) | Q(queued_at=job.queued_at, id__lt=job.pk)
        return same_lane.filter(Q(status__in=HOLDING) | (Q(status=QUEUED) & earlier))

    def longest_due_wait(self) -> timedelta | None:
        """How long the claimable job due longest ago has been due (database clock); None if
        nothing is claimable."""
        waited = ExpressionWrapper(Now() - F("run_after"), output_field=DurationField())
        return (
            self.filter(claimable())
            .annotate(waited=waited)
            .order_by("run_after")
            .values_list("waited", flat=True)
            .first()
        )

    def next_due_in(self) -> timedelta | None:
        """How long until something becomes due (a delayed job, a retry, a lease's end), in the
        database's clock; None when nothing waits."""
        found = self.aggregate(
            run=Min(_from_now("run_after"), filter=Q(status__in=CLAIMABLE, run_after__gt=Now())),
            lease=Min(_from_now("lease_expires_at"), filter=Q(status=RUNNING)),
        )
        waits = [w for w in (found["run"], found["lease"]) if w is not None]
        return max(min(waits), timedelta(0)) if waits else None


def _from_now(column: str) -> ExpressionWrapper:
    return ExpressionWrapper(F(column) - Now(), output_field=DurationField())


def lane_head() -> Q:
    return ~Q(holders_in_lane()) & (Q(status__in=HOLDING) | ~Q(ahead()))


def claimable() -> Q:
    # A queued job with a claim token is a lane follower reserved by a claim: its own.
    return Q(status__in=CLAIMABLE, run_after__lte=Now(), claim_token="") & lane_head()


def too_old() -> Q:
    return Q(created_at__lt=Now() - _max_age())


def holders_in_lane() -> Exists:
    """Another job of the outer job's lane holds it (running, retry_wait, paused)."""
    from .models import Job

    return Exists(
        Job.objects.filter(lane=OuterRef("lane"), status__in=HOLDING).exclude(pk=OuterRef("pk"))
    )


def ahead() -> Exists:
    """A queued job of the outer job's lane with an earlier place (queued_at, id)."""
    from .models import Job

    earlier = Q(queued_at__lt=OuterRef("queued_at")) | Q(
        queued_at=OuterRef("queued_at"), id__lt=OuterRef("id")
    )
    return Exists(Job.objects.filter(earlier, lane=OuterRef("lane"), status=QUEUED))
