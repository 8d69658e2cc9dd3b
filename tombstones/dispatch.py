"""Enqueue: one INSERT snapshots (record, generation, version) in the caller's transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models, router, transaction
from django.db.models import Value
from django.db.models.functions import Greatest, Now
from django.utils import timezone

from .models import Job
from .validation import check_enqueue
from .wakeups import wake, wake_soon

__all__ = ["default_lane", "enqueue", "wake", "wake_soon"]


def default_lane(record: models.Model) -> str:
    """The default ordering key: ``app_label.model:pk``."""
    return f"{record._meta.label_lower}:{record.pk}"


def enqueue(
    handler: str,
    record: models.Model,
    *,
    params: dict[str, Any] | None = None,
    ordering_key: str | None = None,
    run_after: datetime | None = None,
    using: str | None = None,
) -> Job:
    """Queue a fenced job for ``record`` and wake a worker once the caller's transaction commits.

    Every check runs before any SQL (:mod:`tombstones.validation`), so a refusal leaves the
    caller's transaction usable: UnknownHandler, NotATombstoneModel, MissingFence, RecordDeleted,
    InvalidOrderingKey, InvalidRunAfter, InvalidParams.
    """
    found, pk, generation, version, clean = check_enqueue(
        handler, record, params=params, ordering_key=ordering_key, run_after=run_after
    )
    db = using or router.db_for_write(Job)
    content_type = ContentType.objects.db_manager(db).get_for_model(record)
    fields: dict[str, Any] = {
        "handler": found.name,
        "content_type": content_type,
        "object_id": str(pk),
        "generation": generation,
        "version": version,
        "lane": ordering_key or default_lane(record),
        "params": clean,
        "external": found.external,
    }
    if run_after is not None:
        # A delayed job takes its place in its lane when it is due; never before now, so that it
        # cannot overtake the jobs queued before it.
        due = Greatest(Value(run_after, output_field=models.DateTimeField()), Now())
        fields["run_after"] = fields["queued_at"] = due
    # One INSERT: the job row is also the audit record of the enqueue (Job.enqueued_event). In
    # the caller's transaction if there is one, so a rolled-back request leaves no job.
    job = Job.objects.using(db).create(**fields)
    if run_after is not None:  # the row holds the database's answer; this is close to it
        job.run_after = job.queued_at = max(run_after, timezone.now())
    job_id = job.pk
    transaction.on_commit(lambda: wake_soon(job_id), using=db)
    return job
