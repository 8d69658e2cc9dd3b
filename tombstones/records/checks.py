"""System checks of the records: each TombstoneModel's ``TombstoneMeta`` (``tombstones.E001`` to
``E005``). The settings and django-q2 checks are :mod:`tombstones.jobs.checks`."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import models

from .mixin import TombstoneModel
from .options import get_options, is_erasable


def _tombstone_models(app_configs: Any = None) -> list[type[TombstoneModel]]:
    # Like Django's own model checks: only the apps asked for (``manage.py check app_label``).
    if app_configs is None:
        candidates = apps.get_models()
    else:
        candidates = [m for config in app_configs for m in config.get_models()]
    return [m for m in candidates if issubclass(m, TombstoneModel)]


def _is_unique(model: type[models.Model], field: models.Field[Any, Any]) -> bool:
    if field.unique:
        return True
    for constraint in model._meta.constraints:
        if (
            isinstance(constraint, models.UniqueConstraint)
            and tuple(constraint.fields) == (field.name,)
            and constraint.condition is None
        ):
            return True
    return False


def check_tombstone_meta(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each TombstoneModel's ``TombstoneMeta``: a unique concrete business key, erasable personal
    fields (E001-E005)."""
    errors: list[checks.CheckMessage] = []
    for model in _tombstone_models(app_configs):
        opts = get_options(model)
        if opts.business_key is not None:
            errors += _business_key_errors(model, opts.business_key, opts.personal_fields)
        for name in opts.personal_fields:
            errors += _personal_field_errors(model, name)
    return errors


def _business_key_errors(
    model: type[models.Model], key: str, personal: Any
) -> list[checks.CheckMessage]:
    label = model._meta.label
    try:
        field = model._meta.get_field(key)
        if not getattr(field, "concrete", False):  # a reverse relation, a generic FK
            raise FieldDoesNotExist(key)
    except FieldDoesNotExist:
        return [
            checks.Error(
                f"TombstoneMeta.business_key names {key!r}, which is not a concrete "
                f"field of {label}.",
                obj=model,
                id="tombstones.E001",
            )
        ]
    errors: list[checks.CheckMessage] = []
    if not _is_unique(model, field):  # type: ignore[arg-type]
        errors.append(
            checks.Error(
                f"The business key {label}.{key} is not unique.",
                hint="Add unique=True: a key must name one row, live or tombstone.",
                obj=model,
                id="tombstones.E002",
            )
        )
    if key in personal:
        errors.append(
            checks.Error(
                f"{label}.{key} is both the business key and a personal field.",
                hint="A tombstone keeps its business key; erase another field.",
                obj=model,
                id="tombstones.E004",
            )
        )
    return errors


def _personal_field_errors(model: type[models.Model], name: str) -> list[checks.CheckMessage]:
    label = model._meta.label
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return [
            checks.Error(
                f"TombstoneMeta.personal_fields names {name!r}, which is not a field of {label}.",
                obj=model,
                id="tombstones.E001",
            )
        ]
    if not isinstance(field, models.Field) or not is_erasable(field) or field.primary_key:
        return [
            checks.Error(
                f"The personal field {label}.{name} cannot be erased.",
                hint="Personal fields must be text fields or nullable.",
                obj=model,
                id="tombstones.E003",
            )
        ]
    if field.unique and not field.null:
        return [
            checks.Error(
                f"The personal field {label}.{name} is unique but not nullable: two "
                "tombstones would both hold ''.",
                hint="Make it null=True so tombstones store NULL.",
                obj=model,
                id="tombstones.E005",
            )
        ]
    return []


def register() -> None:
    checks.register(check_tombstone_meta, checks.Tags.models)
