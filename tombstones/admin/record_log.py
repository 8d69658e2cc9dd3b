"""What a ``TombstoneAdmin`` writes to Django's admin log: records by identity, never ``str()``.

``LogEntry.object_repr`` and ``change_message`` are shown to anyone who may read the log and
outlive the tombstone, so they carry the record's ``tombstone_identity()``, never the model's
``__str__`` (which may read personal fields).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.http import HttpRequest

from ..records.mixin import TombstoneModel

__all__ = ["RecordLogMixin", "log_name"]


def log_name(obj: models.Model) -> str:
    """How the admin log names a record: its identity (label and pk for other models)."""
    if isinstance(obj, TombstoneModel):
        return obj.tombstone_identity()
    return f"{obj._meta.label} pk={obj.pk}"  # an inline's model, without the mixin


class RecordLogMixin(admin.ModelAdmin):
    """The three hooks through which Django writes log entries, and the change message.

    Django's own hooks name objects by ``str(obj)``, with no other seam.
    """

    def _log(
        self, request: HttpRequest, objs: Iterable[models.Model], flag: int, message: Any = ""
    ) -> list[LogEntry]:
        if isinstance(message, list):
            message = json.dumps(message)
        content_type = ContentType.objects.get_for_model(self.model, for_concrete_model=False)
        entries = [
            LogEntry(
                user_id=cast(int, request.user.pk),
                content_type_id=content_type.pk,
                object_id=str(obj.pk),
                object_repr=log_name(obj)[:200],
                action_flag=flag,
                change_message=message,
            )
            for obj in objs
        ]
        return LogEntry.objects.bulk_create(entries)

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> LogEntry:
        return self._log(request, [obj], ADDITION, message)[0]

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> LogEntry:
        return self._log(request, [obj], CHANGE, message)[0]

    def log_deletions(self, request: HttpRequest, queryset: Any) -> list[LogEntry]:
        return self._log(request, queryset, DELETION)

    def construct_change_message(
        self, request: HttpRequest, form: Any, formsets: Any, add: bool = False
    ) -> Any:
        message: list[dict[str, Any]] = super().construct_change_message(
            request, form, formsets, add
        )
        # Django names inline objects by str(obj) in the stored message; name them by identity,
        # in Django's order.
        related = iter(
            [
                obj
                for formset in formsets or ()
                for obj in (
                    *formset.new_objects,
                    *(changed for changed, _fields in formset.changed_objects),
                    *formset.deleted_objects,
                )
            ]
        )
        for entry in message:
            for detail in entry.values():
                if isinstance(detail, dict) and "object" in detail:
                    detail["object"] = log_name(next(related))
        return message
