"""A record's timeline: its generations, versions, deletion, re-creation and every job on it.

There is no history table of the record itself, so the timeline is derived from what the jobs
observed (each JobEvent stores the expected and the found generation/version) plus the record's
current identity. Only ids, numbers, reason codes and timestamps are read: never a field value
of the record, never ``str(record)``, never a job's params.

The picture's geometry is :mod:`.timeline_svg`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext as _

from ..jobs.models import Job, JobEvent, with_row_events
from ..records.mixin import TombstoneModel
from ..records.options import get_options
from . import timeline_svg
from .timeline_svg import GENERATION_COLOURS, STATUS_COLOURS, Generation

__all__ = [
    "STATUS_COLOURS",
    "Generation",
    "Identity",
    "Timeline",
    "build",
    "current_identity",
    "is_pk",
    "record_model",
]

Event = JobEvent.Event

MAX_JOBS = 60  # the most recent jobs of one record drawn on the timeline

# Events after which the record is known to be live at the found (generation, version).
_LIVE_EVENTS = frozenset({Event.CHECKED, Event.REREAD, Event.SUCCEEDED, Event.SENT})


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
    """A moment at which a job saw the record's (generation, version)."""

    at: datetime
    generation: int
    version: int | None
    tombstone: bool = False
    source: str = ""


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
    options = get_options(model)
    key = options.business_key
    # As in TombstoneModel.tombstone_identity(): a personal business key is not shown.
    if key and key in names and key not in options.personal_fields:
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


def _sightings(jobs: list[Job], events: list[JobEvent]) -> list[Sighting]:
    """What the jobs saw, in time order: each enqueue, and each event that read the record."""
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
    seen.sort(key=lambda s: s.at)
    return seen


def observed(jobs: list[Job], events: list[JobEvent], identity: Identity) -> list[Generation]:
    """The record's generations as its jobs and its own row show them."""
    return _generations(_sightings(jobs, events), identity)


def _generations(seen: list[Sighting], identity: Identity) -> list[Generation]:
    """The generations the jobs saw, and the record's current one.

    First and last seen are moments of the data: the jobs' sightings and the record's own
    ``deleted_at``. The record has no other timestamp: a current generation no job has seen has
    none (not the time the page was read).
    """
    found: dict[int, Generation] = {}
    for s in seen:
        gen = found.get(s.generation)
        if gen is None:
            gen = found[s.generation] = Generation(s.generation, s.at, s.at)
        gen.first = min(gen.first, s.at) if gen.first is not None else s.at
        gen.last = max(gen.last, s.at) if gen.last is not None else s.at
        if s.version is not None and s.version not in gen.versions:
            gen.versions.append(s.version)
        if s.tombstone and gen.tombstone_seen_at is None:
            gen.tombstone_seen_at = s.at
    if identity.exists and identity.generation is not None:
        gen = found.setdefault(
            identity.generation, Generation(identity.generation, first=None, last=None)
        )
        if identity.version is not None and identity.version not in gen.versions:
            gen.versions.append(identity.version)
        if identity.deleted_at is not None:
            # The deletion is the generation's last change, and it lived before it.
            gen.deleted_at = deleted = identity.deleted_at
            gen.first = min(gen.first, deleted) if gen.first is not None else deleted
            gen.last = max(gen.last, deleted) if gen.last is not None else deleted
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
    # The job rows record the enqueues (and a plain success); enqueues come first among events
    # of the same moment.
    events = sorted(
        [*(job.enqueued_event() for job in jobs), *with_row_events(jobs, stored)],
        key=lambda ev: (ev.created_at, ev.pk is not None, ev.pk or ev.job_id),
    )
    generations = observed(jobs, events, identity)
    svg = timeline_svg.picture(jobs, events, generations, timezone.now())
    return Timeline(identity, jobs, events, generations, total > len(jobs), svg)
