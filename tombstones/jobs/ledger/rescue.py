"""Take-back: the jobs of workers that vanished (their lease ran out) return, never run twice.

Apart from :mod:`.claims` and :mod:`.outcomes` because it is neither a claim nor a worker's
outcome: the sweep and the alarms end, from outside, claims whose worker is gone.
"""

from __future__ import annotations

from typing import Any

from django.db import router, transaction
from django.db.models import Exists, F, OuterRef, Q

from ...conf import tombstone_settings
from .. import queries
from ..models import Job
from ..states import Event, Reason, Status
from .claims import uncharged, worker_id
from .outcomes import event_row, transition


def take_back_lapsed(using: str | None = None, *, limit: int = 500) -> dict[str, int]:
    """Jobs whose worker vanished (lease ran out): never run twice, never lost.

    - an external call was sent: ``uncertain``, never repeated by itself;
    - claimed alone: a claim without an outcome; ``failed``/``crashed`` once it was claimed
      TOMBSTONES_MAX_ATTEMPTS times, else queued again in its place;
    - claimed with others (heads or lane followers): which of them killed the worker is
      unknown; each gets its attempt back and is queued again, to be claimed alone next time.

    Each change is conditional, so two of these running at once are harmless.
    """
    counts = {"uncertain": 0, "requeued": 0, "crashed": 0}
    db = using or router.db_for_write(Job)
    lapsed = Job.objects.using(db).lapsed()
    # Another job is held by the same claim (a batch-mate, or a lane follower).
    # (held() repeats the held-jobs index's condition, so the planner may use it: without, the
    # lookup scanned the table once per lapsed job.)
    shared = Exists(
        Job.objects.filter(queries.held(), queries.held_by(OuterRef("claim_token"))).exclude(
            pk=OuterRef("pk")
        )
    )
    rows = lapsed.select_related("content_type").annotate(shared=shared)
    claims: dict[str, list[Any]] = {}
    for job in rows.order_by("claim_token", "id")[:limit]:
        claims.setdefault(job.claim_token, []).append(job)
    for token, jobs in claims.items():
        # A dead claim is taken back whole, in one transaction: its heads and the followers it
        # reserved return together, never some now and some later.
        with transaction.atomic(using=db):
            for job in jobs:
                _take_back(job, counts)
            if any(job.shared for job in jobs):
                # Its lane followers: never started (or rolled back with it).
                followers = Job.objects.using(db).filter(queries.followers_of(token))
                followers.update(**uncharged(), reason=Reason.LEASE_EXPIRED)
    # Followers whose claim holds nothing running: its worker died before giving them back (or
    # is about to: then its own give-back finds nothing to do). Never started, so uncharged.
    # (Looked for first: an UPDATE would wait for SQLite's write lock even when none is found.)
    orphans = list(Job.objects.using(db).orphaned().values_list("pk", flat=True)[:limit])
    if orphans:
        counts["requeued"] += (
            Job.objects.using(db).orphaned().filter(pk__in=orphans).update(**uncharged())
        )
    return counts


def _take_back(job: Any, counts: dict[str, int]) -> None:
    """One running job of a lapsed claim: uncertain if its call was sent, failed once it was
    claimed alone too often, else queued again in its place (its attempt given back when it was
    claimed with others: which of them killed the worker is unknown)."""
    common: dict[str, Any] = {"claim_token": "", "lease_expires_at": None, "by": worker_id()}
    # The claim that ends here without an outcome, as its row recorded it.
    common["before"] = [event_row(job, Event.CLAIMED, worker=job.owner, at=job.started_at)]
    if job.sending_at is not None:
        count, status, reason = "uncertain", Status.UNCERTAIN, Reason.OUTCOME_UNKNOWN
    elif not job.shared and job.attempts >= tombstone_settings.MAX_ATTEMPTS:
        count, status, reason = "crashed", Status.FAILED, Reason.CRASHED
    else:
        count, status, reason = "requeued", Status.QUEUED, Reason.LEASE_EXPIRED
        if job.shared:
            common["attempts"] = F("attempts") - 1
    still = queries.lease_ran_out() & Q(claim_token=job.claim_token)
    counts[count] += transition(
        job, status, reason, from_status=(Status.RUNNING,), extra_filter=still, **common
    )
