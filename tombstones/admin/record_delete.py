"""Deleting through a ``TombstoneAdmin`` makes tombstones, after a confirmation page.

The confirmation (the delete view and the bulk action alike) lists no cascade, since nothing
cascades; it names the personal fields to be erased and counts the unfinished jobs that
reference each record (they will be rejected instead of acting on the tombstone).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IS_POPUP_VAR
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.utils import model_ngettext
from django.contrib.contenttypes.models import ContentType
from django.db import models, router, transaction
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..jobs.models import Job
from ..records.mixin import TombstoneModel
from ..records.options import get_options
from .record_form import DELETED_MESSAGE, FenceConflict

__all__ = ["RecordDeleteMixin"]

TEMPLATES = "tombstones/record_admin"


class RecordDeleteMixin(admin.ModelAdmin):
    """The delete view, the ``delete_selected`` action and their confirmation pages."""

    delete_confirmation_template = f"{TEMPLATES}/delete_confirmation.html"
    delete_selected_confirmation_template = f"{TEMPLATES}/delete_selected_confirmation.html"

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # Nothing cascades: deleting makes tombstones of these records and of nothing else.
        records = list(objs)
        return (
            [str(obj) for obj in records],
            {self.opts.verbose_name_plural: len(records)},
            set(),
            [],
        )

    def erasure_context(self, records: Sequence[models.Model]) -> dict[str, Any]:
        """What a delete confirmation shows: personal fields to erase, queued jobs per record."""
        personal = [capfirst(name) for name in self.personal_field_names()]
        counts = self.queued_job_counts([obj.pk for obj in records])
        # Live records (tombstones cannot be deleted), named as Django names them.
        rows = [(str(obj), counts.get(str(obj.pk), 0)) for obj in records]
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
        context.update(self.erasure_context([context["object"]]))
        return super().render_delete_form(request, context)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> Any:
        try:
            return super().delete_view(request, object_id, extra_context)
        except FenceConflict:
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
            raise FenceConflict

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        if IS_POPUP_VAR in request.POST:
            return super().response_delete(request, obj_display, obj_id)  # no message there
        # Not Django's "“str(obj)” was deleted successfully": str() may read the erased personal
        # fields, and the record was not deleted but became a tombstone.
        self.message_user(request, self.tombstoned_message([obj_id]), messages.SUCCESS)
        if self.has_change_permission(request, None):
            post_url = reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                current_app=self.admin_site.name,
            )
            preserved: Any = {
                "preserved_filters": self.get_preserved_filters(request),
                "opts": self.opts,
            }
            post_url = add_preserved_filters(preserved, post_url)
        else:
            post_url = reverse("admin:index", current_app=self.admin_site.name)
        return HttpResponseRedirect(post_url)

    def tombstoned_message(self, pks: Sequence[Any]) -> str:
        """What staff read once records became tombstones: model and ids, never ``str()``."""
        count = len(pks)
        if count == 1:
            text = _("The %(name)s with ID %(pk)s is now a tombstone.") % {
                "name": self.opts.verbose_name,
                "pk": pks[0],
            }
        else:
            text = _("%(count)d %(items)s are now tombstones.") % {
                "count": count,
                "items": self.opts.verbose_name_plural,
            }
        personal = self.personal_field_names()
        if personal:
            text += " " + ngettext(
                "Its personal fields were erased: %(fields)s.",
                "Their personal fields were erased: %(fields)s.",
                count,
            ) % {"fields": ", ".join(personal)}
        text += " " + ngettext(
            "Its jobs are fenced: a queued job is rejected instead of acting on the tombstone.",
            "Their jobs are fenced: a queued job is rejected instead of acting on a tombstone.",
            count,
        )
        return text

    def personal_field_names(self) -> list[str]:
        """The verbose names of the fields a deletion erases (shown on the confirmation too)."""
        opts = self.model._meta
        return [
            str(cast("models.Field[Any, Any]", opts.get_field(name)).verbose_name)
            for name in get_options(self.model).personal_fields
        ]

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
                message = self.tombstoned_message([record.pk for record in records])
                self.message_user(request, message, messages.SUCCESS)
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
