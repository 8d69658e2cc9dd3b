"""The job dashboard: counts, why each waiting job waits, blocked lanes, the oldest due job, the
next sweep, throughput, jobs awaiting a decision, outcomes over time, rejections per day.

The charts read the outcome roll-up (:class:`~tombstones.jobs.models.OutcomeRollup`, by quarter
hour, kept as jobs finish): a few hundred rows whatever the ledger's size, and a purge leaves
them as they were.

Read-only, ids and reason codes only. The charts are drawn server-side (inline SVG). Every
condition comes from the job table's (``Job.objects.oldest_due()``, ``lane_heads()``,
``blocking()``, ``waiting_behind()``; :mod:`tombstones.jobs.queries`' ``lapsed()``,
``overdue()``, ``behind()``), as the engine reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Q, Subquery
from django.db.models.functions import Now
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ..conf import tombstone_settings
from ..jobs import beats, queries
from ..jobs.ledger import rollup
from ..jobs.models import Job, JobEvent
from ..monitoring.views import PERMISSION
from .counting import count
from .display import format_time
from .statuses import STATUS_COLOURS, status_badge

Status = Job.Status
Reason = Job.Reason

LIST_LIMIT = 50
CHART_DAYS = 14
CHART_HOURS = 24
SWEEP_SCHEDULE = "tombstones.sweep"  # the django-q2 schedule made by tombstones.sweep


@dataclass
class BlockedLane:
    lane: str
    head: Job
    since: Any
    behind: int
    why: str

    @property
    def badge(self) -> str:
        return status_badge(self.head.status, self.head.status)


def status_counts() -> list[tuple[str, str, int]]:
    """(status, label, count) for every status, zeros included: exact up to
    :data:`~tombstones.admin.counting.COUNT_CAP`, PostgreSQL's estimate past it (a count per
    status on its own index, never a scan of the whole ledger)."""
    counted = []
    for value, label in Status.choices:
        jobs = Job.objects.filter(status=value)
        if value in Job.TERMINAL:
            jobs = jobs.filter(finished_at__isnull=False)  # the finished jobs' own index
        counted.append((value, str(label), count(jobs)))
    return counted


def _last_event_at() -> Subquery:
    return Subquery(
        JobEvent.objects.filter(job_id=OuterRef("pk")).order_by("-id").values("created_at")[:1]
    )


# A job whose handler no worker that ran it knew: a deploy in progress, workers started before
# the handler was added, or a handler to register.
UNKNOWN_HANDLER = gettext_noop(
    "no worker that took it has the handler %(handler)s: if a deploy is in progress it runs once "
    "the new workers are up; if the handler was added since the workers started, restart them; "
    "otherwise register the handler (re-queue escalated jobs then)"
)


def _why(job: Job, lease_overdue: bool) -> str:
    reason = f" ({job.reason})" if job.reason else ""
    error = f", {job.error_class}" if job.error_class else ""
    if job.status == Status.PAUSED:
        return _("paused: the record could not be read%(reason)s") % {"reason": reason}
    if job.reason == Reason.HANDLER_UNKNOWN and job.status in (Status.RETRY_WAIT, Status.ESCALATED):
        return _(UNKNOWN_HANDLER) % {"handler": job.handler}
    if job.status == Status.RETRY_WAIT:
        return _("waiting to retry after attempt %(n)s%(reason)s%(error)s") % {
            "n": job.attempts,
            "reason": reason,
            "error": error,
        }
    if job.status == Status.RUNNING:
        return _("running, but its lease expired: the worker vanished (the sweep requeues it)")
    if lease_overdue:
        return _("queued and due, but no worker took it: the wake-up message may be lost")
    if job.status == Status.QUEUED and job.run_after > timezone.now():
        return _("not due yet (due at %(at)s); the jobs behind it wait") % {
            "at": format_time(job.run_after)
        }
    return f"{job.status}{reason}"


def blocked_lanes() -> list[BlockedLane]:
    """Lanes whose head cannot make progress right now, with the jobs waiting behind it.

    A head is stuck when it is paused, waiting to retry, running on a lapsed lease, or queued
    and overdue; a delayed head (queued, not due yet) blocks its lane when jobs wait behind it.
    """
    delayed = Q(status=Status.QUEUED, run_after__gt=Now())
    heads = (
        Job.objects.unfinished()
        .lane_heads()
        .annotate(has_followers=queries.behind())
        .filter(
            Q(status__in=(Status.PAUSED, Status.RETRY_WAIT))
            | queries.overdue()
            | queries.lapsed()
            | (delayed & Q(has_followers=True))
        )
        .annotate(since=_last_event_at(), is_overdue=Exists(_overdue_self()))
        .select_related("content_type")
        .defer("params")
        .order_by("queued_at", "id")[:LIST_LIMIT]
    )
    found = []
    for head in heads:
        found.append(
            BlockedLane(
                lane=head.lane,
                head=head,
                since=head.since or head.created_at,
                behind=Job.objects.waiting_behind(head).count(),
                why=_why(head, bool(head.is_overdue)),
            )
        )
    return found


def _overdue_self() -> Any:
    return Job.objects.filter(pk=OuterRef("pk")).filter(queries.overdue())


@dataclass
class Waiting:
    """One waiting job and why it waits: ``kind`` is delayed, behind, overdue, paused or due."""

    job: Job
    kind: str
    text: str
    at: datetime | None = None  # due at, or due since
    blocker: Job | None = None  # the job it waits behind

    @property
    def badge(self) -> str:
        return status_badge(self.job.status, self.job.status)

    @property
    def blocker_badge(self) -> str:
        return (
            "" if self.blocker is None else status_badge(self.blocker.status, self.blocker.status)
        )


def why_waiting(job: Job, now: datetime) -> Waiting:
    """Why a queued, retry-waiting or paused job has not run (ids and statuses only)."""
    if job.status == Status.PAUSED:
        reason = f" ({job.reason})" if job.reason else ""
        text = _("paused: the record could not be read%(reason)s") % {"reason": reason}
        return Waiting(job, "paused", text)
    if job.reason == Reason.HANDLER_UNKNOWN and job.status == Status.RETRY_WAIT:
        return Waiting(job, "delayed", _(UNKNOWN_HANDLER) % {"handler": job.handler})
    if job.run_after > now:
        what = _("retry due at") if job.status == Status.RETRY_WAIT else _("due at")
        return Waiting(job, "delayed", what, at=job.run_after)
    blocker = Job.objects.blocking(job).defer("params").order_by("queued_at", "id").first()
    if blocker is not None:
        return Waiting(
            job,
            "behind",
            _("behind job %(job)s (%(status)s)") % {"job": blocker.pk, "status": blocker.status},
            blocker=blocker,
        )
    if now - job.run_after > tombstone_settings.LEASE:
        return Waiting(job, "overdue", _("overdue: no worker took it; due since"), at=job.run_after)
    return Waiting(job, "due", _("due since"), at=job.run_after)


def waiting_jobs(now: datetime) -> tuple[list[Waiting], int]:
    """The first waiting jobs in lane order, each with why it waits, and how many wait in all."""
    waiting = Job.objects.waiting()
    first = waiting.defer("params").order_by("queued_at", "id")[:LIST_LIMIT]
    return [why_waiting(job, now) for job in first], waiting.count()


def oldest_due() -> dict[str, Any] | None:
    """The job due for the longest time and for how long (``Job.objects.oldest_due()``)."""
    job = Job.objects.oldest_due().defer("params").first()
    if job is None:
        return None
    waited: timedelta = job.waited  # type: ignore[attr-defined]  # annotated by oldest_due()
    return {"job": job, "since": job.run_after, "age": max(waited, timedelta(0))}


def next_sweep() -> dict[str, Any] | None:
    """The sweep's django-q2 schedule: its next run and interval (None without a schedule)."""
    from django_q.models import Schedule

    schedule = Schedule.objects.filter(name=SWEEP_SCHEDULE).only("next_run", "minutes").first()
    if schedule is None:
        return None
    return {"next_run": schedule.next_run, "minutes": schedule.minutes}


