"""The periodic sweep: a lost django-q2 message or a vanished worker never loses a job.

Every change is a conditional UPDATE, so two sweeps running at once are harmless.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q, Value
from django.db.models.functions import Now

from . import ledger
from .conf import tombstone_settings
from .dispatch import wake
from .models import Job

Status = Job.Status
Reason = Job.Reason

BATCH = 500


def sweep(using: str | None = None, *, dispatch: bool = True) -> dict[str, int]:
    """Rescue expired leases, expire old jobs, resume paused ones, re-dispatch due lane heads."""
    counts = {"uncertain": 0, "requeued": 0, "expired": 0, "resumed": 0, "dispatched": 0}
    jobs = Job.objects.using(using).select_related("content_type")
    lapsed = Q(status=Status.RUNNING, lease_expires_at__lt=Now())

    for job in jobs.filter(lapsed, sending_at__isnull=False)[:BATCH]:
        # Crashed after "sending": the call may have landed. Never repeated by itself.
        counts["uncertain"] += ledger.transition(
            job,
            Status.UNCERTAIN,
            Reason.OUTCOME_UNKNOWN,
            from_status=(Status.RUNNING,),
            extra_filter=lapsed & Q(sending_at__isnull=False),
            claim_token="",
            lease_expires_at=None,
        )
    for job in jobs.filter(lapsed, sending_at__isnull=True)[:BATCH]:
        # Its write-and-outcome transaction never committed: safe to run again.
        counts["requeued"] += ledger.transition(
            job,
            Status.QUEUED,
            Reason.LEASE_EXPIRED,
            from_status=(Status.RUNNING,),
            extra_filter=lapsed & Q(sending_at__isnull=True),
            claim_token="",
            lease_expires_at=None,
        )
    too_old = Q(created_at__lt=Now() - Value(tombstone_settings.JOB_MAX_AGE))
    for job in jobs.filter(too_old, status__in=Job.CLAIMABLE)[:BATCH]:
        counts["expired"] += ledger.transition(
            job,
            Status.EXPIRED,
            Reason.QUEUE_EXPIRED,
            from_status=tuple(Job.CLAIMABLE),
            extra_filter=too_old,
        )
    for job in jobs.filter(status=Status.PAUSED)[:BATCH]:
        # Resumed as queued: the check is repeated from scratch when it runs.
        counts["resumed"] += ledger.transition(
            job,
            Status.QUEUED,
            Reason.NONE,
            from_status=(Status.PAUSED,),
            event="resumed",
        )
    if dispatch:
        # Heads due for longer than a lease (their message was most likely lost), and retries
        # now due (a retry_wait job has no message; its worker's alarm dies with the worker).
        stuck = ledger.claimable(using).filter(
            Q(run_after__lt=Now() - Value(tombstone_settings.LEASE))
            | Q(status=Status.RETRY_WAIT, run_after__lte=Now())
        )
        for job_id in stuck.order_by("id").values_list("id", flat=True)[:BATCH]:
            wake(job_id)
            counts["dispatched"] += 1
    return counts


def run_sweep() -> dict[str, Any]:
    """The django-q2 scheduled task."""
    return sweep()


def install_schedule(**kwargs: Any) -> None:
    """post_migrate receiver: create or update the django-q2 schedule of the sweep."""
    from django_q.models import Schedule

    Schedule.objects.update_or_create(
        name="tombstones.sweep",
        defaults={
            "func": "tombstones.sweep.run_sweep",
            "schedule_type": Schedule.MINUTES,
            "minutes": tombstone_settings.SWEEP_MINUTES,
            "repeats": -1,
        },
    )
