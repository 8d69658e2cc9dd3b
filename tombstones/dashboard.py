"""The job dashboard: counts, blocked lanes, jobs awaiting a decision, rejections per day.

Read-only, ids and reason codes only. The chart is drawn server-side (inline SVG).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Q, Subquery, Value
from django.db.models.functions import Now, TruncDate
from django.utils import timezone

from .conf import tombstone_settings
from .models import Job, JobEvent

Status = Job.Status

LIST_LIMIT = 50
CHART_DAYS = 14


@dataclass
class BlockedLane:
    lane: str
    head: Job
    since: Any
    behind: int
    why: str


def status_counts() -> list[tuple[str, str, int]]:
    """(status, label, count) for every status, zeros included."""
    counts = dict(Job.objects.values_list("status").annotate(n=Count("id")).order_by())
    return [(value, str(label), counts.get(value, 0)) for value, label in Status.choices]


def _last_event_at() -> Subquery:
    return Subquery(
        JobEvent.objects.filter(job_id=OuterRef("pk")).order_by("-id").values("created_at")[:1]
    )


def _why(job: Job, lease_overdue: bool) -> str:
    reason = f" ({job.reason})" if job.reason else ""
    error = f", {job.error_class}" if job.error_class else ""
    if job.status == Status.PAUSED:
        return f"paused: the record could not be read{reason}"
    if job.status == Status.RETRY_WAIT:
        return f"waiting to retry after attempt {job.attempts}{reason}{error}"
    if job.status == Status.RUNNING:
        return "running, but its lease expired: the worker vanished (the sweep requeues it)"
    if lease_overdue:
        return "queued and due, but no worker took it: the wake-up message may be lost"
    return f"{job.status}{reason}"


def blocked_lanes() -> list[BlockedLane]:
    """Lanes whose head cannot make progress right now, with the jobs waiting behind it."""
    earlier = Job.objects.filter(
        lane=OuterRef("lane"), id__lt=OuterRef("id"), status__in=Job.UNFINISHED
    )
    later = (
        Job.objects.filter(lane=OuterRef("lane"), id__gt=OuterRef("id"), status__in=Job.UNFINISHED)
        .order_by()
        .values("lane")
        .annotate(n=Count("id"))
        .values("n")
    )
    overdue = Q(status=Status.QUEUED, run_after__lt=Now() - Value(tombstone_settings.LEASE))
    lapsed = Q(status=Status.RUNNING, lease_expires_at__lt=Now())
    heads = (
        Job.objects.filter(status__in=Job.UNFINISHED)
        .filter(~Exists(earlier))
        .filter(Q(status__in=(Status.PAUSED, Status.RETRY_WAIT)) | overdue | lapsed)
        .annotate(behind=Subquery(later), since=_last_event_at())
        .annotate(
            is_overdue=Exists(Job.objects.filter(pk=OuterRef("pk")).filter(overdue)),
        )
        .select_related("content_type")
        .defer("params")
        .order_by("id")[:LIST_LIMIT]
    )
    found = []
    for head in heads:
        found.append(
            BlockedLane(
                lane=head.lane,
                head=head,
                since=head.since or head.created_at,
                behind=head.behind or 0,
                why=_why(head, bool(head.is_overdue)),
            )
        )
    return found


def awaiting(status: str) -> list[Job]:
    """Jobs in a terminal status that needs a person (uncertain, escalated), oldest first."""
    return list(
        Job.objects.filter(status=status)
        .select_related("content_type")
        .defer("params")
        .annotate(since=F("finished_at"))
        .order_by("finished_at", "id")[:LIST_LIMIT]
    )


def rejections_per_day(days: int = CHART_DAYS) -> list[tuple[date, int]]:
    today = timezone.localdate()
    start = today - timedelta(days=days - 1)
    rows = (
        JobEvent.objects.filter(event=JobEvent.Event.REJECTED, created_at__date__gte=start)
        .annotate(day=TruncDate("created_at"))
        .values_list("day")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts = {day: n for day, n in rows}
    days_shown = [start + timedelta(days=i) for i in range(days)]
    return [(day, counts.get(day, 0)) for day in days_shown]


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
                "title": f"{day.isoformat()}: {n} rejected",
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


def context() -> dict[str, Any]:
    series = rejections_per_day()
    return {
        "status_counts": status_counts(),
        "blocked_lanes": blocked_lanes(),
        "uncertain_jobs": awaiting(Status.UNCERTAIN),
        "escalated_jobs": awaiting(Status.ESCALATED),
        "rejection_chart": chart(series),
        "chart_days": CHART_DAYS,
    }
