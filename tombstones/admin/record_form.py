"""The change form of a ``TombstoneAdmin``: fenced on the (generation, version) it was opened at.

A record changed since (by staff or a job) is refused with a form error, and nothing is
overwritten; a unique value held by a tombstone is a form error, not an IntegrityError.
"""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import EMPTY_VALUES
from django.db import connections, router
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..records.mixin import TombstoneModel
from ..records.options import get_options

__all__ = ["FenceConflict", "TombstoneAdminForm"]

# Hidden form fields: the (generation, version) the change form was opened at.
FENCE_FIELDS = ("opened_generation", "opened_version")

CHANGED_MESSAGE = gettext_lazy(
    "This record was changed since you opened it (by staff or a background job), so nothing "
    "was saved. Reload the page to see the current values, then make your change again."
)
DELETED_MESSAGE = gettext_lazy(
    "This record was deleted (or deleted and re-created) since you opened it, so nothing was saved."
)
INVALID_FENCE_MESSAGE = gettext_lazy(
    "This form's record version is missing or invalid, so nothing was saved. Reload the page "
    "and make your change again."
)


def _as_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 1 else None


class FenceConflict(Exception):
    """A fenced write matched 0 rows inside an admin view; the view's transaction rolls back."""


class TombstoneAdminForm(forms.ModelForm):
    """Carries the (generation, version) it was opened at and refuses a record changed since.

    Custom forms of a ``TombstoneAdmin`` must subclass this one.
    """

    # CharFields parsed in clean(): a tampered value is one clear non-field error.
    opened_generation = forms.CharField(widget=forms.HiddenInput, required=False)
    opened_version = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance._state.adding:
            for name in FENCE_FIELDS:
                self.fields.pop(name, None)
        else:
            instance = cast(TombstoneModel, self.instance)
            self.initial["opened_generation"] = instance.generation
            self.initial["opened_version"] = instance.version

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.instance._state.adding and FENCE_FIELDS[0] in self.fields:
            self._check_fence(cleaned)
        self._check_unique_against_tombstones(cleaned)
        return cleaned

    def _check_fence(self, cleaned: dict[str, Any]) -> None:
        generation = _as_int(cleaned.get("opened_generation"))
        version = _as_int(cleaned.get("opened_version"))
        if generation is None or version is None:
            raise ValidationError(INVALID_FENCE_MESSAGE, code="fence_invalid")
        instance = cast(TombstoneModel, self.instance)
        model = cast("type[TombstoneModel]", type(instance))
        db = router.db_for_write(model, instance=instance)
        rows = model.all_objects.using(db).filter(pk=instance.pk)
        if connections[db].in_atomic_block:
            # Hold the row until the admin's transaction commits the save (PostgreSQL; SQLite's
            # IMMEDIATE transaction already holds the write lock).
            rows = rows.select_for_update()
        row = rows.values_list("generation", "version", "deleted_at").first()
        if row is None or row[2] is not None or row[0] != generation:
            raise ValidationError(DELETED_MESSAGE, code="record_deleted")
        # The instance was read unlocked by get_object(): it must be the row the fence matches,
        # since save() writes every field of it, not only the form's.
        if row[1] != version or instance.version != version or instance.generation != generation:
            raise ValidationError(CHANGED_MESSAGE, code="stale_version")
        # The fenced UPDATE in save() matches the version the user saw.
        instance.generation, instance.version = generation, version

    def _check_unique_against_tombstones(self, cleaned: dict[str, Any]) -> None:
        # Django's unique check reads the default (live) manager, but the database's unique
        # index also covers tombstones: report the clash instead of an IntegrityError.
        model = cast("type[TombstoneModel]", type(self.instance))
        key = get_options(model).business_key
        adding = self.instance._state.adding
        for field in model._meta.concrete_fields:
            name = field.name
            if not field.unique or field.primary_key or name not in self.fields:
                continue
            value = cleaned.get(name)
            if value in EMPTY_VALUES or name in self.errors:
                continue
            if adding and name == key:
                continue  # a tombstone's key is re-used by re-creating it (see save_model)
            held = model.tombstones.filter(**{name: value})
            if adding and key is not None and cleaned.get(key) not in EMPTY_VALUES:
                held = held.exclude(**{key: cleaned[key]})  # the tombstone being re-created
            elif not adding:
                held = held.exclude(pk=self.instance.pk)
            if held.exists():
                self.add_error(
                    name,
                    ValidationError(
                        _("This value belongs to a deleted record (a tombstone)."),
                        code="unique_tombstone",
                    ),
                )