def throughput(now: datetime) -> dict[str, int]:
    """Jobs finished (any final status) in the last minute and the last hour."""
    # By status and finish time: the finished jobs' index, the last hour of it only.
    return Job.objects.filter(
        status__in=Job.TERMINAL, finished_at__gte=now - timedelta(hours=1)
    ).aggregate(
        minute=Count("id", filter=Q(finished_at__gte=now - timedelta(minutes=1))),
        hour=Count("id"),
    )


def _outcomes(
    since: datetime, buckets: list[Any], bucket: Callable[[datetime], Any]
) -> dict[Any, dict[str, int]]:
    """The roll-up's outcomes from ``since`` on, by ``bucket(period)`` and status."""
    counts: dict[Any, dict[str, int]] = {b: {} for b in buckets}
    for period, status, n in rollup.rows_since(since):
        key = bucket(period)
        if key in counts:
            counts[key][status] = counts[key].get(status, 0) + n
    return counts


def outcomes_by_hour(now: datetime, hours: int = CHART_HOURS) -> list[tuple[datetime, dict]]:
    """Outcomes per hour for the last ``hours`` hours (the current one included), by status."""
    tz = timezone.get_current_timezone()
    last = timezone.localtime(now, tz).replace(minute=0, second=0, microsecond=0)
    buckets = [last - timedelta(hours=hours - 1 - i) for i in range(hours)]
    counts = _outcomes(
        buckets[0],
        buckets,
        lambda period: timezone.localtime(period, tz).replace(minute=0, second=0, microsecond=0),
    )
    return [(b, counts[b]) for b in buckets]


def outcomes_by_day(now: datetime, days: int = CHART_DAYS) -> list[tuple[date, dict]]:
    """Outcomes per day for the last ``days`` days (today included), by status."""
    tz = timezone.get_current_timezone()
    start = timezone.localdate(now, tz) - timedelta(days=days - 1)
    midnight = timezone.make_aware(datetime.combine(start, time()), tz)
    days_ = [start + timedelta(days=i) for i in range(days)]
    counts = _outcomes(midnight, days_, lambda period: timezone.localdate(period, tz))
    return sorted(counts.items())


