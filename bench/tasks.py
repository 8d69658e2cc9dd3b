"""The baseline: the plain django-q2 task a user would write today (no fence, no ledger)."""

from __future__ import annotations

from django.db import models
from django.db.models import F
from django.utils import timezone

from project.customers.models import Customer


def plain_touch(pk: int) -> int:
    """Unguarded write of the same column the fenced handler writes."""
    return models.QuerySet(Customer).filter(pk=pk).update(synced_at=timezone.now())


def fast_touch(pk: int) -> None:
    """baseline-fast: the same write, plus a count the harness reads completion from (its
    result is not saved). ``version + 1`` is what the fenced handler's write adds too."""
    models.QuerySet(Customer).filter(pk=pk).update(
        synced_at=timezone.now(), version=F("version") + 1
    )
