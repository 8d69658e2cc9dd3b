"""TombstoneAdmin: a ModelAdmin base for business models on the ``TombstoneModel`` mixin.

- Delete (the delete view and the bulk action) makes tombstones; the confirmation names the
  personal fields to be erased and counts the unfinished jobs that reference the record.
- The changelist shows live records; a filter shows tombstones, or both. A tombstone is shown as
  its identity only and cannot be edited.
- The change form is fenced on the (generation, version) it was opened at: a record changed since
  (by staff or a job) is refused with a form error, and nothing is overwritten.
- Adding a business key held by a tombstone re-creates that record as the next generation.
- Admin log entries name records by identity (label, pk, business key), never by ``str()``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.admin.options import IS_POPUP_VAR, TO_FIELD_VAR
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.utils import model_ngettext, quote, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.validators import EMPTY_VALUES
from django.db import connections, models, router, transaction
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .exceptions import AlreadyLive, GenerationChanged, RecordDeleted, RecordMissing, StaleVersion
from .models import Job
from .options import PROTECTED_FIELDS, get_options
from .records import TombstoneModel

__all__ = ["TombstoneAdmin", "TombstoneAdminForm", "TombstoneStateFilter", "identity_repr"]

# Hidden form fields: the (generation, version) the change form was opened at.
FENCE_FIELDS = ("opened_generation", "opened_version")
# The mixin's fields, read-only on the change form.
MIXIN_FIELDS = ("generation", "version", "deleted_at")
TEMPLATES = "tombstones/record_admin"
TIMELINE_URL = "admin:tombstones_job_timeline"

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


def identity_repr(obj: models.Model) -> str:
    """``app_label.Model pk=… key=…``: all that logs and audit pages may say about a record."""
    text = f"{obj._meta.label} pk={obj.pk}"
    key = get_options(obj).business_key
    if key is not None:
        field = cast("models.Field[Any, Any]", obj._meta.get_field(key))
        text += f" {key}={getattr(obj, field.attname)}"
    return text


def _is_tombstone(obj: Any) -> bool:
    return obj is not None and getattr(obj, "deleted_at", None) is not None


def _as_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 1 else None


class _FenceConflict(Exception):
    """A fenced write matched 0 rows inside an admin view; the view's transaction rolls back."""


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


