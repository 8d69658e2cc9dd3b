"""A record's timeline: its generations, versions, deletion, re-creation and every job on it.

There is no history table of the record itself, so the timeline is derived from what the jobs
observed (each JobEvent stores the expected and the found generation/version) plus the record's
current identity. Only ids, numbers, reason codes and timestamps are read: never a field value
of the record, never ``str(record)``, never a job's params.

The picture uses an ordinal time axis (one step per distinct moment): in a race what matters is
the order of events, which a linear clock would squeeze into one pixel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext as _

from .display import format_time
from .models import Job, JobEvent
from .options import get_options
from .records import TombstoneModel

Status = Job.Status
Event = JobEvent.Event

MAX_JOBS = 60  # the most recent jobs of one record drawn on the timeline

# Colours by outcome; the legend in the template uses the same table.
STATUS_COLOURS: dict[str, str] = {
    Status.QUEUED: "#1565c0",
    Status.RUNNING: "#0277bd",
    Status.RETRY_WAIT: "#5c6bc0",
    Status.PAUSED: "#8d6e63",
    Status.SUCCEEDED: "#2e7d32",
    Status.REJECTED: "#c62828",
    Status.UNCERTAIN: "#ef6c00",
    Status.SUPERSEDED: "#ffb74d",
    Status.ESCALATED: "#6a1b9a",
    Status.EXPIRED: "#9e9e9e",
    Status.FAILED: "#ad1457",
    Status.CANCELLED: "#616161",
}
GENERATION_COLOURS = ("#90caf9", "#a5d6a7", "#ffe082", "#ce93d8", "#80cbc4", "#ffab91")

# Events after which the record is known to be live at the found (generation, version).
_LIVE_EVENTS = frozenset({Event.CHECKED, Event.REREAD, Event.SUCCEEDED, Event.SENT})

# Geometry of the SVG (pixels).
LEFT = 340
STEP = 34
ROW = 30
TOP = 64
RIGHT_LABEL = 260
# The drawing is scaled to the page width (viewBox, width 100%); a long history gets narrower
# steps first, so the labels stay legible on a 1280 px screen.
FIT_WIDTH = 1100
MIN_STEP = 6
HANDLER_CHARS = 36  # longer handler names are shortened in the picture (the table has them)


@dataclass
class Identity:
    """The record as it is now: identity only."""

    model_label: str
    pk: str
    business_key: str | None = None
    business_key_value: str | None = None
    generation: int | None = None
    version: int | None = None
    deleted_at: datetime | None = None
    exists: bool = False

    @property
    def state(self) -> str:
        if not self.exists:
            return _("missing (never existed, or purged)")
        return _("tombstone") if self.deleted_at is not None else _("live")


@dataclass
class Sighting:
    """A moment at which the record's (generation, version) is known."""

    at: datetime
    generation: int
    version: int | None
    tombstone: bool = False
    source: str = ""


@dataclass
class Generation:
    number: int
    first: datetime
    last: datetime
    versions: list[int] = field(default_factory=list)
    deleted_at: datetime | None = None  # exact: the record's own deleted_at
    tombstone_seen_at: datetime | None = None  # a job found it deleted at this moment
    colour: str = ""


@dataclass
class Timeline:
    identity: Identity
    jobs: list[Job]
    events: list[JobEvent]
    generations: list[Generation]
    truncated: bool
    svg: dict[str, Any]


def record_model(content_type: ContentType) -> type[TombstoneModel] | None:
    """The content type's model if it has the mixin (only those records have a timeline)."""
    model = content_type.model_class()
    if model is None or not issubclass(model, TombstoneModel):
        return None
    return model


def is_pk(model: type[models.Model], object_id: str) -> bool:
    """True when ``object_id`` is a primary key of ``model`` written as jobs store it."""
    try:
        value = model._meta.pk.to_python(object_id)
    except ValidationError:
        return False
    # "007" or " 7" would name record 7, whose jobs are stored under "7".
    return value is not None and str(value) == object_id


