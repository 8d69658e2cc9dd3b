"""The periodic sweep: the fallback for lost wake-ups and workers that vanished.

Timers do the waiting (:mod:`.alarms`): a job that becomes due wakes a worker within a second.
The sweep repairs what they missed: a message lost in the broker, a worker process that
died with its alarms, a host gone. Every change is a conditional UPDATE, so two sweeps running
at once are harmless.
"""

from __future__ import annotations

from typing import Any

from django_q.models import Schedule

from ...conf import tombstone_settings
from .. import beats, ledger, queries, queues
from ..models import Job, JobEvent
from ..wakeups import wake_soon

Status = Job.Status
Reason = Job.Reason
Event = JobEvent.Event

BATCH = 500


def sweep(using: str | None = None, *, dispatch: bool = True) -> dict[str, int]:
    """Take back lapsed leases, expire old jobs, resume paused ones, wake a pump if any is due,
    fold the outcome roll-up's new rows, forget workers silent for an hour."""
    counts = {**ledger.take_back_lapsed(using, limit=BATCH), "expired": 0, "resumed": 0}
    jobs = Job.objects.using(using).select_related("content_type")
    # A reserved lane follower (queued with a claim token) is its claim's: that worker records it
    # expired itself.
    expirable = queries.too_old() & queries.unclaimed()
    # In no order (all of them go, a batch at a time): SQLite would read "newest first" by
    # scanning the whole ledger backwards rather than look the few waiting jobs up.
    for job in jobs.filter(expirable, status__in=Job.CLAIMABLE).order_by()[:BATCH]:
        counts["expired"] += ledger.transition(
            job,
            Status.EXPIRED,
            Reason.QUEUE_EXPIRED,
            from_status=tuple(Job.CLAIMABLE),
            extra_filter=expirable,  # still too old, not reserved
        )
    for job in jobs.filter(status=Status.PAUSED)[:BATCH]:
        # Resumed as queued, in its place: the check is repeated from scratch when it runs.
        counts["resumed"] += ledger.transition(
            job, Status.QUEUED, Reason.NONE, from_status=(Status.PAUSED,), event=Event.RESUMED
        )
    woken: dict[str, int] = {}
    if dispatch:
        # A due hint in a queue: a wake-up for the cluster serving it, one per cluster.
        for queue, head in Job.objects.using(using).first_hints(queues.known()).items():
            woken.setdefault(queues.cluster_of(queue), head)
        for cluster, head in woken.items():
            wake_soon(head, cluster=cluster)
    counts["dispatched"] = len(woken)
    counts["folded"] = ledger.rollup.fold(using)
    counts["forgotten"] = beats.forget(using)
    return counts


def run_sweep() -> dict[str, Any]:
    """The django-q2 scheduled task."""
    return sweep()


def install_schedule(**kwargs: Any) -> None:
    """post_migrate receiver: create or update the django-q2 schedule of the sweep.

    The schedule names the cluster the jobs go to (``TOMBSTONES_Q_OPTIONS["cluster"]``): django-q2
    fires a schedule without a cluster on a cluster of the default name only, so with jobs routed
    to a named cluster and only that one running, the sweep never ran.
    """
    cluster = tombstone_settings.Q_OPTIONS.get("cluster") or None
    Schedule.objects.update_or_create(
        name="tombstones.sweep",
        defaults={
            "func": "tombstones.worker.run_sweep",
            "schedule_type": Schedule.MINUTES,
            "minutes": tombstone_settings.SWEEP_MINUTES,
            "repeats": -1,
            "cluster": str(cluster) if cluster is not None else None,
        },
    )
