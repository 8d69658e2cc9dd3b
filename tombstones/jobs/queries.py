"""The job table's named conditions, written once: due, lane heads, lapsed, too old...

The engine, the sweep, the admin, the dashboard, the doctor and purge all ask through these
methods (``Job.objects.claimable()``, ``.lane_heads()``, ``.lapsed()``...).

Lane order: the jobs of one ordering key run one at a time, in order of ``queued_at`` (the
moment the job took its place: its enqueue, or its ``run_after`` when it was delayed), then id.
A job that holds its lane (running, waiting to retry, paused) blocks every other job of it; a
queued job waits behind the queued jobs with an earlier place. A delayed job is not in line
before it is due, so an immediate job queued after it does not wait for it.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import connections, models
from django.db.models import (
    BooleanField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    Value,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from .states import CLAIMABLE, HELD, HOLDING, QUEUED, RUNNING, UNFINISHED, Event


def _max_age() -> Any:
    from ..conf import tombstone_settings

    return Value(tombstone_settings.JOB_MAX_AGE)


def _jobs() -> models.QuerySet[Any]:
    # The model by label: this module is imported by models.py, so it cannot import it back.
    return apps.get_model("tombstones", "Job")._default_manager.all()


def _events() -> models.QuerySet[Any]:
    return apps.get_model("tombstones", "JobEvent")._default_manager.all()


def from_now(column: str) -> ExpressionWrapper:
    return ExpressionWrapper(F(column) - Now(), output_field=DurationField())


# --- the named conditions, each written once --------------------------------------------------


def placed_before(queued_at: Any, pk: Any) -> Q:
    """Rows placed earlier in a lane than (``queued_at``, ``pk``): lane order is (queued_at, id).

    Either may be an ``OuterRef`` (the outer job's place) or a job's own values.
    """
    return Q(queued_at__lt=queued_at) | Q(queued_at=queued_at, id__lt=pk)


def placed_after(queued_at: Any, pk: Any) -> Q:
    """Rows placed later in a lane than (``queued_at``, ``pk``): the converse of placed_before."""
    return ~placed_before(queued_at, pk) & ~Q(pk=pk)


def due() -> Q:
    """Waiting for a worker (queued or retry_wait), and its ``run_after`` has come."""
    return Q(status__in=CLAIMABLE, run_after__lte=Now())


def overdue() -> Q:
    """Queued and due for longer than a lease: a wake-up or a worker should have taken it."""
    from ..conf import tombstone_settings

    return Q(status=QUEUED, run_after__lt=Now() - Value(tombstone_settings.LEASE))


def unclaimed() -> Q:
    """No claim holds the row: a queued job with a claim token is a lane follower reserved by a
    running worker's claim, which records its outcome with its head's."""
    return Q(claim_token="")


def held_by(token: Any) -> Q:
    """The jobs a claim holds: its heads (running) and the lane followers it reserved."""
    return Q(claim_token=token, status__in=HELD)


def held() -> Q:
    """Held by a claim (a running head or a reserved follower): the ``claim_token`` index."""
    return ~Q(claim_token="")


def hinted() -> Q:
    """A claim should look at this job's lane now (its ``ready_at`` hint has come)."""
    return Q(ready_at__lte=Now())


# The hint index's order: a range of one queue read in it (``order_by(*HINT_ORDER)``) comes in
# the order its hints came due, however the planner sees the queue's bounds.
HINT_ORDER = ("queue", "ready_at", "id")


def hint_range(db: str, queue: str, floor: Any = None) -> Q | RawSQL:
    """The hints of ``queue`` (from ``floor`` on, due or not): one range of the hint index,
    read in its order with ``order_by(*HINT_ORDER)``.

    On PostgreSQL written so that the planner rates it as a third of the table, whatever its
    statistics say, and so reads the first hints in index order rather than every hint of the
    range, then sorts them (a bitmap scan: 30,000 rows a claim with a backlog queued since the
    last statistics, issue 35). ``ready_at >= floor AND ready_at <= now`` was rated 0.5% of the
    table, and so was ``queue = 'default'`` with the statistics of an empty table: bounds it
    cannot read at planning (``concat()``, a timestamp plus an interval: stable, not constant),
    the lower one a row comparison on the index's columns, never paired with the upper one."""
    conn = connections[db]
    if conn.vendor != "postgresql":
        found = Q(queue=queue, ready_at__isnull=False)
        return found & Q(ready_at__gte=floor) if floor is not None else found
    table = conn.ops.quote_name(_jobs().model._meta.db_table)
    name, at, pk = (f"{table}.{conn.ops.quote_name(column)}" for column in HINT_ORDER)
    start = "%s::timestamptz + '0 s'::interval" if floor is not None else "'-infinity'"
    return RawSQL(
        f"(({name}, {at}, {pk}) >= (concat(%s::text), {start}, 0) "
        f"AND {name} <= concat(%s::text) AND {at} IS NOT NULL)",
        (queue, floor, queue) if floor is not None else (queue, queue),
        output_field=BooleanField(),
    )


def followers_of(token: Any) -> Q:
    """The lane followers a claim reserved (queued, with its token)."""
    return Q(claim_token=token, status=QUEUED)


def lease_ran_out() -> Q:
    """The lease's end is past (database clock)."""
    return Q(lease_expires_at__lt=Now())


def lapsed() -> Q:
    """Running on a lease that ran out: its worker vanished (or stalled)."""
    return Q(status=RUNNING) & lease_ran_out()


def lane_head() -> Q:
    """No other job of the lane runs before this one (see the module docstring)."""
    return ~Q(holders_in_lane()) & (Q(status__in=HOLDING) | ~Q(ahead()))


def claimable() -> Q:
    # A queued job with a claim token is a lane follower reserved by a claim: its own.
    return due() & unclaimed() & lane_head()


def too_old() -> Q:
    """Enqueued longer than ``TOMBSTONES_JOB_MAX_AGE`` ago (database clock)."""
    return Q(created_at__lt=Now() - _max_age())


def holders_in_lane() -> Exists:
    """Another job of the outer job's lane holds it (running, retry_wait, paused)."""
    return Exists(
        _jobs().filter(lane=OuterRef("lane"), status__in=HOLDING).exclude(pk=OuterRef("pk"))
    )


def ahead(*, exclude: Any = ()) -> Exists:
    """A queued job of the outer job's lane with an earlier place, other than ``exclude``."""
    earlier = placed_before(OuterRef("queued_at"), OuterRef("id"))
    queued = _jobs().filter(earlier, lane=OuterRef("lane"), status=QUEUED)
    return Exists(queued.exclude(pk__in=list(exclude)) if exclude else queued)


def behind() -> Exists:
    """An unfinished job of the outer job's lane waits behind it (a later place)."""
    later = placed_after(OuterRef("queued_at"), OuterRef("id"))
    return Exists(_jobs().filter(later, lane=OuterRef("lane"), status__in=UNFINISHED))


def resolved_before() -> Exists:
    """Staff resolved the outer job once already (so it was resent at most once)."""
    return Exists(_events().filter(job_id=OuterRef("pk"), event=Event.RESOLVED))
