"""Enqueue's coalescing (:mod:`tombstones.jobs.coalescing`): the earlier jobs a new one
supersedes, and when the new one is due.

Called with the lane's row held (:func:`.lanes.hold`; on SQLite the write transaction itself),
so that two enqueues for one record run one after the other: the second sees the first's job
and supersedes it, and exactly one survives. A job a claim took meanwhile is not superseded (the
conditional UPDATE of :func:`.outcomes.transition` finds it running or reserved): it runs, in its
place, and the new job after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models, transaction
from django.db.models import Q, Value
from django.db.models.functions import Greatest, Least, Now

from ..coalescing import Coalescing
from ..models import Job
from ..states import Reason, Status
from . import lanes
from .insert import insert_job
from .outcomes import transition

# Not started: queued, never claimed (a retry, a crash's give-back, a staff resend all count as
# started), reserved by no claim, no external call begun.
NOT_STARTED = Q(
    status=Status.QUEUED, attempts=0, reason="", claim_token="", started_at=None, sending_at=None
)


@dataclass(frozen=True)
class Plan:
    """What the new job is given: when it is due (None: now) and its window's start."""

    run_after: Any = None  # an expression of the database's clock, or None
    window_started_at: Any = None


def plan(db: str, handler: str, lane: str, key: str, options: Coalescing) -> tuple[Plan, list[Job]]:
    """The new job's due time and window, and the earlier jobs it supersedes."""
    mine = Job.objects.using(db).filter(lane=lane, handler=handler, coalesce_key=key)
    if options.debounce is None:
        return Plan(), list(mine.filter(NOT_STARTED))
    debounce = Value(options.debounce, output_field=models.DurationField())
    if options.edge == "leading":
        opened = (
            mine.filter(window_started_at__gt=Now() - debounce)
            .order_by("-window_started_at")
            .values_list("window_started_at", flat=True)
            .first()
        )
        if opened is None:  # the window's first job: it runs now, and opens the window
            return Plan(window_started_at=Now()), list(mine.filter(NOT_STARTED))
        # The rest of the window coalesces into one job at its end; a due job (the leading
        # one, not claimed yet) runs as it is.
        end = _at(opened) + debounce
        waiting = mine.filter(NOT_STARTED, run_after__gt=Now())
        return Plan(run_after=end, window_started_at=_at(opened)), list(waiting)
    # A job already due is left to run: superseding it would postpone its window's run again at
    # each edit that comes before a worker takes it, past max_delay. The new job opens a window.
    earlier = list(mine.filter(NOT_STARTED, run_after__gt=Now()))
    starts = [job.window_started_at for job in earlier if job.window_started_at is not None]
    if not starts:
        return Plan(run_after=Now() + debounce, window_started_at=Now()), earlier
    opened = min(starts)
    latest = _at(opened) + Value(options.max_delay, output_field=models.DurationField())
    return Plan(run_after=Least(Now() + debounce, latest), window_started_at=_at(opened)), earlier


def supersede(jobs: list[Job]) -> int:
    """End ``jobs`` superseded / coalesced, each only if it still has not started."""
    done = 0
    for job in jobs:
        done += transition(
            job,
            Status.SUPERSEDED,
            Reason.COALESCED,
            from_status=(Status.QUEUED,),
            extra_filter=NOT_STARTED,
            lease_expires_at=None,
        )
    return done


def _at(moment: datetime) -> Value:
    return Value(moment, output_field=models.DateTimeField())


def insert_newest(
    db: str, options: Coalescing, *, run_after: datetime | None, **fields: Any
) -> Job:
    """Enqueue's insert for a coalescing handler: the lane held, the plan read, the job
    inserted, the earlier jobs superseded; all in the caller's transaction (one of its own
    without one). ``fields`` are :func:`.insert.insert_job`'s, ``coalesce_key`` included."""
    lane, handler, key = fields["lane"], fields["handler"], fields["coalesce_key"]
    with transaction.atomic(using=db, savepoint=False):
        lanes.hold(db, lane)
        planned, earlier = plan(db, handler, lane, key, options)
        due = planned.run_after
        if run_after is not None and due is not None:  # the later of the two
            due = Greatest(Value(run_after, output_field=models.DateTimeField()), due)
            run_after = None
        job = insert_job(
            db, run_after=run_after, due=due, window_started_at=planned.window_started_at, **fields
        )
        supersede(earlier)
    return job
