"""What a handler receives: the checked record, the params, and the fenced write helpers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models

from . import fencing

if TYPE_CHECKING:
    from .ledger import Claim
    from .models import Job


class HandlerContext:
    """Passed to every handler.

    ``record`` was read fresh, inside the transaction the handler runs in, and found live at the
    job's generation; it stays locked until that transaction commits (PostgreSQL: a row lock;
    SQLite: the write lock), so a concurrent delete or re-create waits for the job. ``write`` and
    ``update`` also fence every statement on that record being live at that (generation,
    version); when a fence fails the worker rolls back whatever the handler wrote and classifies
    the conflict itself, so a handler never needs to catch anything.
    """

    def __init__(self, claim: Claim, job: Job, record: Any) -> None:
        self._claim = claim
        self.job = job
        self.record = record
        self.params: dict[str, Any] = dict(job.params or {})
        self.rereads: int = job.rereads
        self.fence_lost: fencing.Observation | None = None
        self.writes = 0

    @property
    def idempotency_key(self) -> str:
        """Hand this to the external system: stable for the job across any manual resend."""
        return self.job.idempotency_key

    @property
    def _fence(self) -> tuple[type[models.Model], Any, int, int]:
        record = self.record
        return type(record), record.pk, record.generation, record.version

    def update(self, **fields: Any) -> int:
        """Fenced update of the record itself; returns 1, or 0 when the fence failed."""
        if self.fence_lost is not None:
            return 0
        model, pk, generation, version = self._fence
        matched = fencing.update_record(
            model, pk, generation, version, fields, using=self.record._state.db
        )
        if matched:
            for name, value in fields.items():
                if not hasattr(value, "resolve_expression"):
                    setattr(self.record, name, value)
            self.record.version += 1
            self.writes += matched
        else:
            self._lost()
        return matched

    def write(self, queryset: models.QuerySet[Any], **fields: Any) -> int:
        """Fenced update of rows of another table, tied to the record in the same statement."""
        if self.fence_lost is not None:
            return 0
        model, pk, generation, version = self._fence
        dead = self.record.deleted_at is not None
        matched = fencing.write_related(
            queryset, model, pk, generation, version, fields, live=not dead
        )
        if matched == 0:
            # 0 rows is either an empty target or a lost fence: one read tells them apart.
            seen = fencing.observe(model, pk, generation, version, using=queryset.db)
            expected = fencing.State.TOMBSTONE if dead else fencing.State.LIVE
            if seen.state != expected or (dead and seen.version != version):
                self.fence_lost = seen
        self.writes += matched
        return matched

    def heartbeat(self) -> bool:
        """Renew the lease now; False if another worker took the job over.

        The worker renews its leases by itself while it holds them (:mod:`tombstones.keeper`):
        call this to learn, in a long handler, whether the job is still yours.
        """
        from .keeper import heartbeat

        return heartbeat(self._claim)

    def _lost(self) -> None:
        model, pk, generation, version = self._fence
        self.fence_lost = fencing.observe(
            model, pk, generation, version, using=self.record._state.db
        )
        if self.fence_lost.state == fencing.State.LIVE:
            # Cannot happen for a monotonic version; treat as stale rather than success.
            self.fence_lost = fencing.Observation(fencing.State.STALE, generation, version)
