"""How the admin shows a job status: one colour and one shape per status, and the badge.

The one table every page reads: the job list, the job page, the rejection log, the dashboard's
cards, tables and charts, the record timeline (:mod:`.timeline_svg`). A badge never relies on
its colour alone: it carries the status's word and a shape of its own (a ring for queued, a
check for succeeded, a cross for rejected...), so it reads in grey scale and for colour-blind
eyes. Each colour has at least 4.5:1 contrast on white (the badge's background and the
timeline's), enough for text as well as for the shape.

The shape is an inline SVG whose colour is a presentation attribute, not a ``style``: a strict
Content-Security-Policy (``style-src`` without ``'unsafe-inline'``) leaves it drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..jobs.models import Job

__all__ = ["STATUS_COLOURS", "STATUS_STYLES", "StatusStyle", "status_badge"]

Status = Job.Status


@dataclass(frozen=True)
class StatusStyle:
    colour: str  # at least 4.5:1 on white
    shape: str  # its name, a CSS class suffix and a word for tests
    path: str  # an SVG path on a 12 x 12 box
    filled: bool  # filled with the colour, or drawn as a 2 px line


_RING = "M6 1.5a4.5 4.5 0 1 0 0 9a4.5 4.5 0 1 0 0-9z"

# Open shapes for statuses still moving, solid ones for outcomes; no two alike.
STATUS_STYLES: dict[str, StatusStyle] = {
    Status.QUEUED: StatusStyle("#1565c0", "ring", _RING, False),
    Status.RUNNING: StatusStyle("#0277bd", "play", "M3 1.5L10.5 6L3 10.5z", True),
    Status.RETRY_WAIT: StatusStyle("#5c6bc0", "hourglass", "M2.5 1.5h7L2.5 10.5h7z", False),
    Status.PAUSED: StatusStyle("#8d6e63", "pause", "M2.5 1.5h2.5v9h-2.5zM7 1.5h2.5v9h-2.5z", True),
    Status.SUCCEEDED: StatusStyle("#2e7d32", "check", "M1.5 6.5L4.5 9.5L10.5 2.5", False),
    Status.REJECTED: StatusStyle("#c62828", "cross", "M2 2L10 10M10 2L2 10", False),
    Status.UNCERTAIN: StatusStyle("#b34700", "diamond", "M6 1L11 6L6 11L1 6z", False),
    Status.SUPERSEDED: StatusStyle(
        "#8a5a00", "chevrons", "M1.5 2L5.5 6L1.5 10M6.5 2L10.5 6L6.5 10", False
    ),
    Status.ESCALATED: StatusStyle("#6a1b9a", "arrow-up", "M6 1L11 7H8v4H4V7H1z", True),
    Status.EXPIRED: StatusStyle("#6b6b6b", "square", "M2 2h8v8h-8z", False),
    Status.FAILED: StatusStyle("#ad1457", "triangle", "M6 1L11.5 11H0.5z", True),
    Status.CANCELLED: StatusStyle("#616161", "slashed-ring", _RING + "M2.8 2.8L9.2 9.2", False),
}

# The colours alone: the charts' segments and the timeline's bars.
STATUS_COLOURS: dict[str, str] = {status: style.colour for status, style in STATUS_STYLES.items()}


def _label(status: str) -> str:
    try:
        return str(Status(status).label)
    except ValueError:
        return status


def status_icon(status: str) -> SafeString:
    """The status's shape in its colour, hidden from screen readers (the word follows it)."""
    style = STATUS_STYLES.get(status)
    if style is None:
        return format_html("")
    paint = (
        format_html('fill="{}"', style.colour)
        if style.filled
        else format_html(
            'fill="none" stroke="{}" stroke-width="2" stroke-linecap="round" '
            'stroke-linejoin="round"',
            style.colour,
        )
    )
    return format_html(
        '<svg class="tg-status-icon" viewBox="0 0 12 12" width="12" height="12" '
        'aria-hidden="true" focusable="false"><path d="{}" {}></path></svg>',
        style.path,
        paint,
    )


def status_badge(status: str, text: object = None) -> SafeString:
    """``status`` as a badge: its shape, then ``text`` (the status's label unless given).

    ``data-status`` and ``data-shape`` let a test (or a user's stylesheet) find it."""
    style = STATUS_STYLES.get(status)
    return format_html(
        '<span class="tg-status tg-status--{}" data-status="{}" data-shape="{}">{}'
        '<span class="tg-status-text">{}</span></span>',
        status,
        status,
        style.shape if style else "",
        status_icon(status),
        _label(status) if text is None else text,
    )
