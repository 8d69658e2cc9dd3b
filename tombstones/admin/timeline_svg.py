"""The timeline's picture: pure geometry from jobs, events and generations to SVG coordinates.

An ordinal time axis (one step per distinct moment): in a race what matters is the order of
events, which a linear clock would squeeze into one pixel. Nothing here reads the database;
the template escapes every label.

The drawing is shown at its own size (one unit is one CSS pixel, text ``FONT`` px), so every
label's box is known here: labels that would touch are moved to another line or shortened, never
printed on top of each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.translation import gettext as _

from ..jobs.models import Job, JobEvent
from .display import format_time, generation_version
from .statuses import STATUS_COLOURS  # the one table of colours by status

GENERATION_COLOURS = ("#90caf9", "#a5d6a7", "#ffe082", "#ce93d8", "#80cbc4", "#ffab91")
TOMBSTONE_COLOUR = "#e0e0e0"

# Geometry of the SVG (pixels).
FONT = 13  # the drawing's text size
CHAR = 8  # a monospace glyph's advance at FONT (0.6 em), rounded up
LINE = 18  # one line of mark labels
LEFT = 340
STEP = 34
ROW = 30
PAD = 6  # above the first line of mark labels
BAND = 22  # the generations' band
RIGHT_LABEL = 280
# A long history gets narrower steps first, so the drawing fits beside the admin's navigation on
# a 1280 px screen; past the narrowest step its box scrolls sideways.
FIT_WIDTH = 880
MIN_STEP = 6
END_DOT = 7  # radius of the dot of an outcome; an event's is OPEN_DOT, both at most half a step
OPEN_DOT = 4
LABEL_GAP = 4  # between a mark's line and its label, and between two labels
# Events after which a job goes on; any other is drawn as a terminal dot.
_OPEN_EVENTS = frozenset({"enqueued", "claimed", "checked", "sending"})
# Written to a job by its record's deletion or purge, not by the job: not drawn on its bar, which
# ends where the job's outcome was recorded.
_NOT_THE_JOBS = frozenset({JobEvent.Event.PARAMS_ERASED})


@dataclass
class Generation:
    """One life of the record between its creation (or re-creation) and its deletion.

    ``first`` and ``last``: the first and last moments a job (or the record's own ``deleted_at``)
    shows it; None for the record's current generation while no job has seen it.
    """

    number: int
    first: datetime | None
    last: datetime | None
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

    def radius(self, wanted: int) -> int:
        """A dot's radius: ``wanted``, or less, so that a dot stays within its own slot."""
        return max(1, min(wanted, (self.step - 2) // 2))


def text_width(text: str) -> int:
    """The width of a label at FONT (an upper bound: every glyph of a monospace font)."""
    return len(text) * CHAR


def fit_end(text: str, room: int) -> str:
    """``text``, or its beginning and "…" so that it is at most ``room`` pixels wide."""
    if text_width(text) <= room:
        return text
    return text[: max(0, room // CHAR - 1)] + "…"


def outcome_at(job: Job, mine: list[JobEvent]) -> datetime | None:
    """When the job's outcome was recorded; None while it is open (queued, waiting, running).

    The ledger writes the outcome and its event in one statement: the job's last own event. Its
    ``finished_at`` when no event is stored (rows from before events were kept).
    """
    if job.finished_at is None:
        return None
    own = [ev.created_at for ev in mine if ev.event not in _NOT_THE_JOBS]
    return max(own) if own else job.finished_at


def _by_job(events: list[JobEvent]) -> dict[int, list[JobEvent]]:
    """Each job's own events, in the given (time) order."""
    found: dict[int, list[JobEvent]] = {}
    for ev in events:
        if ev.event not in _NOT_THE_JOBS:
            found.setdefault(ev.job_id, []).append(ev)
    return found


def moments(
    jobs: list[Job], events: list[JobEvent], generations: list[Generation], now: datetime
) -> set[datetime]:
    """Every moment the picture places something at."""
    found: set[datetime] = {now}
    found.update(ev.created_at for ev in events if ev.event not in _NOT_THE_JOBS)
    found.update(job.created_at for job in jobs)
    by_job = _by_job(events)
    found.update(filter(None, (outcome_at(job, by_job.get(job.pk, [])) for job in jobs)))
    for gen in generations:
        found.update(m for m in (gen.first, gen.last, gen.deleted_at) if m is not None)
    return found


def generation_bands(
    generations: list[Generation], axis: Axis, now: datetime
) -> list[dict[str, Any]]:
    """A band per generation, and a grey one for each tombstone until re-created (or now)."""
    step = axis.step
    bands = []
    for i, gen in enumerate(generations):
        first = gen.first or now  # only the record knows it: drawn where it was read, now
        nxt = (generations[i + 1].first or now) if i + 1 < len(generations) else None
        if gen.deleted_at is not None:
            end = gen.deleted_at
        elif nxt is not None:
            end = max(gen.last or first, first)
        else:
            end = now
        x1, x2 = axis.x(first), axis.x(end)
        bands.append(
            {
                "x": x1 - step // 2 + 2,
                "width": max(x2 - x1 + step - 4, step - 4, 4),
                "labels": (_("generation %(n)s") % {"n": gen.number}, f"g{gen.number}"),
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
                    "labels": (_("tombstone"),),
                    "colour": TOMBSTONE_COLOUR,
                    "title": _("generation %(n)s is a tombstone") % {"n": gen.number},
                }
            )
    return label_bands(bands)


def label_bands(bands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each band's longest label that fits inside it, clear of the bands drawn over it.

    Bands are drawn in order and a later one may cover part of an earlier one: a label is kept
    only where nothing covers it, so no two band labels can touch. No label when none fits (the
    band's title still names it).
    """
    for i, band in enumerate(bands):
        band["label"], band["label_x"] = "", band["x"] + LABEL_GAP + 2
        for label in band.pop("labels"):
            left = band["label_x"]
            right = left + text_width(label)
            inside = right <= band["x"] + band["width"] - LABEL_GAP
            covered = any(
                later["x"] < right and left < later["x"] + later["width"]
                for later in bands[i + 1 :]
            )
            if inside and not covered:
                band["label"] = label
                break
    return bands


def generation_marks(
    generations: list[Generation], axis: Axis, now: datetime
) -> list[dict[str, Any]]:
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
                    "x": axis.x(gen.first or now),
                    "label": _("re-created as g%(n)s") % {"n": gen.number},
                    "kind": "recreated",
                    "title": _("generation %(n)s first seen at %(at)s")
                    % {"n": gen.number, "at": format_time(gen.first)}
                    if gen.first is not None
                    else _("generation %(n)s: no job saw it; the record is at it now")
                    % {"n": gen.number},
                }
            )
    return marks


def stack_labels(marks: list[dict[str, Any]]) -> int:
    """Give each mark's label a line (``lane``): the lowest where it touches no other label.

    A label starts just right of its mark's line and runs right; its box reaches back over its
    own line. Taken from left to right, a label fits a line when it starts past the right end
    of the last label put there. Returns the number of lines (at least one).
    """
    ends: list[int] = []  # per line, the right end of its last label
    for mark in sorted(marks, key=lambda m: m["x"]):
        left = mark["x"] - LABEL_GAP
        right = mark["x"] + LABEL_GAP + text_width(mark["label"]) + LABEL_GAP
        lane = next((n for n, end in enumerate(ends) if left >= end), len(ends))
        if lane == len(ends):
            ends.append(right)
        ends[lane] = right
        mark["lane"] = lane
    return max(1, len(ends))


def _short(handler: str, room: int) -> str:
    """The handler's name, its beginning cut ("…") to fit ``room`` pixels: its end names it."""
    if text_width(handler) <= room:
        return handler
    keep = max(1, room // CHAR - 1)
    return "…" + handler[-keep:]


def _dot(ev: JobEvent, axis: Axis) -> dict[str, Any]:
    found = (
        _(", found %(found)s")
        % {"found": generation_version(ev.found_generation, ev.found_version)}
        if ev.found_generation is not None
        else ""
    )
    terminal = ev.event not in _OPEN_EVENTS
    return {
        "x": axis.x(ev.created_at),
        "title": f"{ev.event}{' ' + ev.reason if ev.reason else ''}"
        f" {format_time(ev.created_at)}{found}",
        "terminal": terminal,
        "r": axis.radius(END_DOT if terminal else OPEN_DOT),
    }


def job_rows(
    jobs: list[Job], events: list[JobEvent], axis: Axis, now: datetime, top: int
) -> list[dict[str, Any]]:
    """A bar per job, from its enqueue to its outcome (or now), with a dot per event of its own."""
    by_job = _by_job(events)
    rows = []
    room = LEFT - 2 * LABEL_GAP - CHAR  # the row's label, right-aligned before the axis
    for n, job in enumerate(jobs):
        mine = by_job.get(job.pk, [])
        # A finished job's bar ends where its outcome was recorded; an open one runs to now.
        end = outcome_at(job, mine) or now
        outcome = job.get_status_display()
        if job.reason:
            outcome += f" ({job.reason})"
        fence = generation_version(job.generation, job.version)
        handler = _short(job.handler, room - text_width(f"#{job.pk}  {fence}"))
        rows.append(
            {
                "job": job,
                "y": top + n * ROW,
                "x1": axis.x(job.created_at),
                "x2": axis.x(end),
                "colour": STATUS_COLOURS.get(job.status, "#000"),
                "label": f"#{job.pk} {handler} {fence}",
                "outcome": fit_end(outcome, RIGHT_LABEL - 2 * LABEL_GAP - CHAR),
                "outcome_title": outcome,
                "dots": [_dot(ev, axis) for ev in mine],
                "open": job.finished_at is None,
            }
        )
    return rows


def picture(
    jobs: list[Job], events: list[JobEvent], generations: list[Generation], now: datetime
) -> dict[str, Any]:
    """Coordinates for the template's inline SVG.

    From the top: the marks' labels (as many lines as their stacking needs), the generations'
    band, the axis, a row per job.
    """
    axis = Axis.of(moments(jobs, events, generations, now))
    width = axis.width
    marks = sorted(generation_marks(generations, axis, now), key=lambda m: m["x"])
    lanes = stack_labels(marks)
    band_y = PAD + lanes * LINE + LABEL_GAP
    for mark in marks:
        # Line 0 is the lowest, just above the band; a mark's line runs down from its label.
        mark["y"] = band_y - LABEL_GAP - 5 - mark["lane"] * LINE
        mark["label_x"] = mark["x"] + LABEL_GAP
    axis_y = band_y + BAND + 14
    rows_y = axis_y + 24
    return {
        "width": width,
        "height": rows_y + max(len(jobs), 1) * ROW,
        "bands": generation_bands(generations, axis, now),
        "marks": marks,
        "rows": job_rows(jobs, events, axis, now, rows_y),
        "now_x": axis.x(now),
        "left": LEFT,
        "label_x": LEFT - LABEL_GAP * 2,
        "outcome_x": width - RIGHT_LABEL + LABEL_GAP * 2,
        "axis_y": axis_y,
        "band_y": band_y,
    }
