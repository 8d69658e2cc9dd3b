"""Template filters of the job audit's pages."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils.safestring import SafeString

from ..display import time_html

register = template.Library()


@register.filter
def tg_time(value: datetime | None) -> SafeString | str:
    """A time in the audit's one format (see :mod:`tombstones.display`)."""
    return time_html(value)
