"""Reading a model's ``TombstoneMeta``: its business key and its personal fields."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.db import models

# The mixin's own fields: only records/writes.py and records/fencing.py move them.
PROTECTED_FIELDS = frozenset({"generation", "version", "deleted_at"})


@dataclass(frozen=True)
class TombstoneOptions:
    business_key: str | None
    personal_fields: tuple[str, ...]


def get_options(model: type[models.Model] | models.Model) -> TombstoneOptions:
    """The parsed ``TombstoneMeta`` of a model class (cached on the class itself)."""
    cls: Any = model if isinstance(model, type) else type(model)
    cached = cls.__dict__.get("_tombstone_options")
    if cached is not None:
        return cached
    meta = getattr(cls, "TombstoneMeta", None)
    business_key = getattr(meta, "business_key", None)
    personal = getattr(meta, "personal_fields", ())
    if isinstance(personal, str):
        personal = (personal,)
    options = TombstoneOptions(business_key=business_key, personal_fields=tuple(personal))
    cls._tombstone_options = options
    return options


@functools.cache
def generated_fields(model: type[models.Model]) -> tuple[str, ...]:
    """The names of the model's ``GeneratedField`` columns: only the database knows them.

    Cached per model class: every ``ctx.update`` asks."""
    return tuple(f.name for f in model._meta.concrete_fields if f.generated)


def erased_value(field: models.Field[Any, Any]) -> Any:
    """What a personal field holds in a tombstone: None when nullable, "" for text."""
    if field.null:
        return None
    if isinstance(field, models.CharField | models.TextField):
        return ""
    raise ValueError(f"{field.model._meta.label}.{field.name} cannot be erased")


def is_erasable(field: models.Field[Any, Any]) -> bool:
    return field.null or isinstance(field, models.CharField | models.TextField)
