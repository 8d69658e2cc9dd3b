"""The audit lists' choice filters: each offers only the values that occur in its list.

Django's own filter for a field with choices offers every choice, whatever the list holds: the
rejection log offered all 17 reasons, most of which never reject. Here each choice is probed with
one indexed ``EXISTS`` (all of them in a single query, stopping at the first match), not read by
a ``DISTINCT`` over the whole table.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import router
from django.db.models import Exists, Model, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy

__all__ = [
    "EventFilter",
    "HandlerFilter",
    "OccurringChoicesFilter",
    "ReasonFilter",
    "RejectionReasonFilter",
    "StatusFilter",
    "occurring",
]


def occurring(queryset: QuerySet[Any], field: str, values: list[Any]) -> set[Any]:
    """Which of ``values`` occur in ``field`` of ``queryset``: one query, one probe per value."""
    if not values:
        return set()
    probes = {f"has_{i}": Exists(queryset.filter(**{field: v})) for i, v in enumerate(values)}
    # Any one row of the table carries the probes; an empty table holds no value at all.
    row = queryset.model._base_manager.order_by().annotate(**probes).values_list(*probes).first()
    if row is None:
        return set()
    return {value for value, found in zip(values, row, strict=True) if found}


class OccurringChoicesFilter(admin.SimpleListFilter):
    """A field's choices, in their declared order, limited to those the admin's list holds.

    Its query-string parameter is Django's own (``reason__exact``), so links keep working.
    """

    field_name: str = ""
    # Values the list never holds, not worth a probe (a rejection always has its reason).
    never: tuple[Any, ...] = ()

    def __init__(
        self,
        request: HttpRequest,
        params: dict[str, Any],
        model: type[Model],
        model_admin: admin.ModelAdmin[Any],
    ) -> None:
        field = model._meta.get_field(self.field_name)
        self.title = getattr(field, "verbose_name", self.field_name)
        self.choices_of_field = list(getattr(field, "flatchoices", ()))
        super().__init__(request, params, model, model_admin)

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        values = [value for value, _label in self.choices_of_field if value not in self.never]
        found = occurring(model_admin.get_queryset(request), self.field_name, values)
        return [(value, label) for value, label in self.choices_of_field if value in found]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(**{self.field_name: value})


class ReasonFilter(OccurringChoicesFilter):
    field_name = "reason"
    parameter_name = "reason__exact"


class RejectionReasonFilter(ReasonFilter):
    never = ("",)


class StatusFilter(OccurringChoicesFilter):
    field_name = "status"
    parameter_name = "status__exact"


class EventFilter(OccurringChoicesFilter):
    field_name = "event"
    parameter_name = "event__exact"


class HandlerFilter(admin.SimpleListFilter):
    """The handler names the job table holds, read by a skip scan of its handler index (one
    probe per name), not a ``DISTINCT`` over every job."""

    title = gettext_lazy("handler")
    parameter_name = "handler"  # as Django's own filter of the field named it

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        from .counting import distinct_values

        model = model_admin.model
        names = distinct_values(model, "handler", using=router.db_for_read(model))
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return queryset if value is None else queryset.filter(handler=value)
