"""Coalescing per record: a handler's (or a task's) declaration that only the newest of its
queued jobs for a record matters.

``@tombstones.handler(name, coalesce=True)``: when a job of that handler is queued for a record,
its earlier jobs for the same record (the same lane), handler and coalescing key that have not
started end ``superseded`` / ``coalesced``, never run. ``coalesce`` may also be a function of the
job's params returning the key (a str): jobs with different keys do not coalesce.

``debounce=timedelta(...)`` with ``max_delay=timedelta(...)``: a job waits ``debounce`` for newer
ones (the trailing edge: the newest runs once the stream pauses for ``debounce``), and never more
than ``max_delay`` after the first job of its window was queued. ``edge="leading"``: the window's
first job runs at once and the rest of the window coalesces into one job at its end.

The rules a job keeps: a job that started (claimed, retried, sending, uncertain, resent) is never
touched; the survivor's snapshot is its own enqueue's, the newest, so a delete or a re-create
still rejects it; lane order stands (the survivor takes its place at its enqueue, or when due).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from django.core.exceptions import ImproperlyConfigured

from ..exceptions import InvalidParams

Edge = Literal["trailing", "leading"]
EDGES: tuple[Edge, ...] = ("trailing", "leading")
KeyFunc = Callable[[dict[str, Any]], str]
# The width of Job.coalesce_key.
MAX_KEY_LENGTH = 200


@dataclass(frozen=True)
class Coalescing:
    """A handler's coalescing options, checked when it is defined (:func:`declare`)."""

    key: KeyFunc | None = None  # None: one key for every job of the handler and record
    debounce: timedelta | None = None
    max_delay: timedelta | None = None
    edge: Edge = "trailing"

    def key_for(self, params: dict[str, Any]) -> str:
        """The coalescing key of a job with these params: a str of at most 200 characters."""
        if self.key is None:
            return ""
        found = self.key(dict(params))
        if not isinstance(found, str) or len(found) > MAX_KEY_LENGTH:
            raise InvalidParams(
                f"A coalescing key must be a str of at most {MAX_KEY_LENGTH} characters; the "
                f"handler's key function returned a {type(found).__name__}."
            )
        return found


def declare(
    name: str,
    coalesce: bool | KeyFunc,
    debounce: timedelta | None,
    max_delay: timedelta | None,
    edge: str,
    *,
    plain: bool,
) -> Coalescing | None:
    """The options of ``@handler(name, coalesce=..., debounce=..., max_delay=..., edge=...)``,
    or None for a handler that does not coalesce; ImproperlyConfigured for what cannot work."""

    def refuse(problem: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"Job handler {name!r}: {problem}")

    if coalesce is False or coalesce is None:
        if debounce is not None or max_delay is not None or edge != "trailing":
            raise refuse("debounce, max_delay and edge need coalesce=True (or a key function).")
        return None
    if coalesce is not True and not callable(coalesce):
        raise refuse("coalesce is True, False or a function of the job's params returning a str.")
    if plain:
        raise refuse(
            "a plain job (for no record) has no record to coalesce on: coalescing handlers run "
            "record jobs only (plain=False)."
        )
    if edge not in EDGES:
        raise refuse(f"edge is 'trailing' or 'leading', not {edge!r}.")
    for label, value in (("debounce", debounce), ("max_delay", max_delay)):
        if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
            raise refuse(f"{label} must be a positive timedelta, not {value!r}.")
    if debounce is None:
        if max_delay is not None or edge != "trailing":
            raise refuse("max_delay and edge='leading' need a debounce window.")
    elif max_delay is None:
        raise refuse(
            "a debounce window needs max_delay: without it a stream of jobs could postpone the "
            "newest for ever."
        )
    elif max_delay < debounce:
        raise refuse(f"max_delay ({max_delay}) must be at least the debounce window ({debounce}).")
    key = None if coalesce is True else coalesce
    return Coalescing(key=key, debounce=debounce, max_delay=max_delay, edge=edge)
