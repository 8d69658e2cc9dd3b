"""Job params outlive no record: erased when the record becomes a tombstone, and by purge.

Receivers of the records layer's ``record_tombstoned`` and ``records_purged`` signals (connected
in ``AppConfig.ready()``), so the erasure commits or rolls back with the deletion itself. Each
erased job gets one ``params_erased`` event: ids only. Which jobs is decided here; the
statements are the ledger's (:func:`tombstones.jobs.ledger.erase_params`).
"""

from __future__ import annotations

from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models, transaction
from django.db.models import Q

from .ledger import erase_params
from .models import Job
from .registry import registered

# Object ids per statement: far below every backend's parameter limit.
CHUNK = 500


def erase_on_tombstone(
    sender: type[models.Model], pks: list[Any], using: str, **kwargs: Any
) -> int:
    """Erase the params of the records' jobs, except unfinished jobs of tombstone handlers.

    A handler registered with ``accepts_tombstones=True`` still runs on the tombstone and needs
    its params; the engine erases them when such a job ends.
    """
    keep = [name for name, found in registered().items() if found.accepts_tombstones]
    still_needed = Q(status__in=Job.UNFINISHED, handler__in=keep)
    return _erase(sender, pks, using, exclude=still_needed if keep else None)


def erase_on_purge(sender: type[models.Model], pks: list[Any], using: str, **kwargs: Any) -> int:
    """Erase the params of every job of the purged records: no job can use them any more."""
    return _erase(sender, pks, using, exclude=None)


def _erase(model: type[models.Model], pks: list[Any], using: str, *, exclude: Q | None) -> int:
    content_type = ContentType.objects.db_manager(using).get_for_model(model)
    ids = [str(pk) for pk in pks]
    # The senders call this inside their transaction; atomic() also makes a direct call safe.
    with transaction.atomic(using=using):
        return sum(
            erase_params(content_type, ids[start : start + CHUNK], using, exclude=exclude)
            for start in range(0, len(ids), CHUNK)
        )
