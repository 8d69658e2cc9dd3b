"""Traces, with ``opentelemetry-api`` installed (the ``otel`` extra); without it nothing here
imports anything and every function returns at once.

- An enqueue records the current span's context in the job (``Job.traceparent``, W3C
  ``traceparent``: trace id, span id, flags). Only that: no baggage and no trace state, which
  may carry a user's values.
- Each run of a job ends in a span of its own (``process <queue>``, kind CONSUMER), from the
  run's start to its outcome, *linked* to the span that enqueued it, with the messaging
  attributes of OpenTelemetry's semantic conventions and the outcome's status and reason. A link
  rather than a parent, as the conventions advise for a message processed later: the run is a
  trace of its own, reachable from the request's.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from functools import cache
from importlib.util import find_spec
from typing import TYPE_CHECKING

from django.utils import timezone

if TYPE_CHECKING:
    from .models import Job

logger = logging.getLogger("tombstones")

TRACER = "tombstones"
SYSTEM = "tombstones"
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# The outcomes that mark a run's span as an error (the others ran as they should: a rejection
# is the fence doing its work).
_ERRORS = frozenset({"failed", "escalated", "uncertain"})


@cache
def available() -> bool:
    """Whether ``opentelemetry-api`` is installed (asked once per process)."""
    try:
        return find_spec("opentelemetry.trace") is not None
    except ImportError:  # no "opentelemetry" package at all
        return False


def traceparent() -> str:
    """The current span's ``traceparent`` ("" with no valid span, or without OpenTelemetry)."""
    if not available():
        return ""
    try:
        return _traceparent()
    except Exception as exc:  # noqa: BLE001 - a tracer's fault must not refuse an enqueue
        _failed("read the current span", exc)
        return ""


def job_ran(job: Job, status: str, reason: str) -> None:
    """The span of ``job``'s run that ended in ``status`` (``reason``), from its start until now;
    nothing for a job that did not run (cancelled, expired by the sweep) or without OTel."""
    if not available() or job.started_at is None:
        return
    try:
        _job_span(job, job.started_at, status, reason)
    except Exception as exc:  # noqa: BLE001 - after the commit: a tracer's fault stops no worker
        _failed("record a job's span", exc)


def _failed(what: str, exc: Exception) -> None:
    logger.warning("tracing: could not %s (%s)", what, type(exc).__name__)


def _traceparent() -> str:
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _job_span(job: Job, started: datetime, status: str, reason: str) -> None:
    from opentelemetry import context, trace

    links = []
    found = _TRACEPARENT.fullmatch(job.traceparent or "")
    if found:
        enqueued = trace.SpanContext(
            trace_id=int(found[1], 16),
            span_id=int(found[2], 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(int(found[3], 16)),
        )
        if enqueued.is_valid:
            links.append(trace.Link(enqueued))
    span = trace.get_tracer(TRACER).start_span(
        f"process {job.queue}",
        context=context.Context(),  # a trace of its own, linked to the enqueue
        kind=trace.SpanKind.CONSUMER,
        links=links,
        start_time=_ns(started),
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "run",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.pk),
            "tombstones.job.handler": job.handler,
            "tombstones.job.outcome": status,
            "tombstones.job.reason": reason,
            "tombstones.job.attempts": job.attempts,
        },
    )
    if status in _ERRORS:
        span.set_status(trace.Status(trace.StatusCode.ERROR, reason or status))
    span.end(end_time=max(_ns(timezone.now()), _ns(started)))  # two clocks


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)
