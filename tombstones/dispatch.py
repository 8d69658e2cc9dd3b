"""Enqueue: one INSERT snapshots (record, generation, version) in the caller's transaction."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models, router, transaction

from . import coalesce
from .conf import tombstone_settings
from .models import Job
from .validation import check_enqueue

logger = logging.getLogger("tombstones")

TASK = "tombstones.worker.run"


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
        fields["run_after"] = run_after
    # One INSERT: the job row is also the audit record of the enqueue (Job.enqueued_event). In
    # the caller's transaction if there is one, so a rolled-back request leaves no job.
    job = Job.objects.using(db).create(**fields)
    job_id = job.pk
    if found.external:
        transaction.on_commit(lambda: wake(job_id), using=db)
    else:
        transaction.on_commit(lambda: wake_unless_pending(job_id), using=db)
    return job


def wake_unless_pending(job_id: int) -> str | None:
    """Wake a worker for an internal job, unless a pending wake-up will pick it up.

    With TOMBSTONES_COALESCE_WAKES a pending message runs the fast path's pump, which claims every
    due internal lane head, this job included (see :mod:`tombstones.coalesce`). A lost message is
    the sweep's to repair.
    """
    coalescing = (
        tombstone_settings.COALESCE_WAKES and tombstone_settings.BATCH_SIZE and not runs_in_sync()
    )
    if coalescing and not coalesce.arm():
        return None
    sent = wake(job_id)
    if coalescing and sent is None:
        coalesce.open_gate()  # nothing will open it: let the next enqueue send its message
    return sent


def runs_in_sync() -> bool:
    """True when a wake-up runs the job at once in the caller (django-q2's sync mode)."""
    from django_q.conf import Conf

    return bool(tombstone_settings.Q_OPTIONS.get("sync", Conf.SYNC))


def wake(job_id: int) -> str | None:
    """Send the django-q2 message for one job (its id only). A lost message loses no job."""
    from django_q.tasks import async_task

    options = {"group": "tombstones", "ack_failure": True, **tombstone_settings.Q_OPTIONS}
    try:
        # One broker (and connection) per process, not one per message.
        return async_task(TASK, job_id, broker=coalesce.broker(), **options)
    except Exception as exc:  # noqa: BLE001 - any broker failure: the sweep re-dispatches the job
        logger.error(
            "wake for job %s failed (%s); the sweep will re-dispatch it",
            job_id,
            type(exc).__name__,
            extra={"tombstones": {"job_id": job_id, "error_class": type(exc).__name__}},
        )
        return None
