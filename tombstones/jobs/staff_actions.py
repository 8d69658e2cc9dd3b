"""Staff decisions on jobs, offered by the admin: each one a conditional status change.

Every change goes through :func:`.ledger.transition` (a conditional UPDATE that writes a
JobEvent and an outcome log line with ids only), so two staff members acting at once, or a
worker claiming the job meanwhile, can never both win. Nothing here repeats an external call by
itself: an uncertain job is resent at most once, as the same job, so the external system
receives the same idempotency key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from django.db import transaction
from django.db.models import Q
from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from . import ledger, queries
from .models import Job, JobEvent
from .queues import cluster_of
from .wakeups import wake_soon

Status = Job.Status
Reason = Job.Reason
Event = JobEvent.Event


@dataclass(frozen=True)
class StaffAction:
    """One decision staff may take on one job."""

    slug: str  # in the URL: /admin/tombstones/job/<id>/act/<slug>/
    permission: str  # codename on tombstones.Job
    title: str | Promise  # the button (translatable)
    explanation: str | Promise  # the confirmation page says exactly what will happen
    from_status: tuple[str, ...]  # the job must still be in one of these when confirmed
    # (job, status seen on the confirmation page, who decided) -> applied
    perform: Callable[[Job, str, str], bool]


def was_resent(job: Job) -> bool:
    """True once staff resolved this job before (a resend may happen once only)."""
    return Job.objects.using(job._state.db).filter(pk=job.pk).resolved_before().exists()


def _after_commit(job: Job, func: Callable[[], object]) -> None:
    transaction.on_commit(func, using=job._state.db)


def staff_ref(user_pk: object) -> str:
    """Who took a staff decision, as its JobEvent's ``worker``: the user's id, no name."""
    return f"staff:{user_pk}"


def _wake_next(job: Job) -> None:
    """Once the staff decision commits, wake a worker of the job's queue: the job, or its
    lane's next one, may be due now."""
    _after_commit(job, partial(wake_soon, job.pk, cluster=cluster_of(job.queue)))


def resolve_delivered(job: Job, seen: str, by: str = "") -> bool:
    """Staff checked the external system: the call landed. The job becomes a success."""
    return ledger.transition(
        job, Status.SUCCEEDED, Reason.NONE, from_status=(seen,), event=Event.RESOLVED, by=by
    )


def resolve_resend(job: Job, seen: str, by: str = "") -> bool:
    """Staff checked: the call did not land. Queue the SAME job again, once; same idempotency key.

    The worker repeats the whole check before sending, so a record deleted meanwhile is still
    rejected. It keeps its place in its lane.
    """
    applied = ledger.transition(
        job,
        Status.QUEUED,
        Reason.OUTCOME_UNKNOWN,  # why it runs again; the worker clears it when it claims
        from_status=(seen,),
        event=Event.RESOLVED,
        by=by,
        extra_filter=~Q(queries.resolved_before()),
        finished_at=None,
        sending_at=None,
        sent_at=None,
        claim_token="",
        lease_expires_at=None,
    )
    if applied:
        _wake_next(job)
    return applied


def resolve_abandon(job: Job, seen: str, by: str = "") -> bool:
    """Staff checked: the call did not land, and it must not be sent again."""
    return ledger.transition(
        job,
        Status.CANCELLED,
        Reason.CANCELLED_BY_STAFF,
        from_status=(seen,),
        event=Event.RESOLVED,
        by=by,
    )


def resume(job: Job, seen: str, by: str = "") -> bool:
    """A paused job goes back to the queue; its check runs again from scratch."""
    applied = ledger.transition(
        job, Status.QUEUED, Reason.NONE, from_status=(seen,), event=Event.RESUMED, by=by
    )
    if applied:
        _wake_next(job)
    return applied


def cancel(job: Job, seen: str, by: str = "") -> bool:
    """A queued (or retry-waiting) job will not run; its lane moves on."""
    return _cancel(job, seen, Event.CANCELLED, by)


def skip_head(job: Job, seen: str, by: str = "") -> bool:
    """The blocked head of a lane is cancelled so the jobs behind it can run."""
    return _cancel(job, seen, Event.SKIPPED, by, extra_filter=queries.lane_head())