class TombstoneAdmin(admin.ModelAdmin):
    """ModelAdmin for a model on the ``TombstoneModel`` mixin: see the module docstring."""

    form = TombstoneAdminForm
    actions = ["delete_selected"]
    list_display: Any = ("record_identity", "generation", "version", "deleted_at")
    change_form_template = f"{TEMPLATES}/change_form.html"
    delete_confirmation_template = f"{TEMPLATES}/delete_confirmation.html"
    delete_selected_confirmation_template = f"{TEMPLATES}/delete_selected_confirmation.html"
    object_history_template = f"{TEMPLATES}/object_history.html"

    # --- identity ---------------------------------------------------------------------------

    @admin.display(description=gettext_lazy("record"))
    def record_identity(self, obj: Any) -> str:
        return identity_repr(obj)

    @admin.display(description=gettext_lazy("ID"))
    def record_pk(self, obj: Any) -> Any:
        return obj.pk

    def identity_fields(self) -> tuple[str, ...]:
        """What a tombstone shows: pk, business key, generation, version, deleted_at."""
        key = get_options(self.model).business_key
        return ("record_pk", *((key,) if key else ()), "generation", "version", "deleted_at")

    def action_checkbox(self, obj: Any) -> SafeString:
        # Django labels the checkbox with str(obj); use the identity instead.
        attrs = {
            "class": "action-select",
            "aria-label": format_html(
                _("Select this object for an action - {}"), identity_repr(obj)
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
            return ("record_identity", "generation", "version", "deleted_at")
        return super().get_list_display(request)

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
        fields = [f for f in super().get_fields(request, obj) if f not in FENCE_FIELDS]
        if obj is not None:  # shown read-only, even when ``fields`` leaves them out
            fields += [f for f in MIXIN_FIELDS if f not in fields]
        return fields

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if _is_tombstone(obj):
            return [(None, {"fields": list(self.identity_fields())})]
        return super().get_fieldsets(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if _is_tombstone(obj):
            return list(self.identity_fields())
        readonly = list(super().get_readonly_fields(request, obj))
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
            identity = identity_repr(obj)
            context["subtitle"] = identity
            context["record_identity"] = identity
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
            except _FenceConflict:
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
                raise _FenceConflict from exc
            return
        model = cast("type[TombstoneModel]", self.model)
        key = get_options(model).business_key
        if key is not None and model.tombstones.filter(**{key: getattr(obj, key)}).exists():
            try:
                fresh = model.all_objects.recreate(**self._recreate_fields(obj, key))
            except AlreadyLive as exc:
                raise _FenceConflict from exc
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
            raise _FenceConflict from exc

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
                obj=identity_repr(obj),
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
            identity = identity_repr(obj)
            extra_context = {
                "title": _("Change history: %s") % identity,
                "object_identity": identity,
                **(extra_context or {}),
            }
        return super().history_view(request, object_id, extra_context)

    # --- delete -----------------------------------------------------------------------------

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # Nothing cascades: deleting makes tombstones of these records and of nothing else.
        records = list(objs)
        return (
            [identity_repr(obj) for obj in records],
            {self.opts.verbose_name_plural: len(records)},
            set(),
            [],
        )

    def erasure_context(self, records: Sequence[models.Model]) -> dict[str, Any]:
        """What a delete confirmation shows: personal fields to erase, queued jobs per record."""
        opts = self.model._meta
        personal = [
            capfirst(str(cast("models.Field[Any, Any]", opts.get_field(name)).verbose_name))
            for name in get_options(self.model).personal_fields
        ]
        counts = self.queued_job_counts([obj.pk for obj in records])
        rows = [(identity_repr(obj), counts.get(str(obj.pk), 0)) for obj in records]
        return {
            "personal_fields": personal,
            "business_key": get_options(self.model).business_key,
            "records": rows,
            "queued_jobs": sum(counts.values()),
        }

    def queued_job_counts(self, pks: Iterable[Any]) -> dict[str, int]:
        """Unfinished jobs per record pk (as Job.object_id strings)."""
        content_type = ContentType.objects.get_for_model(self.model)
        rows = (
            Job.objects.filter(
                content_type=content_type,
                object_id__in=[str(pk) for pk in pks],
                status__in=Job.UNFINISHED,
            )
            .order_by()  # Job's default ordering would split the groups
            .values("object_id")
            .annotate(count=Count("pk"))
        )
        return {row["object_id"]: row["count"] for row in rows}

    def render_delete_form(self, request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
        obj = context["object"]
        context.update(self.erasure_context([obj]), record_identity=identity_repr(obj))
        return super().render_delete_form(request, context)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> Any:
        try:
            return super().delete_view(request, object_id, extra_context)
        except _FenceConflict:
            self.message_user(request, DELETED_MESSAGE, messages.WARNING)
            return HttpResponseRedirect(
                reverse(
                    f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                    current_app=self.admin_site.name,
                )
            )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        count, _by_model = obj.delete()
        if not count:
            # Deleted or re-created by someone else since the page was read: roll back the log.
            raise _FenceConflict

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        # obj_display is str(obj): name the tombstone by its identity instead.
        display = f"{self.opts.label} {obj_id}"
        if TO_FIELD_VAR not in request.POST and TO_FIELD_VAR not in request.GET:
            found = self.get_queryset(request).filter(pk=obj_id).first()
            if found is not None:
                display = identity_repr(found)
        return super().response_delete(request, display, obj_id)

    @admin.action(
        permissions=["delete"],
        description=gettext_lazy("Delete selected %(verbose_name_plural)s"),
    )
    def delete_selected(
        self, request: HttpRequest, queryset: models.QuerySet[Any]
    ) -> HttpResponse | None:
        """Make tombstones of the selected live records, after a confirmation page."""
        model = cast("type[TombstoneModel]", self.model)
        pks = list(queryset.filter(deleted_at__isnull=True).values_list("pk", flat=True))
        if request.POST.get("post"):
            with transaction.atomic(using=router.db_for_write(model)):
                # Lock a plain queryset: the changelist's may carry outer joins.
                targets = model.all_objects.select_for_update().filter(
                    pk__in=pks, deleted_at__isnull=True
                )
                records = list(targets)
                if records:
                    self.log_deletions(request, cast(Any, records))
                    self.delete_queryset(request, targets)
            if records:
                self.message_user(
                    request,
                    _("Successfully deleted %(count)d %(items)s.")
                    % {"count": len(records), "items": model_ngettext(self.opts, len(records))},
                    messages.SUCCESS,
                )
            else:
                self.message_user(request, _("Nothing was deleted."), messages.WARNING)
            return None  # back to the changelist
        records = list(model.all_objects.filter(pk__in=pks))
        if not records:
            self.message_user(
                request,
                _("The selected %(items)s are already tombstones: nothing to delete.")
                % {"items": self.opts.verbose_name_plural},
                messages.WARNING,
            )
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": _("Delete multiple objects"),
            "subtitle": None,
            "objects_name": str(model_ngettext(self.opts, len(records))),
            "queryset": records,
            "opts": self.opts,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
            **self.erasure_context(records),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.delete_selected_confirmation_template, context)

    def delete_queryset(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> None:
        queryset.delete()  # the record queryset's delete() makes tombstones

    # --- log entries: identity only -----------------------------------------------------------

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
                object_repr=identity_repr(obj)[:200],
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
        # Django names inline objects by str(obj); use their identity, in Django's order.
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
                    detail["object"] = identity_repr(next(related))
        return message