def current_identity(content_type: ContentType, object_id: str) -> Identity:
    model = content_type.model_class()
    label = f"{content_type.app_label}.{content_type.model}"
    identity = Identity(model_label=label, pk=object_id)
    if model is None:
        return identity
    manager = getattr(model, "all_objects", model._default_manager)
    names = {f.name for f in model._meta.get_fields()}
    wanted: list[str] = [n for n in ("generation", "version", "deleted_at") if n in names]
    key = get_options(model).business_key
    if key and key in names:
        identity.business_key = key
        wanted.append(key)
    try:
        row = manager.filter(pk=object_id).values(*wanted).first()
    except (ValueError, TypeError, ValidationError):
        return identity  # an object id that cannot be a pk of this model
    if row is None:
        return identity
    identity.exists = True
    identity.generation = row.get("generation")
    identity.version = row.get("version")
    identity.deleted_at = row.get("deleted_at")
    if key:
        identity.business_key_value = str(row.get(key))
    return identity


def _sightings(jobs: list[Job], events: list[JobEvent], identity: Identity) -> list[Sighting]:
    seen: list[Sighting] = []
    for job in jobs:
        if job.generation is not None:
            seen.append(Sighting(job.created_at, job.generation, job.version, False, f"#{job.pk}"))
    for ev in events:
        if ev.found_generation is None:
            continue
        tombstone = ev.event == Event.REJECTED and ev.reason == Job.Reason.SOURCE_DELETED
        if ev.event in _LIVE_EVENTS or ev.event == Event.REJECTED:
            seen.append(
                Sighting(
                    ev.created_at,
                    ev.found_generation,
                    ev.found_version,
                    tombstone,
                    f"#{ev.job_id} {ev.event}",
                )
            )
    if identity.exists and identity.generation is not None:
        seen.append(
            Sighting(
                timezone.now(),
                identity.generation,
                identity.version,
                identity.deleted_at is not None,
                "now",
            )
        )
    seen.sort(key=lambda s: s.at)
    return seen


def _generations(seen: list[Sighting], identity: Identity) -> list[Generation]:
    found: dict[int, Generation] = {}
    for s in seen:
        gen = found.get(s.generation)
        if gen is None:
            gen = found[s.generation] = Generation(s.generation, s.at, s.at)
        gen.first, gen.last = min(gen.first, s.at), max(gen.last, s.at)
        if s.version is not None and s.version not in gen.versions:
            gen.versions.append(s.version)
        if s.tombstone and s.source != "now" and gen.tombstone_seen_at is None:
            gen.tombstone_seen_at = s.at
    if identity.deleted_at is not None and identity.generation in found:
        gen = found[identity.generation]
        gen.deleted_at = identity.deleted_at
        gen.first = min(gen.first, identity.deleted_at)
    ordered = [found[n] for n in sorted(found)]
    for i, gen in enumerate(ordered):
        gen.versions.sort()
        gen.colour = GENERATION_COLOURS[i % len(GENERATION_COLOURS)]
    return ordered


def build(content_type: ContentType, object_id: str) -> Timeline:
    """Everything the timeline page shows, read with ids and numbers only."""
    identity = current_identity(content_type, object_id)
    jobs_qs = Job.objects.filter(content_type=content_type, object_id=object_id).defer("params")
    total = jobs_qs.count()
    jobs = list(jobs_qs.order_by("-id")[:MAX_JOBS])[::-1]
    stored = JobEvent.objects.filter(job__in=[j.pk for j in jobs]).order_by("created_at", "id")
    # The job rows record the enqueues; they come first among events of the same moment.
    events = sorted(
        [*(job.enqueued_event() for job in jobs), *stored],
        key=lambda ev: (ev.created_at, ev.pk is not None, ev.pk or ev.job_id),
    )
    seen = _sightings(jobs, events, identity)
    generations = _generations(seen, identity)
    svg = _picture(identity, jobs, events, generations)
    return Timeline(identity, jobs, events, generations, total > len(jobs), svg)


def _short(handler: str) -> str:
    if len(handler) <= HANDLER_CHARS:
        return handler
    return "…" + handler[-(HANDLER_CHARS - 1) :]