def _cancel(job: Job, seen: str, event: str, by: str, extra_filter: Q | None = None) -> bool:
    applied = ledger.transition(
        job,
        Status.CANCELLED,
        Reason.CANCELLED_BY_STAFF,
        from_status=(seen,),
        event=event,
        by=by,
        # A reserved lane follower is its claim's (taking it away would roll back its outcome).
        extra_filter=queries.unclaimed() & (extra_filter or Q()),
        lease_expires_at=None,
    )
    if applied:
        _wake_next(job)
    return applied


def requeue(job: Job, seen: str, by: str = "") -> bool:
    """An escalated job whose handler was unknown goes back to its place once the handler is
    deployed: the worker repeats the whole check (a record deleted meanwhile still rejects it)."""
    applied = ledger.transition(
        job,
        Status.QUEUED,
        Reason.NONE,
        from_status=(seen,),
        event=Event.REQUEUED,
        by=by,
        extra_filter=Q(reason=Reason.HANDLER_UNKNOWN) & ~queries.too_old(),
        finished_at=None,
        claim_token="",
        lease_expires_at=None,
    )
    if applied:
        _wake_next(job)
    return applied


ACTIONS: dict[str, StaffAction] = {
    action.slug: action
    for action in (
        StaffAction(
            "resolve-delivered",
            "resolve_job",
            gettext_lazy("Resolve: delivered"),
            gettext_lazy(
                "You checked the external system and the call landed. The job is marked succeeded; "
                "nothing is sent."
            ),
            (Status.UNCERTAIN,),
            resolve_delivered,
        ),
        StaffAction(
            "resolve-resend",
            "resolve_job",
            gettext_lazy("Resolve: not delivered, resend once"),
            gettext_lazy(
                "You checked the external system and the call did not land. The same job is "
                "queued once more with the same idempotency key; the worker checks the record "
                "again before sending. This can be done once per job."
            ),
            (Status.UNCERTAIN,),
            resolve_resend,
        ),
        StaffAction(
            "resolve-abandon",
            "resolve_job",
            gettext_lazy("Resolve: not delivered, do not resend"),
            gettext_lazy(
                "You checked the external system and the call did not land; it must not be sent. "
                "The job is cancelled."
            ),
            (Status.UNCERTAIN,),
            resolve_abandon,
        ),
        StaffAction(
            "resume",
            "resume_job",
            gettext_lazy("Resume"),
            gettext_lazy("The paused job is queued again; the worker repeats the whole check."),
            (Status.PAUSED,),
            resume,
        ),
        StaffAction(
            "requeue",
            "resume_job",
            gettext_lazy("Re-queue"),
            gettext_lazy(
                "No worker knew this job's handler when it ran. Once the handler is deployed, the "
                "job is queued again in its place; the worker repeats the whole check."
            ),
            (Status.ESCALATED,),
            requeue,
        ),
        StaffAction(
            "cancel",
            "cancel_job",
            gettext_lazy("Cancel"),
            gettext_lazy("The job will not run. Later jobs of its lane may then run."),
            (Status.QUEUED, Status.RETRY_WAIT),
            cancel,
        ),
        StaffAction(
            "skip",
            "skip_lane_head",
            gettext_lazy("Skip lane head"),
            gettext_lazy(
                "This job is the head of its lane and blocks the jobs behind it. It is cancelled "
                "and the next job of the lane is woken."
            ),
            (Status.QUEUED, Status.RETRY_WAIT, Status.PAUSED),
            skip_head,
        ),
    )
}


def why_not(action: StaffAction, job: Job) -> str:
    """Why ``action`` cannot apply to ``job`` now ("" if it can): ids and statuses only."""
    if job.status not in action.from_status:
        return _("its status is %(status)s") % {"status": job.status}
    if action.slug in ("cancel", "skip") and job.claim_token:
        return _("a worker has reserved it to run next in its lane; it runs in a moment")
    if action.slug == "resolve-resend" and was_resent(job):
        return _("it was resent once already")
    if action.slug == "skip" and not is_lane_head(job):
        return _("it is not the head of its lane")
    if action.slug == "requeue":
        if job.reason != Reason.HANDLER_UNKNOWN:
            return _("only a job escalated for an unknown handler can be re-queued")
        if Job.objects.using(job._state.db).filter(pk=job.pk).too_old().exists():
            return _("it is older than TOMBSTONES_JOB_MAX_AGE and would expire at once")
    return ""


def available(job: Job) -> list[StaffAction]:
    """The actions that make sense for the job's current state (permissions not considered)."""
    return [action for action in ACTIONS.values() if not why_not(action, job)]


def is_lane_head(job: Job) -> bool:
    return not Job.objects.using(job._state.db).blocking(job).exists()