def _bucket_name(key: date) -> str:
    return key.strftime("%Y-%m-%d %H:00") if isinstance(key, datetime) else key.isoformat()


def stacked_chart(
    series: list[tuple[Any, dict]], label: Any, bar: int = 24, gap: int = 6
) -> dict[str, Any]:
    """Geometry of stacked bars, one segment per final status, for the template's inline SVG."""
    height, base = 120, 140
    peak = max((sum(c.values()) for _, c in series), default=0) or 1
    order = [s for s in Job.TERMINAL if s in STATUS_COLOURS]
    bars = []
    for i, (key, counts) in enumerate(series):
        x = 10 + i * (bar + gap)
        total = sum(counts.values())
        top = base
        segments = []
        for status in order:
            n = counts.get(status, 0)
            if not n:
                continue
            h = max(round(height * n / peak), 1)
            top -= h
            segments.append(
                {"status": status, "n": n, "y": top, "h": h, "colour": STATUS_COLOURS[status]}
            )
        bars.append(
            {
                "x": x,
                "w": bar,
                "text_x": x + bar // 2,
                "total": total,
                "top": top,
                "label": label(key),
                "title": f"{_bucket_name(key)}: "
                + (", ".join(f"{s['n']} {s['status']}" for s in segments) or _("none")),
                "segments": segments,
            }
        )
    return {
        "width": 20 + len(series) * (bar + gap),
        "height": base + 36,
        "base": base,
        "bars": bars,
        "total": sum(b["total"] for b in bars),
        "legend": [(s, STATUS_COLOURS[s]) for s in order],
        # The legend as the pages' badges: a shape and a word beside each colour.
        "legend_badges": [status_badge(s, s) for s in order],
    }


def awaiting(status: str) -> list[Job]:
    """Jobs in a terminal status that needs a person (uncertain, escalated), oldest first."""
    return list(
        Job.objects.filter(status=status)
        .select_related("content_type")
        .defer("params")
        .annotate(since=F("finished_at"))
        .order_by("finished_at", "id")[:LIST_LIMIT]
    )


def rejections_per_day(
    days: int = CHART_DAYS, by_day: list[tuple[date, dict]] | None = None
) -> list[tuple[date, int]]:
    """Rejected jobs per day, by the day they finished: the rejected share of
    :func:`outcomes_by_day` (its series, when given). A rejected job has one ``rejected`` event,
    so this is the rejection log's count, and it survives a purge through the roll-up."""
    series = by_day if by_day is not None else outcomes_by_day(timezone.now(), days)
    return [(day, counts.get(Status.REJECTED, 0)) for day, counts in series]


def chart(series: list[tuple[date, int]]) -> dict[str, Any]:
    """Bar geometry for the template's inline SVG."""
    bar, gap, height, base = 28, 8, 120, 140
    peak = max((n for _, n in series), default=0) or 1
    bars = []
    for i, (day, n) in enumerate(series):
        h = round(height * n / peak)
        x = 10 + i * (bar + gap)
        bars.append(
            {
                "x": x,
                "y": base - h,
                "h": h,
                "w": bar,
                "n": n,
                "label": day.strftime("%m-%d"),
                "title": _("%(day)s: %(n)d rejected") % {"day": day.isoformat(), "n": n},
                "text_x": x + bar // 2,
            }
        )
    return {
        "width": 20 + len(series) * (bar + gap),
        "height": base + 36,
        "base": base,
        "bars": bars,
        "total": sum(n for _, n in series),
    }


def metrics_url(user: Any) -> str | None:
    """The metrics page, for a user who may read it and a project that includes it."""
    if not user.has_perm(PERMISSION):
        return None
    try:
        return reverse("tombstones:metrics")
    except NoReverseMatch:
        return None


def context() -> dict[str, Any]:
    now = timezone.now()
    by_day = outcomes_by_day(now)
    waiting, waiting_total = waiting_jobs(now)
    counts = status_counts()
    return {
        "status_counts": counts,
        "status_cards": [(value, status_badge(value, label), n) for value, label, n in counts],
        "waiting_jobs": waiting,
        "waiting_total": waiting_total,
        "blocked_lanes": blocked_lanes(),
        "oldest_due": oldest_due(),
        "next_sweep": next_sweep(),
        "throughput": throughput(now),
        "live_workers": sum(beats.live().values()),
        "uncertain_jobs": awaiting(Status.UNCERTAIN),
        "escalated_jobs": awaiting(Status.ESCALATED),
        "outcomes_by_hour": stacked_chart(outcomes_by_hour(now), lambda h: h.strftime("%H")),
        "outcomes_by_day": stacked_chart(by_day, lambda d: d.strftime("%m-%d"), bar=28, gap=8),
        "rejection_chart": chart(rejections_per_day(by_day=by_day)),
        "chart_days": CHART_DAYS,
        "chart_hours": CHART_HOURS,
    }