def _picture(
    identity: Identity, jobs: list[Job], events: list[JobEvent], generations: list[Generation]
) -> dict[str, Any]:
    """Coordinates for the template's inline SVG (the template escapes every label)."""
    now = timezone.now()
    moments: set[datetime] = {now}
    moments.update(ev.created_at for ev in events)
    moments.update(j.created_at for j in jobs)
    for gen in generations:
        moments.update((gen.first, gen.last))
        if gen.deleted_at is not None:
            moments.add(gen.deleted_at)
    axis = sorted(moments)
    slot = {moment: i for i, moment in enumerate(axis)}

    step = max(MIN_STEP, min(STEP, (FIT_WIDTH - LEFT - RIGHT_LABEL) // len(axis)))

    def x(moment: datetime) -> int:
        return LEFT + step // 2 + slot[moment] * step

    width = LEFT + step * len(axis) + RIGHT_LABEL
    bands = []
    for i, gen in enumerate(generations):
        start = gen.first
        nxt = generations[i + 1].first if i + 1 < len(generations) else None
        if gen.deleted_at is not None:
            end = gen.deleted_at
        elif nxt is not None:
            end = max(gen.last, start)
        else:
            end = now
        x1, x2 = x(start), x(end)
        band_width = max(x2 - x1 + step - 4, step - 4, 4)
        bands.append(
            {
                "x": x1 - step // 2 + 2,
                "width": band_width,
                "label": _("generation %(n)s") % {"n": gen.number}
                if band_width >= 110
                else f"g{gen.number}",
                "colour": gen.colour,
                "title": _("generation %(n)s: versions seen %(versions)s")
                % {"n": gen.number, "versions": ", ".join(f"v{v}" for v in gen.versions)},
            }
        )
        gone = gen.deleted_at or gen.tombstone_seen_at
        if gone is not None:
            # The tombstone: from the deletion until re-created (or until now).
            t1, t2 = x(gone), x(nxt if nxt is not None and nxt > gone else now)
            bands.append(
                {
                    "x": t1,
                    "width": max(t2 - t1, 4),
                    "label": _("tombstone") if t2 - t1 >= 80 else "",
                    "colour": "#e0e0e0",
                    "title": _("generation %(n)s is a tombstone") % {"n": gen.number},
                }
            )
    marks = []
    for i, gen in enumerate(generations):
        if gen.deleted_at is not None:
            marks.append(
                {
                    "x": x(gen.deleted_at),
                    "label": _("deleted"),
                    "kind": "deleted",
                    "title": _("generation %(n)s deleted at %(at)s")
                    % {"n": gen.number, "at": format_time(gen.deleted_at)},
                }
            )
        elif gen.tombstone_seen_at is not None:
            marks.append(
                {
                    "x": x(gen.tombstone_seen_at),
                    "label": _("tombstone seen"),
                    "kind": "deleted",
                    "title": _("a job found generation %(n)s deleted at %(at)s")
                    % {"n": gen.number, "at": format_time(gen.tombstone_seen_at)},
                }
            )
        if i > 0:
            marks.append(
                {
                    "x": x(gen.first),
                    "label": _("re-created as g%(n)s") % {"n": gen.number},
                    "kind": "recreated",
                    "title": _("generation %(n)s first seen at %(at)s")
                    % {"n": gen.number, "at": format_time(gen.first)},
                }
            )
    by_job: dict[int, list[JobEvent]] = {}
    for ev in events:
        by_job.setdefault(ev.job_id, []).append(ev)
    rows = []
    for n, job in enumerate(jobs):
        y = TOP + 44 + n * ROW
        mine = by_job.get(job.pk, [])
        # A finished job's bar ends at its last event (the outcome); an open one runs to now.
        end = mine[-1].created_at if job.finished_at is not None and mine else now
        colour = STATUS_COLOURS.get(job.status, "#000")
        outcome = job.get_status_display()
        if job.reason:
            outcome += f" ({job.reason})"
        dots = []
        for ev in mine:
            found = (
                _(", found g%(g)s/v%(v)s") % {"g": ev.found_generation, "v": ev.found_version}
                if ev.found_generation is not None
                else ""
            )
            dots.append(
                {
                    "x": x(ev.created_at),
                    "title": f"{ev.event}{' ' + ev.reason if ev.reason else ''}"
                    f" {format_time(ev.created_at)}{found}",
                    "terminal": ev.event not in ("enqueued", "claimed", "checked", "sending"),
                }
            )
        rows.append(
            {
                "job": job,
                "y": y,
                "x1": x(job.created_at),
                "x2": x(end),
                "colour": colour,
                "label": f"#{job.pk} {_short(job.handler)} g{job.generation}/v{job.version}",
                "outcome": outcome,
                "dots": dots,
                "open": job.finished_at is None,
            }
        )
    return {
        "width": width,
        "height": TOP + 64 + len(jobs) * ROW,
        "bands": bands,
        "marks": marks,
        "rows": rows,
        "now_x": x(now),
        "left": LEFT,
        "label_x": LEFT - 8,
        "outcome_x": width - RIGHT_LABEL + 8,
        "axis_y": TOP + 20,
        "band_y": TOP - 24,
        "mark_y": TOP - 32,
        "top": TOP,
    }
