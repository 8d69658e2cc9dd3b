"""What a handler receives: the checked record, the params, and the fenced write helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import models

from ..exceptions import NoRecord
from ..records import fencing
from ..records.fencing import Fence

if TYPE_CHECKING:
    from .models import Job


class HandlerContext:
    """Passed to every handler.

    ``record`` is the handler's own copy of the record as checked, live at the job's generation,
    or as the jobs before it in its group left it (their updates carried forward); None for a
    plain job (a task for no record), whose ``update`` and ``write`` raise NoRecord. The
    check holds no lock: ``update`` and ``write`` fence every statement on that record being
    live at that (generation, version), and hold it from the write to the commit (``update``'s
    own row lock; ``write`` a share lock on PostgreSQL; SQLite's write lock). A delete or an edit
    that lands before the write makes it match 0 rows; one that comes after waits for the
    commit. When a fence fails the worker rolls back whatever this job wrote (its savepoint) and
    classifies the conflict itself, so a handler never needs to catch anything.
    """

    def __init__(self, job: Job, record: Any, *, heartbeat: Callable[[], bool]) -> None:
        # Handed in by the engine that holds the job's lease (the context imports no engine).
        self._heartbeat = heartbeat
        self.job = job
        self.record = record
        self.params: dict[str, Any] = dict(job.params or {})
        self.rereads: int = job.rereads
        self.fence_lost: fencing.Observation | None = None
        self.writes = 0
        # What update() set on the record, in order: the next job of the record in the same
        # group starts from it (its state carried forward, without reading it again).
        self.applied: list[tuple[str, Any]] = []
        # A write of the record's own table through write(): its state is then read again.
        self.moved_record = False

    @property
    def idempotency_key(self) -> str:
        """Hand this to the external system: stable for the job across any manual resend."""
        return self.job.idempotency_key

    @property
    def _fence(self) -> Fence:
        if self.record is None:
            raise NoRecord(f"Job {self.job.pk} is a plain job: it has no record to write.")
        return Fence.of(self.record)

    def update(self, **fields: Any) -> int:
        """Fenced update of the record itself; returns 1, or 0 when the fence failed."""
        if self.fence_lost is not None:
            return 0
        fence = self._fence
        db = self.record._state.db
        matched = fencing.update_record(fence, fields, using=db)
        if matched:
            values, computed = fencing.as_stored(fence.model, fields)
            if computed:
                # F() and other expressions, and values the database rounds: what it stored (no
                # other writer can move the row now: this UPDATE holds it until the commit).
                values.update(fencing.read_fields(fence.model, fence.pk, computed, using=db))
            for name, value in values.items():
                setattr(self.record, name, value)
            self.applied += values.items()
            self.record.version += 1
            self.writes += matched
        else:
            self._lost()
        return matched

    def write(self, queryset: models.QuerySet[Any], **fields: Any) -> int:
        """Fenced update of rows of another table, tied to the record in the same statement."""
        if self.fence_lost is not None:
            return 0
        fence = self._fence
        dead = self.record.deleted_at is not None
        held = fencing.share_lock(fence, live=not dead, using=queryset.db)
        if held is False:  # the source moved before the write: nothing is written
            self.fence_lost = fencing.observe(fence, using=queryset.db)
            if self.fence_lost.state == fencing.State.LIVE and not dead:
                self.fence_lost = fence.stale()
            return 0
        matched = fencing.write_related(queryset, fence, fields, live=not dead)
        self.moved_record = self.moved_record or (matched > 0 and queryset.model is fence.model)
        if matched == 0 and held is None:
            # 0 rows is either an empty target or a lost fence: one read tells them apart.
            seen = fencing.observe(fence, using=queryset.db)
            expected = fencing.State.TOMBSTONE if dead else fencing.State.LIVE
            if seen.state != expected or (dead and seen.version != fence.version):
                self.fence_lost = seen
        self.writes += matched
        return matched

    def heartbeat(self) -> bool:
        """Renew the lease now; False if another worker took the job over.

        The worker renews its leases by itself while it holds them (:mod:`.engine.keeper`):
        call this to learn, in a long handler, whether the job is still yours.
        """
        return self._heartbeat()

    def _lost(self) -> None:
        fence = self._fence
        self.fence_lost = fencing.observe(fence, using=self.record._state.db)
        if self.fence_lost.state == fencing.State.LIVE:
            # Cannot happen for a monotonic version; treat as stale rather than success.
            self.fence_lost = fence.stale()
