"""How the admin shows times: one format, with seconds, in the current time zone.

Every time column, read-only field and event table of the job audit, and the ``TombstoneAdmin``
pages (the ``deleted_at`` column and field, the record's History), go through :func:`time_html`
(columns through :func:`time_column`, templates through the ``tg_time`` filter of
``tombstones_admin``), so every page agrees. The full ISO timestamp, microseconds included,
stays in the ``datetime`` attribute for anyone who needs the exact order.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..logfields import fence_text

DATE_FORMAT = "%Y-%m-%d"
TIME_FORMAT = "%H:%M:%S"
EMPTY = "-"


def _local(value: datetime) -> datetime:
    return timezone.localtime(value) if timezone.is_aware(value) else value


def format_time(value: datetime | None) -> str:
    """``2026-12-01 04:12:48`` (local time, seconds, no microseconds); ``-`` for None."""
    if value is None:
        return EMPTY
    local = _local(value)
    return f"{local.strftime(DATE_FORMAT)} {local.strftime(TIME_FORMAT)}"


def generation_version(generation: int | None, version: int | None) -> str:
    """``g2/v5``; ``?`` for an unknown half, ``-`` when both are: never ``gNone``."""
    return fence_text(generation, version)


def time_html(value: datetime | None) -> SafeString | str:
    """:func:`format_time` in a ``<time>`` element; a narrow column wraps between date and time."""
    if value is None:
        return EMPTY
    local = _local(value)
    return format_html(
        '<time class="tg-time" datetime="{}"><span>{}</span> <span>{}</span></time>',
        value.isoformat(),
        local.strftime(DATE_FORMAT),
        local.strftime(TIME_FORMAT),
    )


def time_column(field: str, description: Any) -> Callable[[Any, Any], str]:
    """An admin column or read-only field showing ``field`` in the one time format."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Any) -> str:
        return time_html(getattr(obj, field))

    column.__name__ = field
    return column


def format_duration(value: timedelta | None) -> str:
    """A duration in its two largest units: ``3 s``, ``4 min 05 s``, ``2 h 07 min``, ``3 d 04 h``
    (a dashboard figure; exact to the second)."""
    if value is None:
        return EMPTY
    seconds = max(int(value.total_seconds()), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours:02d} h"
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {seconds:02d} s"
    return f"{seconds} s"
