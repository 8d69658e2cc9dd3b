"""Template filters of the job audit's pages."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils.safestring import SafeString

from ..admin.display import format_duration, time_html

register = template.Library()


@register.filter
def tg_time(value: datetime | None) -> SafeString | str:
    """A time in the audit's one format (see :mod:`tombstones.admin.display`)."""
    return time_html(value)


@register.filter
def tg_duration(value: timedelta | None) -> str:
    """A duration as ``3 s``, ``4 min 05 s``, ``2 h 07 min`` or ``3 d 04 h``."""
    return format_duration(value)
