"""The record mixin. Importable without the app installed (it defines no concrete model)."""

from __future__ import annotations

from typing import Any, ClassVar, cast

from django.db import models
from django.db.models.signals import class_prepared

from . import writes as fencing  # the lifecycle writes: insert, save, tombstone_instance
from .fields import FencedFields
from .options import get_options
from .query import AllObjectsManager, LiveManager, TombstonesManager


class TombstoneModel(FencedFields):
    """Abstract base: generation, version and soft-delete tombstones for a business model.

    Declare the business key and the personal fields in an inner ``TombstoneMeta``::

        class TombstoneMeta:
            business_key = "reference"
            personal_fields = ("name", "email")
    """

    objects: ClassVar[LiveManager] = LiveManager()
    all_objects: ClassVar[AllObjectsManager] = AllObjectsManager()
    tombstones: ClassVar[TombstonesManager] = TombstonesManager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Insert a new record, or run a fenced UPDATE of an existing one (never an INSERT)."""
        force_insert = kwargs.pop("force_insert", False)
        kwargs.pop("force_update", None)
        using = kwargs.pop("using", None)
        update_fields = kwargs.pop("update_fields", None)
        if args or kwargs:
            raise TypeError("TombstoneModel.save() takes keyword arguments only.")
        if self._state.adding or force_insert:
            fencing.insert(self, using=using)
        else:
            fencing.save(self, update_fields=update_fields, using=using)

    save.alters_data = True  # type: ignore[attr-defined]

    def delete(
        self, using: str | None = None, keep_parents: bool = False
    ) -> tuple[int, dict[str, int]]:
        """Make this record a tombstone (fenced on its generation); Django's return shape."""
        count = fencing.tombstone_instance(self, using=using)
        return count, {self._meta.label: count}

    delete.alters_data = True  # type: ignore[attr-defined]

    @property
    def is_tombstone(self) -> bool:
        return self.deleted_at is not None

    def tombstone_identity(self) -> str:
        """``customers.Customer pk=7 generation=2 reference=C-1001``: the record in logs.

        Label, pk, generation, and the business key unless it is a personal field: what a log
        line or the admin's LogEntry (which outlives the tombstone) may say about a record.
        ``__str__`` stays the model's own.
        """
        text = f"{self._meta.label} pk={self.pk} generation={self.generation}"
        options = get_options(self)
        key = options.business_key
        if key is not None and key not in options.personal_fields:
            field = cast("models.Field[Any, Any]", self._meta.get_field(key))
            text += f" {key}={getattr(self, field.attname)}"
        return text


def _default_to_all_objects(sender: type[models.Model], **kwargs: Any) -> None:
    # Related-object access and refresh_from_db() go through the base manager; it must see
    # tombstones, whether or not the subclass wrote its own Meta.
    if (
        issubclass(sender, TombstoneModel)
        and not sender._meta.abstract
        and sender._meta.base_manager_name is None
    ):
        sender._meta.base_manager_name = "all_objects"


class_prepared.connect(_default_to_all_objects, dispatch_uid="tombstones.base_manager")
