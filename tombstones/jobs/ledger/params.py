"""What a job's params become: erased when it ends (:func:`params_after`), or when its record
becomes a tombstone or is purged (:func:`erase_params`).

One module for both roads, so that "nothing of a record outlives it" is read in one place; the
outcome writers (:mod:`.outcomes`) and the erasure receivers (:mod:`tombstones.jobs.erasure`)
call it.
"""

from __future__ import annotations

from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.db.models import Case, Exists, F, Q, Value, When

from ...records.fencing import Fence
from ..models import Job, JobEvent
from ..states import TERMINAL, Event, Status

EMPTY_PARAMS = Value({}, models.JSONField())  # params erased


def params_after(job: Job, status: str, db: str) -> Any:
    """What a change to ``status`` outside a claim writes to the params (None: kept).

    A job's params are erased when it ends, whatever it ends with, except a success (its record's
    tombstone erases them) and an uncertain job whose record lives (staff may resend it once).
    """
    if status not in TERMINAL or status == Status.SUCCEEDED:
        return None
    if status == Status.UNCERTAIN and job.is_plain:
        return None  # no record to outlive: kept, for staff to resend once
    if status == Status.UNCERTAIN:
        live = live_record(job, db)
        if live is not None:
            return Case(When(Exists(live), then=F("params")), default=EMPTY_PARAMS)
    return EMPTY_PARAMS


def live_record(job: Job, db: str) -> models.QuerySet[Any] | None:
    """The job's record, if it is live at the job's generation (None: not a record model)."""
    if job.content_type_id is None:
        return None  # a plain job: no record
    model = ContentType.objects.db_manager(db).get_for_id(job.content_type_id).model_class()
    if model is None or not hasattr(model, "all_objects") or job.generation is None:
        return None  # no record model, or no fence: nothing is live at it
    return Fence(model, job.object_id, job.generation).rows(db)


def erase_params(
    content_type: ContentType, ids: list[str], using: str, *, exclude: Q | None = None
) -> int:
    """Erase the params of these records' jobs (but ``exclude``'s): one ``params_erased`` event
    each, ids only. The number of jobs erased; call it inside the deletion's transaction."""
    jobs = Job.objects.using(using).filter(content_type=content_type, object_id__in=ids)
    if exclude is not None:
        jobs = jobs.exclude(exclude)
    # Rows a worker holds are skipped, not waited for: that worker locked the job before the
    # record, this deletion the record before the job, and waiting could deadlock. Such a job is
    # running; the engine erases its params when it ends.
    found = list(
        jobs.exclude(params={})
        .select_for_update(skip_locked=True)
        .order_by("pk")
        .values_list("pk", "object_id", "generation", "version")
    )
    if not found:
        return 0
    Job.objects.using(using).filter(pk__in=[row[0] for row in found]).update(params={})
    JobEvent.objects.using(using).bulk_create(
        JobEvent(
            job_id=pk,
            content_type=content_type,
            object_id=object_id,
            event=Event.PARAMS_ERASED,
            expected_generation=generation,
            expected_version=version,
        )
        for pk, object_id, generation, version in found
    )
    return len(found)
