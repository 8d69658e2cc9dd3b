"""Sample values for the race fixture's default record: every required field, unique where it
matters."""

from __future__ import annotations

import uuid
from datetime import date
from decimal import Decimal
from typing import Any

from django.db import models
from django.utils import timezone

from ...records.options import PROTECTED_FIELDS
from .cases import FixtureError


def sample_values(model: type[models.Model]) -> dict[str, Any]:
    """Values for a new record of ``model``: every required field, unique where it matters."""
    values: dict[str, Any] = {}
    token = uuid.uuid4().hex[:10]
    for f in model._meta.concrete_fields:
        if f.primary_key or f.name in PROTECTED_FIELDS or f.has_default() or f.null:
            continue
        if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            continue
        if isinstance(f, models.ForeignKey):
            raise FixtureError(
                f"{model._meta.label}.{f.name} is a required foreign key: pass make_record=."
            )
        values[f.name] = _sample(f, token)
    return values


def _sample(f: models.Field[Any, Any], token: str) -> Any:
    if isinstance(f, models.EmailField):
        return f"rf-{token}@example.invalid"
    if isinstance(f, models.CharField | models.TextField | models.SlugField):
        return f"rf-{token}"[: f.max_length or 64]
    if isinstance(f, models.BooleanField):
        return False
    if isinstance(f, models.DecimalField):
        return Decimal(0)
    if isinstance(f, models.IntegerField | models.FloatField):
        return 0
    if isinstance(f, models.DateTimeField):
        return timezone.now()
    if isinstance(f, models.DateField):
        return date.today()
    if isinstance(f, models.UUIDField):
        return uuid.uuid4()
    if isinstance(f, models.JSONField):
        return {}
    raise FixtureError(f"No sample value for {f.model._meta.label}.{f.name}: pass make_record=.")
