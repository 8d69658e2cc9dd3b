"""External calls: 'sending' committed before the call, 'sent' after it, or cleared.

Apart from the outcomes because these are the only writes made during a job's turn, each in its
own short transaction, so that a crash mid-call leaves the job marked as possibly sent
(:func:`.outcomes.release` and the take-back then make it ``uncertain``).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction
from django.db.models import Exists, Q
from django.db.models.functions import Now

from ..models import Job, JobEvent
from ..states import Event
from .claims import Claim, mine
from .outcomes import event_row


def mark_sending(
    claim: Claim, job: Job, source_live: Q | Exists, events: Sequence[JobEvent] = ()
) -> bool:
    """Commit 'sending' for an external call, only while the source record is still live.

    ``events``: the attempt's events so far (claimed, checked), written before 'sending'.
    """
    with transaction.atomic(using=claim.using):
        if not mine(claim, [job.pk]).filter(source_live).update(sending_at=Now()):
            return False
        rows = [*events, event_row(job, Event.SENDING, worker=claim.worker, at=claim.db_now())]
        JobEvent.objects.using(claim.using).bulk_create(rows)
    return True


def mark_sent(claim: Claim, job: Job) -> bool:
    with transaction.atomic(using=claim.using):
        if not mine(claim, [job.pk]).update(sent_at=Now()):
            return False
        sent = event_row(job, Event.SENT, worker=claim.worker, at=claim.db_now())
        sent.save(using=claim.using)
    return True


def clear_sending(claim: Claim, job: Job) -> None:
    """The handler stated nothing was delivered: the call may be retried."""
    mine(claim, [job.pk]).update(sending_at=None)
