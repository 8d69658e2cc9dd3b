"""Traces (issue 37): an enqueue records its span's context, the run's span is linked to it
with the messaging attributes; without OpenTelemetry nothing is imported and nothing changes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tombstones
from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import run

pytestmark = pytest.mark.django_db

HANDLER = "customers.update_sheet_row"
PLANTED = "Zq-Planted-91ac"
_EXPORTER = InMemorySpanExporter()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans this test ends (a provider set once per process: OpenTelemetry refuses a
    second)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _runs(exporter: InMemorySpanExporter) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("process ")]


def test_tracing__a_run_is_linked_to_the_span_that_enqueued_it(
    spans: InMemorySpanExporter, django_capture_on_commit_callbacks: Any
) -> None:
    customer = CustomerFactory(name=PLANTED, email=f"{PLANTED.lower()}@example.com")
    tracer = trace.get_tracer("tests")
    with django_capture_on_commit_callbacks(execute=True):
        with tracer.start_as_current_span("POST /customers") as request:
            job = tombstones.enqueue(HANDLER, customer)
        run(job)
    made = request.get_span_context()
    job.refresh_from_db()
    assert (
        job.traceparent
        == f"00-{made.trace_id:032x}-{made.span_id:016x}-{int(made.trace_flags):02x}"
    )

    (span,) = _runs(spans)
    assert span.name == "process default"
    assert span.kind == trace.SpanKind.CONSUMER
    assert [link.context.span_id for link in span.links] == [made.span_id]
    assert span.links[0].context.trace_id == made.trace_id
    assert span.context.trace_id != made.trace_id  # a trace of its own, linked
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "tombstones"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.message.id"] == str(job.pk)
    assert attributes["messaging.destination.name"] == "default"
    assert attributes["tombstones.job.handler"] == HANDLER
    assert attributes["tombstones.job.outcome"] == "succeeded"
    assert span.start_time <= span.end_time
    everything = repr(attributes) + repr(span.name) + job.traceparent
    assert PLANTED not in everything
    assert PLANTED.lower() not in everything


def test_tracing__a_rejected_run_says_why_and_no_span_makes_no_link(
    spans: InMemorySpanExporter, django_capture_on_commit_callbacks: Any
) -> None:
    customer = CustomerFactory()
    with django_capture_on_commit_callbacks(execute=True):
        job = tombstones.enqueue(HANDLER, customer)  # no span is current: nothing recorded
        Customer.objects.filter(pk=customer.pk).delete()
        run(job)
    job.refresh_from_db()
    assert job.traceparent == ""
    (span,) = _runs(spans)
    assert span.links == () or list(span.links) == []
    attributes = dict(span.attributes or {})
    assert (attributes["tombstones.job.outcome"], attributes["tombstones.job.reason"]) == (
        "rejected",
        "source_deleted",
    )


def test_tracing__a_failing_tracer_stops_no_enqueue_and_no_run(
    spans: InMemorySpanExporter,
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("exporter down")

    monkeypatch.setattr(trace, "get_current_span", broken)
    monkeypatch.setattr(trace, "get_tracer", broken)
    with django_capture_on_commit_callbacks(execute=True):
        job = run(tombstones.enqueue(HANDLER, CustomerFactory()))
    assert (job.status, job.traceparent) == ("succeeded", "")
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tracing:")]
    assert warned == [
        "tracing: could not read the current span (RuntimeError)",
        "tracing: could not record a job's span (RuntimeError)",
    ]


def test_tracing__without_opentelemetry_nothing_is_imported() -> None:
    """In a process where ``opentelemetry`` cannot be found."""
    code = textwrap.dedent(
        """
        import sys, importlib.abc
        from datetime import datetime, UTC
        from types import SimpleNamespace

        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] == "opentelemetry":
                    raise ModuleNotFoundError(name)
                return None

        sys.meta_path.insert(0, Hide())
        import django, os
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
        django.setup()
        from tombstones.jobs import tracing
        assert tracing.available() is False
        assert tracing.traceparent() == ""
        job = SimpleNamespace(started_at=datetime.now(UTC), traceparent="", queue="default")
        tracing.job_ran(job, "succeeded", "")
        assert not [m for m in sys.modules if m.startswith("opentelemetry")], sys.modules
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.strip() == "ok", done.stderr
