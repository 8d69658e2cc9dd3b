"""Enqueue: check, then one INSERT (the ledger's) snapshots (record, generation, version) in the
caller's transaction, then wake a worker once it commits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models, router, transaction

from .ledger import insert_job
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
    job = insert_job(
        db,
        handler=found.name,
        content_type=ContentType.objects.db_manager(db).get_for_model(record),
        object_id=str(pk),
        generation=generation,
        version=version,
        lane=ordering_key or default_lane(record),
        params=clean,
        external=found.external,
        run_after=run_after,
    )
    job_id = job.pk
    transaction.on_commit(lambda: wake_soon(job_id), using=db)
    return job
