"""Reading a model's ``TombstoneMeta``: its business key and its personal fields."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models

from ..exceptions import ProtectedField

# The mixin's own fields: only records/writes.py and records/fencing.py move them.
PROTECTED_FIELDS = frozenset({"generation", "version", "deleted_at"})


def identity_fields(model: type[models.Model], names: Iterable[str]) -> list[str]:
    """The names among ``names`` that would renumber a row: ``pk``, a primary key (a multi-table
    child's own or a parent's) or a parent link, by name or attname. A record's jobs and lane
    address it by pk: a write never moves it."""
    found = []
    for name in names:
        if name == "pk":
            found.append(name)
            continue
        try:
            field: Any = model._meta.get_field(name)
        except FieldDoesNotExist:
            continue  # the write raises Django's own error for it
        link = getattr(field, "remote_field", None)
        if getattr(field, "primary_key", False) or getattr(link, "parent_link", False):
            found.append(name)
    return found


def refuse_identity(model: type[models.Model], names: Iterable[str], pk: Any = None) -> None:
    """Raise ProtectedField when ``names`` hold the primary key (see :func:`identity_fields`)."""
    found = identity_fields(model, names)
    if found:
        label = model._meta.label
        which = "" if pk is None else f" ({label} pk={pk})"
        raise ProtectedField(
            f"{label}.{found[0]} names the record's primary key, its identity: a write never "
            f"changes it, or the record's jobs and lane would point at nothing{which}.",
            model=label,
            pk=pk,
        )


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
