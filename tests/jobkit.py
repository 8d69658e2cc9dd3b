"""Helpers for job tests: throwaway handlers and a way to run one job through the real worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db.models import Value
from django.db.models.functions import Now

from tombstones import registry
from tombstones.models import Job
from tombstones.worker import run_job


@contextmanager
def temp_handler(
    name: str, func: Callable[[Any], Any], **options: Any
) -> Iterator[Callable[[Any], Any]]:
    registry.handler(name, **options)(func)
    try:
        yield func
    finally:
        registry.unregister(name)


def run(job: Job) -> Job:
    """Run one job through the production worker function and reload it."""
    run_job(job.pk)
    job.refresh_from_db()
    return job


def make_due(job: Job) -> None:
    """Back-date run_after instead of sleeping through a backoff."""
    from datetime import timedelta

    Job.objects.filter(pk=job.pk).update(run_after=Now() - Value(timedelta(seconds=1)))


def events(job: Job) -> list[str]:
    return list(job.events.order_by("id").values_list("event", flat=True))
