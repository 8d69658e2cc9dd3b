"""The timeline's picture: pure geometry from jobs, events and generations to SVG coordinates.

An ordinal time axis (one step per distinct moment): in a race what matters is the order of
events, which a linear clock would squeeze into one pixel. Nothing here reads the database;
the template escapes every label.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.translation import gettext as _

from ..jobs.models import Job, JobEvent
from .display import format_time

Status = Job.Status

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
TOMBSTONE_COLOUR = "#e0e0e0"

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
# Events after which a job goes on; any other is drawn as a terminal dot.
_OPEN_EVENTS = frozenset({"enqueued", "claimed", "checked", "sending"})


@dataclass
class Generation:
    """One life of the record between its creation (or re-creation) and its deletion."""

    number: int
    first: datetime
    last: datetime
    versions: list[int] = field(default_factory=list)
    deleted_at: datetime | None = None  # exact: the record's own deleted_at
    tombstone_seen_at: datetime | None = None  # a job found it deleted at this moment
    colour: str = ""


@dataclass(frozen=True)
class Axis:
    """The ordinal time axis: each distinct moment gets a slot, ``step`` pixels wide."""

    slots: dict[datetime, int]
    step: int

    @classmethod
    def of(cls, moments: Iterable[datetime]) -> Axis:
        ordered = sorted(set(moments))
        step = max(MIN_STEP, min(STEP, (FIT_WIDTH - LEFT - RIGHT_LABEL) // len(ordered)))
        return cls({moment: i for i, moment in enumerate(ordered)}, step)

    def x(self, moment: datetime) -> int:
        """The centre of the moment's slot."""
        return LEFT + self.step // 2 + self.slots[moment] * self.step

    @property
    def width(self) -> int:
        """The whole drawing: labels, one step per moment, outcomes."""
        return LEFT + self.step * len(self.slots) + RIGHT_LABEL


def moments(
    jobs: list[Job], events: list[JobEvent], generations: list[Generation], now: datetime
) -> set[datetime]:
    """Every moment the picture places something at."""
    found: set[datetime] = {now}
    found.update(ev.created_at for ev in events)
    found.update(job.created_at for job in jobs)
    for gen in generations:
        found.update((gen.first, gen.last))
        if gen.deleted_at is not None:
            found.add(gen.deleted_at)
    return found


def generation_bands(
    generations: list[Generation], axis: Axis, now: datetime
) -> list[dict[str, Any]]:
    """A band per generation, and a grey one for each tombstone until re-created (or now)."""
    step = axis.step
    bands = []
    for i, gen in enumerate(generations):
        nxt = generations[i + 1].first if i + 1 < len(generations) else None
        if gen.deleted_at is not None:
            end = gen.deleted_at
        elif nxt is not None:
            end = max(gen.last, gen.first)
        else:
            end = now
        x1, x2 = axis.x(gen.first), axis.x(end)
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
            t1, t2 = axis.x(gone), axis.x(nxt if nxt is not None and nxt > gone else now)
            bands.append(
                {
                    "x": t1,
                    "width": max(t2 - t1, 4),
                    "label": _("tombstone") if t2 - t1 >= 80 else "",
                    "colour": TOMBSTONE_COLOUR,
                    "title": _("generation %(n)s is a tombstone") % {"n": gen.number},
                }
            )
    return bands


def generation_marks(generations: list[Generation], axis: Axis) -> list[dict[str, Any]]:
    """A mark at each deletion (or the first job that found one) and at each re-creation."""
    marks = []
    for i, gen in enumerate(generations):
        if gen.deleted_at is not None:
            marks.append(
                {
                    "x": axis.x(gen.deleted_at),
                    "label": _("deleted"),
                    "kind": "deleted",
                    "title": _("generation %(n)s deleted at %(at)s")
                    % {"n": gen.number, "at": format_time(gen.deleted_at)},
                }
            )
        elif gen.tombstone_seen_at is not None:
            marks.append(
                {
                    "x": axis.x(gen.tombstone_seen_at),
                    "label": _("tombstone seen"),
                    "kind": "deleted",
                    "title": _("a job found generation %(n)s deleted at %(at)s")
                    % {"n": gen.number, "at": format_time(gen.tombstone_seen_at)},
                }
            )
        if i > 0:
            marks.append(
                {
                    "x": axis.x(gen.first),
                    "label": _("re-created as g%(n)s") % {"n": gen.number},
                    "kind": "recreated",
                    "title": _("generation %(n)s first seen at %(at)s")
                    % {"n": gen.number, "at": format_time(gen.first)},
                }
            )
    return marks


def _short(handler: str) -> str:
    if len(handler) <= HANDLER_CHARS:
        return handler
    return "…" + handler[-(HANDLER_CHARS - 1) :]


def _dot(ev: JobEvent, axis: Axis) -> dict[str, Any]:
    found = (
        _(", found g%(g)s/v%(v)s") % {"g": ev.found_generation, "v": ev.found_version}
        if ev.found_generation is not None
        else ""
    )
    return {
        "x": axis.x(ev.created_at),
        "title": f"{ev.event}{' ' + ev.reason if ev.reason else ''}"
        f" {format_time(ev.created_at)}{found}",
        "terminal": ev.event not in _OPEN_EVENTS,
    }


def job_rows(
    jobs: list[Job], events: list[JobEvent], axis: Axis, now: datetime
) -> list[dict[str, Any]]:
    """A bar per job, from its enqueue to its outcome (or now), with a dot per event."""
    by_job: dict[int, list[JobEvent]] = {}
    for ev in events:
        by_job.setdefault(ev.job_id, []).append(ev)
    rows = []
    for n, job in enumerate(jobs):
        mine = by_job.get(job.pk, [])
        # A finished job's bar ends at its last event (the outcome); an open one runs to now.
        end = mine[-1].created_at if job.finished_at is not None and mine else now
        outcome = job.get_status_display()
        if job.reason:
            outcome += f" ({job.reason})"
        rows.append(
            {
                "job": job,
                "y": TOP + 44 + n * ROW,
                "x1": axis.x(job.created_at),
                "x2": axis.x(end),
                "colour": STATUS_COLOURS.get(job.status, "#000"),
                "label": f"#{job.pk} {_short(job.handler)} g{job.generation}/v{job.version}",
                "outcome": outcome,
                "dots": [_dot(ev, axis) for ev in mine],
                "open": job.finished_at is None,
            }
        )
    return rows


def picture(
    jobs: list[Job], events: list[JobEvent], generations: list[Generation], now: datetime
) -> dict[str, Any]:
    """Coordinates for the template's inline SVG."""
    axis = Axis.of(moments(jobs, events, generations, now))
    width = axis.width
    return {
        "width": width,
        "height": TOP + 64 + len(jobs) * ROW,
        "bands": generation_bands(generations, axis, now),
        "marks": generation_marks(generations, axis),
        "rows": job_rows(jobs, events, axis, now),
        "now_x": axis.x(now),
        "left": LEFT,
        "label_x": LEFT - 8,
        "outcome_x": width - RIGHT_LABEL + 8,
        "axis_y": TOP + 20,
        "band_y": TOP - 24,
        "mark_y": TOP - 32,
        "top": TOP,
    }
