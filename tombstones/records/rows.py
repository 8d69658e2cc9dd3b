"""Row-level helpers both write modules share: a plain queryset, the raw UPDATE, the write database.

Below :mod:`.fencing` and :mod:`.writes`, so that neither imports the other's privates.
"""

from __future__ import annotations

from typing import Any

from django.db import models, router

UpdateValues = list[tuple[Any, Any, Any]]  # (field, model, value) as QuerySet._update takes


def plain(model: type[models.Model], using: str | None) -> models.QuerySet[Any]:
    """A plain QuerySet: the record querysets' own update()/delete() are overridden."""
    return models.QuerySet(model=model, using=using)


def raw_update(queryset: models.QuerySet[Any], values: UpdateValues) -> int:
    """QuerySet._update takes field objects (as Model.save does) and skips our update() override."""
    return int(queryset._update(values))  # type: ignore[attr-defined]


def field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    return model._meta.get_field(name)  # type: ignore[return-value]


def write_db(model: type[models.Model], using: str | None, instance: Any = None) -> str:
    return using or router.db_for_write(model, instance=instance)
