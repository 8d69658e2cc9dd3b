"""TombstoneAdmin: a ModelAdmin base for business models on the ``TombstoneModel`` mixin.

- The changelist shows live records; a filter shows tombstones, or both. A tombstone is shown as
  its identity only and cannot be edited.
- The change form is fenced on the (generation, version) it was opened at (:mod:`.record_form`).
- Adding a business key held by a tombstone re-creates that record as the next generation.
- Delete makes tombstones, after a confirmation that names the personal fields to be erased
  (:mod:`.record_delete`).
- Pages and messages name a live record by its ``str()``, as Django does, and a tombstone by its
  identity; the admin log names every record by identity (:mod:`.record_log`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IS_POPUP_VAR
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..exceptions import AlreadyLive, GenerationChanged, RecordDeleted, RecordMissing, StaleVersion
from ..records.mixin import TombstoneModel
from ..records.options import PROTECTED_FIELDS, get_options
from .display import time_column
from .record_delete import RecordDeleteMixin
from .record_form import (
    CHANGED_MESSAGE,
    DELETED_MESSAGE,
    FENCE_FIELDS,
    FenceConflict,
    TombstoneAdminForm,
)
from .record_log import RecordLogMixin

__all__ = ["TombstoneAdmin", "TombstoneAdminForm", "TombstoneStateFilter", "record_name"]

# The mixin's fields, read-only on the change form (deleted_at as its time column).
MIXIN_FIELDS = ("generation", "version", "deleted")
# Date-time fields of the mixin shown through the admin's one time format (Django's own shows
# minutes): the column or read-only field that replaces each.
TIME_COLUMNS = {"deleted_at": "deleted"}
TEMPLATES = "tombstones/record_admin"
TIMELINE_URL = "admin:tombstones_job_timeline"


def record_name(obj: TombstoneModel) -> str:
    """How staff pages name a record: by ``str()`` as Django does, a tombstone by identity.

    A tombstone's ``str()`` may read personal fields, which are now erased.
    """
    return obj.tombstone_identity() if obj.is_tombstone else str(obj)


def _timed(names: Any) -> list[Any]:
    """``names`` with each time field of the mixin replaced by its time column (a subclass's
    ``list_display``, ``fields``, ``readonly_fields`` or fieldsets may name ``deleted_at``)."""
    return [
        TIME_COLUMNS.get(name, name) if isinstance(name, str) else _timed_row(name)
        for name in names
    ]


def _timed_row(row: Any) -> Any:
    # A tuple of fields on one line of a fieldset; anything else (a callable) as it is.
    return tuple(_timed(row)) if isinstance(row, tuple | list) else row


def _is_tombstone(obj: Any) -> bool:
    return obj is not None and getattr(obj, "deleted_at", None) is not None


class TombstoneStateFilter(admin.SimpleListFilter):
    """Live records (the default), tombstones only, or both."""

    title = gettext_lazy("records")
    parameter_name = "records"
    TOMBSTONES = "tombstones"
    ALL = "all"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        return [(self.TOMBSTONES, _("Tombstones")), (self.ALL, _("All (live and tombstones)"))]

    def choices(self, changelist: Any) -> Iterator[Any]:
        # "Live" replaces Django's "All": no parameter means live records only.
        yield {
            "selected": self.value() not in (self.TOMBSTONES, self.ALL),
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": _("Live"),
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> Any:
        value = self.value()
        if value == self.ALL:
            return queryset
        if value == self.TOMBSTONES:
            return queryset.filter(deleted_at__isnull=False)
        return queryset.filter(deleted_at__isnull=True)


class TombstoneChangeList(ChangeList):
    """Django's changelist, its "(5 total)" counting what the link under it opens.

    Django counts every row of ``get_queryset()`` for the total, and links it to the list
    without parameters; here that list is the live records (the state filter's default), so
    the total counts the live records too. Django's count took the tombstones in, and an
    unfiltered list of 4 live records read "4 results (5 total)" and linked to the same 4.
    """

    def get_results(self, request: HttpRequest) -> None:
        everything = self.root_queryset
        self.root_queryset = everything.filter(deleted_at__isnull=True)
        try:
            super().get_results(request)
        finally:
            self.root_queryset = everything


class TombstoneAdmin(RecordLogMixin, RecordDeleteMixin, admin.ModelAdmin):
    """ModelAdmin for a model on the ``TombstoneModel`` mixin: see the module docstring."""

    form = TombstoneAdminForm
    actions = ["delete_selected"]
    list_display: Any = ("record_identity", "generation", "version", "deleted")
    change_form_template = f"{TEMPLATES}/change_form.html"
    object_history_template = f"{TEMPLATES}/object_history.html"

    # --- identity ---------------------------------------------------------------------------

    @admin.display(description=gettext_lazy("record"))
    def record_identity(self, obj: Any) -> str:
        return cast(str, obj.tombstone_identity())

    deleted = time_column("deleted_at", gettext_lazy("deleted at"))

    @admin.display(description=gettext_lazy("ID"))
    def record_pk(self, obj: Any) -> Any:
        return obj.pk

    def identity_fields(self) -> tuple[str, ...]:
        """What a tombstone shows: pk, business key, generation, version, deleted_at."""
        key = get_options(self.model).business_key
        return ("record_pk", *((key,) if key else ()), "generation", "version", "deleted")

    def action_checkbox(self, obj: Any) -> SafeString:
        # Django labels the checkbox with str(obj): a tombstone's may read erased fields.
        if not _is_tombstone(obj):
            return cast(SafeString, super().action_checkbox(obj))
        attrs = {
            "class": "action-select",
            "aria-label": format_html(
                _("Select this object for an action - {}"), obj.tombstone_identity()
            ),
        }
        checkbox = forms.CheckboxInput(attrs, lambda value: False)
        return cast(SafeString, checkbox.render(helpers.ACTION_CHECKBOX_NAME, str(obj.pk)))

    def timeline_url(self, obj: models.Model) -> str | None:
        """The job timeline of the record, or None while that admin view is not installed."""
        content_type = ContentType.objects.get_for_model(self.model)
        try:
            return reverse(
                TIMELINE_URL,
                args=(content_type.pk, str(obj.pk)),
                current_app=self.admin_site.name,
            )
        except NoReverseMatch:
            return None

    # --- changelist -------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[Any]:
        # Through all records, so that tombstones are reachable; the list filter picks live.
        qs = cast("type[TombstoneModel]", self.model).all_objects.get_queryset()
        ordering = self.get_ordering(request)
        if ordering:
            qs = qs.order_by(*ordering)
        return qs

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TombstoneChangeList

    def get_list_filter(self, request: HttpRequest) -> Any:
        filters = list(super().get_list_filter(request))
        if TombstoneStateFilter not in filters:
            filters.insert(0, TombstoneStateFilter)
        return filters

    def _shows_tombstones(self, request: HttpRequest) -> bool:
        value = request.GET.get(TombstoneStateFilter.parameter_name)
        return value in (TombstoneStateFilter.TOMBSTONES, TombstoneStateFilter.ALL)

    def get_list_display(self, request: HttpRequest) -> Any:
        # Tombstones are listed by identity only, whatever columns the live list has.
        if self._shows_tombstones(request):
            return ("record_identity", "generation", "version", "deleted")
        return _timed(super().get_list_display(request))

    def get_list_display_links(self, request: HttpRequest, list_display: Any) -> Any:
        if self._shows_tombstones(request):
            return ("record_identity",)
        return super().get_list_display_links(request, list_display)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> Any:
        # Django 6.1 added action_location (and warns on overrides without it); 5.2 has none.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location)  # type: ignore[call-arg]
        # A subclass's own ``actions`` list brings back the site-wide delete_selected: swap in
        # this class's (same permission, already checked by super()).
        if "delete_selected" in actions:
            found = self.get_action("delete_selected")
            if found is not None:
                actions["delete_selected"] = found
        return actions

    # --- permissions ------------------------------------------------------------------------

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if _is_tombstone(obj):
            return False  # a tombstone is changed only by re-creating its business key
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if _is_tombstone(obj):
            return False
        return super().has_delete_permission(request, obj)

    # --- change form ------------------------------------------------------------------------

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if _is_tombstone(obj):
            return list(self.identity_fields())
        # The fence fields are rendered by the template, whatever fields/fieldsets say.
        fields = [f for f in _timed(super().get_fields(request, obj)) if f not in FENCE_FIELDS]
        if obj is not None:  # shown read-only, even when ``fields`` leaves them out
            fields += [f for f in MIXIN_FIELDS if f not in fields]
        return fields

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if _is_tombstone(obj):
            return [(None, {"fields": list(self.identity_fields())})]
        return [
            (name, {**options, "fields": _timed(options.get("fields", ()))})
            for name, options in super().get_fieldsets(request, obj)
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if _is_tombstone(obj):
            return list(self.identity_fields())
        readonly = _timed(super().get_readonly_fields(request, obj))
        if obj is not None:
            readonly += [f for f in MIXIN_FIELDS if f not in readonly]
        return readonly

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> Any:
        if _is_tombstone(obj):
            return []  # related rows are not identity
        return super().get_inline_instances(request, obj)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if not issubclass(self.form, TombstoneAdminForm):
            raise ImproperlyConfigured(
                f"{type(self).__name__}.form must subclass tombstones.admin.TombstoneAdminForm."
            )
        return super().get_form(request, obj, change, **kwargs)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        if obj is not None:
            # Django's subtitle is str(obj); the template's breadcrumbs read record_name.
            context["subtitle"] = context["record_name"] = record_name(obj)
            context["is_tombstone"] = _is_tombstone(obj)
            context["timeline_url"] = self.timeline_url(obj)
            if self.has_change_permission(request, obj):
                form = context["adminform"].form
                context["fence_fields"] = [form[n] for n in FENCE_FIELDS if n in form.fields]
        return super().render_change_form(request, context, add, change, form_url, obj)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        for _attempt in range(2):
            if request.method == "POST" and object_id is not None:
                refused = self._refuse_tombstone_post(request, object_id)
                if refused is not None:
                    return refused
            try:
                return super().changeform_view(request, object_id, form_url, extra_context)
            except FenceConflict:
                # The view's transaction rolled back: nothing was written. The next pass reads
                # the record again and the form's clean() reports what changed.
                continue
        self.message_user(request, CHANGED_MESSAGE, messages.ERROR)
        return HttpResponseRedirect(request.path)

    def _refuse_tombstone_post(self, request: HttpRequest, object_id: str) -> HttpResponse | None:
        if "_saveasnew" in request.POST or not self.has_change_permission(request):
            return None  # Django's own checks answer these
        obj = self.get_object(request, unquote(object_id))
        if not _is_tombstone(obj):
            return None
        self.message_user(request, DELETED_MESSAGE, messages.ERROR)
        return HttpResponseRedirect(request.path)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: Any) -> None:
        if change:
            try:
                obj.save()
            except (StaleVersion, RecordDeleted, GenerationChanged, RecordMissing) as exc:
                raise FenceConflict from exc
            return
        model = cast("type[TombstoneModel]", self.model)
        key = get_options(model).business_key
        if key is not None and model.tombstones.filter(**{key: getattr(obj, key)}).exists():
            try:
                fresh = model.all_objects.recreate(**self._recreate_fields(obj, key))
            except AlreadyLive as exc:
                raise FenceConflict from exc
            obj.pk = fresh.pk
            obj.generation, obj.version, obj.deleted_at = (
                fresh.generation,
                fresh.version,
                fresh.deleted_at,
            )
            obj._state.adding = False
            obj._state.db = fresh._state.db
            return
        try:
            obj.save()
        except RecordDeleted as exc:  # tombstoned since the form was validated: re-create
            raise FenceConflict from exc

    def _recreate_fields(self, obj: models.Model, key: str) -> dict[str, Any]:
        fields = {
            f.attname: getattr(obj, f.attname)
            for f in obj._meta.concrete_fields
            if not f.primary_key and f.name not in PROTECTED_FIELDS
        }
        key_field = obj._meta.get_field(key)
        fields.pop(cast("models.Field[Any, Any]", key_field).attname, None)
        fields[key] = getattr(obj, key)  # recreate() looks the key up by its name
        return fields

    def response_add(
        self, request: HttpRequest, obj: Any, post_url_continue: str | None = None
    ) -> HttpResponse:
        # An insert is always generation 1: a later one means save_model() re-created it.
        if obj.generation <= 1 or IS_POPUP_VAR in request.POST:
            return super().response_add(request, obj, post_url_continue)
        change_url = reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_change",
            args=(quote(obj.pk),),
            current_app=self.admin_site.name,
        )
        self.message_user(
            request,
            format_html(
                _('The {name} “<a href="{url}">{obj}</a>” was re-created as generation {gen}.'),
                name=self.opts.verbose_name,
                url=change_url,
                obj=obj,
                gen=obj.generation,
            ),
            messages.SUCCESS,
        )
        if "_continue" in request.POST:
            url = change_url
        elif "_addanother" in request.POST:
            url = request.path
        else:
            return self.response_post_save_add(request, obj)
        preserved: Any = {
            "preserved_filters": self.get_preserved_filters(request),
            "opts": self.opts,
        }
        return HttpResponseRedirect(add_preserved_filters(preserved, url))

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> Any:
        obj = self.get_object(request, unquote(object_id))
        if obj is not None:
            # Django's title is str(obj), and so are the breadcrumbs its template draws.
            name = record_name(obj)
            extra_context = {
                "title": _("Change history: %s") % name,
                "record_name": name,
                **(extra_context or {}),
            }
        return super().history_view(request, object_id, extra_context)
