"""The job audit's own pages: the job list and page with the staff actions, a record's timeline,
the dashboard (and its entry in the admin index).

Read-only like the rest of the audit (:mod:`.audit`), except for the staff actions of
:mod:`tombstones.jobs.staff_actions`, each behind its own permission and a confirmation page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..jobs import staff_actions
from ..jobs.models import Dashboard, Job
from . import dashboard, timeline
from .audit import (
    PLAIN,
    AuditColumns,
    ReadOnlyAdmin,
    breakable,
    event_rows,
    plain_note,
    record_ref,
    time_column,
    timeline_url,
)
from .bulk_actions import StaffActionsMixin, log_message
from .display import generation_version
from .filters import HandlerFilter, ReasonFilter, StatusFilter
from .search import search_jobs
from .statuses import status_badge


@admin.register(Job)
class JobAdmin(StaffActionsMixin, AuditColumns):
    """The job list and page; the timeline, dashboard and staff-action views hang off it."""

    # Narrow enough for the three times to show beside the filters at 1280 px: the reason under
    # the status, the snapshot under the record.
    list_display = (
        "id",
        "status_reason",
        "handler_name",
        "record_snapshot",
        "created",
        "started",
        "finished",
    )
    list_filter = (StatusFilter, ReasonFilter, HandlerFilter, "created_at")
    search_fields = ("=object_id",)  # shows the search box; see get_search_results
    search_help_text = gettext_lazy(
        "Job id (42 or #42), record pk (7 or customers.customer:7) or the record's business key "
        "(C-1001), exact."
    )
    # The record timeline links to the record's jobs with these two (ids only).
    extra_lookups = ("content_type", "object_id")
    list_select_related = ("content_type",)
    date_hierarchy = "created_at"
    list_per_page = 50
    _job_fields = (
        *("id", "handler", "record", "queue", "lane"),
        *("status_shown", "reason_code", "error_class"),
    )
    _fence_fields = ("snapshot", "found", "external", "idempotency_key")
    _attempt_fields = ("attempts", "rereads", "owner_while_claimed")
    _time_fields = (
        "created",
        "run_after_time",
        "started",
        "sending",
        "sent",
        "finished",
        "lease_expires",
    )
    fieldsets = (
        (None, {"fields": _job_fields}),
        (gettext_lazy("Fence"), {"fields": _fence_fields}),
        (gettext_lazy("Attempts"), {"fields": _attempt_fields}),
        (gettext_lazy("Times"), {"fields": _time_fields}),
    )
    # Never params: a job's parameters are for its handler only.
    readonly_fields = _job_fields + _fence_fields + _attempt_fields + _time_fields
    exclude = ("params",)
    change_list_template = "tombstones/admin/job_change_list.html"
    change_form_template = "tombstones/admin/job_change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        return super().get_queryset(request).defer("params")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        return search_jobs(queryset, search_term, "pk"), False

    @admin.display(description=gettext_lazy("snapshot"))
    def snapshot(self, obj: Job) -> str:
        return generation_version(obj.generation, obj.version)

    @admin.display(description=gettext_lazy("owner"))
    def owner_while_claimed(self, obj: Job) -> str:
        # The worker holding the lease; once the job is no longer running nobody holds it (the
        # column keeps the last holder, which the event table shows per event).
        return obj.owner if obj.status == Job.Status.RUNNING and obj.owner else "-"

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_reason(self, obj: Job) -> str:
        if not obj.reason:
            return status_badge(obj.status)
        return format_html(
            '{}<br><span class="tg-note">{}</span>',
            status_badge(obj.status),
            breakable(obj.reason),
        )

    @admin.display(description=gettext_lazy("status"))
    def status_shown(self, obj: Job) -> str:
        return status_badge(obj.status)

    @admin.display(description=gettext_lazy("handler"), ordering="handler")
    def handler_name(self, obj: Job) -> str:
        return breakable(obj.handler)

    @admin.display(description=gettext_lazy("record"), ordering="object_id")
    def record_snapshot(self, obj: Job) -> str:
        if obj.is_plain:
            return plain_note()
        # The reference may wrap after its dot (a narrow column); the snapshot under it.
        return format_html(
            '<a href="{}">{}</a><br><span class="tg-note">{}</span>',
            timeline_url(obj.content_type_id, obj.object_id),
            breakable(record_ref(obj)),
            generation_version(obj.generation, obj.version),
        )

    created = time_column("created_at", gettext_lazy("created"))
    run_after_time = time_column("run_after", gettext_lazy("run after"))
    started = time_column("started_at", gettext_lazy("started"))
    sending = time_column("sending_at", gettext_lazy("sending"))
    sent = time_column("sent_at", gettext_lazy("sent"))
    finished = time_column("finished_at", gettext_lazy("finished"))
    lease_expires = time_column("lease_expires_at", gettext_lazy("lease expires"))

    @admin.display(description=gettext_lazy("idempotency key"))
    def idempotency_key(self, obj: Job) -> str:
        return obj.idempotency_key

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("dashboard/", view(self.dashboard_view), name="tombstones_job_dashboard"),
            path(
                "timeline/<int:content_type_id>/<path:object_id>/",
                view(self.timeline_view),
                name="tombstones_job_timeline",
            ),
            path(
                "<path:object_id>/act/<slug:action>/",
                view(self.action_view),
                name="tombstones_job_act",
            ),
            *super().get_urls(),
        ]

    # --- the job page: its events and the actions open to this user --------------------------

    def allowed_actions(self, request: HttpRequest, job: Job) -> list[staff_actions.StaffAction]:
        return [
            action
            for action in staff_actions.available(job)
            if request.user.has_perm(f"tombstones.{action.permission}")
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, unquote(object_id))
        extra = dict(extra_context or {})
        if job is not None and self.has_view_permission(request, job):
            extra["job_events"] = event_rows(job.history())
            extra["staff_actions"] = [
                (a, reverse("admin:tombstones_job_act", args=(quote(job.pk), a.slug)))
                for a in self.allowed_actions(request, job)
            ]
            extra["timeline_url"] = timeline_url(job.content_type_id, job.object_id)
            extra["record_ref"] = PLAIN if job.is_plain else record_ref(job)
        return super().change_view(request, object_id, form_url, extra)

    def action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Two steps: GET shows what will happen; POST with confirm=yes does it, once."""
        staff_action = staff_actions.ACTIONS.get(action)
        job = self.get_object(request, unquote(object_id))
        if staff_action is None or job is None:
            raise Http404(_("No such job or action."))
        if not (
            self.has_view_permission(request, job)
            and request.user.has_perm(f"tombstones.{staff_action.permission}")
        ):
            raise PermissionDenied
        job_url = reverse("admin:tombstones_job_change", args=(quote(job.pk),))
        if request.method == "POST":
            seen = request.POST.get("seen_status", "")
            if request.POST.get("confirm") != "yes" or seen not in staff_action.from_status:
                self.message_user(
                    request, _("Nothing changed: the confirmation was not valid."), messages.ERROR
                )
                return HttpResponseRedirect(job_url)
            if staff_action.perform(job, seen, staff_actions.staff_ref(request.user.pk)):
                self.log_change(request, job, log_message(staff_action, job, seen))
                self.message_user(
                    request,
                    _("Job %(job)s: %(action)s done.")
                    % {"job": job.pk, "action": staff_action.title},
                    messages.SUCCESS,
                )
            else:
                self.message_user(
                    request,
                    _(
                        "Nothing changed: job %(job)s is no longer in a state that allows "
                        "“%(action)s” (someone or something acted first)."
                    )
                    % {"job": job.pk, "action": staff_action.title},
                    messages.WARNING,
                )
            return HttpResponseRedirect(job_url)
        possible = staff_action in staff_actions.available(job)
        context = {
            **self.admin_site.each_context(request),
            "media": self.media,
            "title": _("%(action)s: job %(job)s") % {"action": staff_action.title, "job": job.pk},
            "opts": self.opts,
            "job": job,
            "record_ref": PLAIN if job.is_plain else record_ref(job),
            "snapshot": generation_version(job.generation, job.version),
            "action": staff_action,
            "possible": possible,
            "job_url": job_url,
            "timeline_url": timeline_url(job.content_type_id, job.object_id),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "tombstones/admin/confirm_action.html", context)

    # --- the record timeline ------------------------------------------------------------------

    def timeline_view(
        self, request: HttpRequest, content_type_id: int, object_id: str
    ) -> HttpResponse:
        """A TombstoneModel record's timeline; 404 for anything else.

        Staff who may view the record's model see any of its records; auditors (view-only on the
        audit) only records that have jobs.
        """
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            content_type = ContentType.objects.get_for_id(content_type_id)
        except ContentType.DoesNotExist:
            raise Http404(_("No such content type.")) from None
        model = timeline.record_model(content_type)
        if model is None or not timeline.is_pk(model, object_id):
            raise Http404(_("No timeline for this reference."))
        model_admin = self.admin_site._registry.get(model)
        sees_records = model_admin is not None and model_admin.has_view_or_change_permission(
            request
        )
        data = timeline.build(content_type, object_id)
        # Without jobs the page would only tell whether a record exists, and its business key.
        if not data.jobs and not (sees_records and data.identity.exists):
            raise Http404(_("No timeline for this reference."))
        record_url = None
        if model_admin is not None and data.identity.exists and sees_records:
            record_url = reverse(
                f"admin:{content_type.app_label}_{content_type.model}_change",
                args=(quote(object_id),),
                current_app=self.admin_site.name,
            )
        jobs_url = reverse("admin:tombstones_job_changelist") + (
            f"?content_type={content_type.pk}&object_id={object_id}"
        )
        context = {
            **self.admin_site.each_context(request),
            "media": self.media,
            "title": _("Timeline of %(record)s")
            % {"record": f"{data.identity.model_label}:{object_id}"},
            "opts": self.opts,
            "timeline": data,
            "event_rows": event_rows(data.events),
            "identity": data.identity,
            "svg": data.svg,
            "legend": [
                (label, timeline.STATUS_COLOURS[value]) for value, label in Job.Status.choices
            ],
            "legend_badges": [status_badge(value) for value in Job.Status.values],
            "record_url": record_url,
            "jobs_url": jobs_url,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "tombstones/admin/timeline.html", context)

    # --- the dashboard ------------------------------------------------------------------------

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not (
            self.has_view_permission(request) or request.user.has_perm("tombstones.view_dashboard")
        ):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "media": self.media,
            "title": _("Job dashboard"),
            "opts": self.opts,
            "now": timezone.now(),
            "metrics_url": dashboard.metrics_url(request.user),
            **dashboard.context(),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "tombstones/admin/dashboard.html", context)


@admin.register(Dashboard)
class DashboardAdmin(ReadOnlyAdmin):
    """The dashboard's entry in the admin index; the page itself is JobAdmin's dashboard view."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return user.has_perm("tombstones.view_dashboard") or user.has_perm("tombstones.view_job")

    def get_urls(self) -> list[URLPattern]:
        # Only the entry point: a proxy of Job must not grow a second, unguarded job page.
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="tombstones_dashboard_changelist",
            )
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(reverse("admin:tombstones_job_dashboard"))
