"""Querysets and managers of tombstoned records: live (default), all, tombstones only."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, TypeVar

from django.db import models

from ..exceptions import UnfencedWrite
from . import writes
from .fields import FencedFields
from .options import PROTECTED_FIELDS

_M = TypeVar("_M", bound="FencedFields")


class TombstoneQuerySet(models.QuerySet[_M]):
    """A queryset whose writes go through :mod:`.writes`."""

    def delete(self) -> tuple[int, dict[str, int]]:
        """Make tombstones of the matched live rows in one UPDATE; Django's return shape."""
        if self.query.is_sliced:
            raise TypeError("Cannot use 'limit' or 'offset' with delete().")
        count = writes.tombstone(self)
        return count, {self.model._meta.label: count}

    delete.alters_data = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]

    def update(self, **kwargs: Any) -> int:
        """Update live rows only, bumping ``version``; tombstones are never touched."""
        return writes.update_live(self, kwargs)

    update.alters_data = True  # type: ignore[attr-defined]

    def bulk_create(
        self,
        objs: Iterable[_M],
        batch_size: int | None = None,
        ignore_conflicts: bool = False,
        update_conflicts: bool = False,
        update_fields: Collection[str] | None = None,
        unique_fields: Collection[str] | None = None,
    ) -> list[_M]:
        """INSERT new records only: generation 1, version 1, live, and no key a tombstone holds."""
        if update_conflicts:
            raise UnfencedWrite(
                "bulk_create(update_conflicts=True) would overwrite existing rows, tombstones "
                "included, without a fence: use save(), update() or recreate().",
                model=self.model._meta.label,
            )
        records = list(objs)
        # _db, not db: an unpinned queryset must check the write database, not a replica.
        writes.check_new_records(self.model, records, using=getattr(self, "_db", None))
        return super().bulk_create(
            records, batch_size=batch_size, ignore_conflicts=ignore_conflicts
        )

    bulk_create.alters_data = True  # type: ignore[attr-defined]

    def bulk_update(
        self, objs: Iterable[_M], fields: Iterable[str], batch_size: int | None = None
    ) -> int:
        """Refused: it overwrites rows without checking their generation, version or tombstone."""
        raise UnfencedWrite(
            "bulk_update() writes without a version check and would overwrite newer data or a "
            "tombstone: call save() on each instance (a fenced UPDATE), or use the queryset's "
            "update() (live rows only, version + 1).",
            model=self.model._meta.label,
        )

    bulk_update.alters_data = True  # type: ignore[attr-defined]

    # The fence fields are always loaded: deferred, they would be read fresh at save() or
    # delete() time and a stale instance would pass its own fence.
    def defer(self, *fields: Any) -> TombstoneQuerySet[_M]:
        if fields == (None,):
            return super().defer(None)
        return super().defer(*(f for f in fields if f not in PROTECTED_FIELDS))

    def only(self, *fields: Any) -> TombstoneQuerySet[_M]:
        return super().only(*fields, *sorted(PROTECTED_FIELDS - set(fields)))

    def live(self) -> TombstoneQuerySet[_M]:
        return self.filter(deleted_at__isnull=True)

    def dead(self) -> TombstoneQuerySet[_M]:
        return self.filter(deleted_at__isnull=False)

    def recreate(self, **fields: Any) -> _M:
        """Revive the tombstone holding the business key as generation + 1, or create it."""
        # _db, not db: an unpinned queryset must write to the write database, not a replica.
        return writes.recreate(self.model, fields, using=getattr(self, "_db", None))

    def purge(self) -> int:
        """Hard-delete the matched tombstones (live rows are never purged). Use purge_tombstones."""
        return writes.purge(self)


class AllObjectsManager(models.Manager.from_queryset(TombstoneQuerySet)):  # type: ignore[misc]
    """Live records and tombstones."""


class LiveManager(AllObjectsManager):
    """Live records only (the default manager)."""

    def get_queryset(self) -> TombstoneQuerySet[Any]:
        return super().get_queryset().filter(deleted_at__isnull=True)


class TombstonesManager(AllObjectsManager):
    """Tombstones only."""

    def get_queryset(self) -> TombstoneQuerySet[Any]:
        return super().get_queryset().filter(deleted_at__isnull=False)
