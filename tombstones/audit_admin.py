"""The job audit for staff and auditors: jobs, their events, the rejection log, the dashboard.

Everything here is read-only through the permission hooks; the only writes are the staff
actions of :mod:`tombstones.operations`, each behind its own permission and a confirmation page.
No page shows a job's params, a record's field values, ``str(record)`` or exception text: the
record is named by ``app_label.model:pk`` and an error by its class.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import get_fields_from_path, quote, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from . import dashboard, ledger, operations, timeline
from .admin_actions import StaffActionsMixin
from .display import time_html
from .models import Dashboard, Job, JobEvent, Rejection

# The longest all-digit term tried as a job id (a bigint has 19 digits; beyond, it is no id).
_MAX_ID_DIGITS = 18


def search_ids(queryset: QuerySet[Any], term: str, job_field: str) -> QuerySet[Any]:
    """Search by job id (``42``, ``#42``) or record pk (``7``, ``customers.customer:7``).

    Exact matches on ids only: no lookup ever touches params or the record's fields.
    """
    term = term.strip()
    if not term:
        return queryset
    if term.startswith("#"):
        digits = term[1:]
        if digits.isdigit() and len(digits) <= _MAX_ID_DIGITS:
            return queryset.filter(**{job_field: int(digits)})
        return queryset.none()
    if ":" in term:
        label, _, pk = term.rpartition(":")
        app_label, _, model = label.lower().partition(".")
        return queryset.filter(
            content_type__app_label=app_label, content_type__model=model, object_id=pk
        )
    match = Q(object_id=term)
    if term.isdigit() and len(term) <= _MAX_ID_DIGITS:
        match |= Q(**{job_field: int(term)})
    return queryset.filter(match)


class ReadOnlyAdmin(admin.ModelAdmin):
    """View-only through the permission hooks: nobody adds, changes or deletes audit rows.

    Changelist lookups are closed as well: Django accepts any lookup on a local field, so
    ``?params__email__startswith=o`` would answer "1 job" or "0 jobs" about a hidden column.
    Only the parameters of the declared ``list_filter`` and ``date_hierarchy``, plus
    ``extra_lookups``, are accepted, for every user; anything else is Django's
    DisallowedModelAdminLookup (a 400). Search goes through ``get_search_results`` (ids only).
    """

    extra_lookups: tuple[str, ...] = ()

    class Media:
        css = {"all": ("tombstones/admin.css",)}

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.declared_lookups(request)

    def declared_lookups(self, request: HttpRequest | None) -> frozenset[str]:
        """The query-string parameters the declared filters and the date hierarchy read."""
        names = set(self.extra_lookups)
        if self.date_hierarchy:
            names.update(f"{self.date_hierarchy}__{part}" for part in ("year", "month", "day"))
        for item in self.get_list_filter(request):  # type: ignore[arg-type]
            names.update(self._filter_parameters(request, item))
        return frozenset(names)

    def _filter_parameters(self, request: HttpRequest | None, item: Any) -> list[str]:
        # Built as ChangeList.get_filters builds them, from an empty query string.
        if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
            return [str(item.parameter_name)]
        if isinstance(item, tuple | list):
            field_path, filter_class = item
        else:
            field_path, filter_class = item, admin.FieldListFilter.create
        field = get_fields_from_path(self.model, field_path)[-1]
        spec = filter_class(field, request, {}, self.model, self, field_path=field_path)
        return [str(name) for name in spec.expected_parameters()]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _record_ref(obj: Job | JobEvent) -> str:
    return ledger.record_ref(obj.content_type_id, obj.object_id)


def _gv(generation: int | None, version: int | None) -> str:
    if generation is None and version is None:
        return "-"
    g = "?" if generation is None else generation
    v = "?" if version is None else version
    return f"g{g}/v{v}"


def timeline_url(content_type_id: int, object_id: str) -> str:
    """The record timeline (URL name ``admin:tombstones_job_timeline``)."""
    return reverse("admin:tombstones_job_timeline", args=(content_type_id, object_id))


def _record_link(obj: Job | JobEvent) -> str:
    url = timeline_url(obj.content_type_id, obj.object_id)
    return format_html('<a href="{}">{}</a>', url, _record_ref(obj))


def time_column(field: str, description: Any) -> Callable[[Any, Any], str]:
    """An admin column or read-only field showing ``field`` in the audit's one time format."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Any) -> str:
        return time_html(getattr(obj, field))

    column.__name__ = field
    return column


def _breakable(name: str) -> str:
    # A dotted handler name may wrap after a dot or an underscore, never inside a word.
    return format_html_join("", "{}<wbr>", ((part,) for part in re.split(r"(?<=[._])", name)))


class AuditColumns(ReadOnlyAdmin):
    """Columns the job audit, the event log and the rejection log share: ids and codes only."""

    @admin.display(description=gettext_lazy("record"), ordering="object_id")
    def record(self, obj: Job | JobEvent) -> str:
        return _record_link(obj)

    @admin.display(description=gettext_lazy("reason"), ordering="reason")
    def reason_code(self, obj: Job | JobEvent) -> str:
        return obj.reason or "-"

    @admin.display(description=gettext_lazy("found"))
    def found(self, obj: Job | JobEvent) -> str:
        return _gv(obj.found_generation, obj.found_version)


@admin.register(Job)
class JobAdmin(StaffActionsMixin, AuditColumns):
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
    list_filter = ("status", "reason", "handler", "created_at")
    search_fields = ("=object_id",)  # shows the search box; see get_search_results
    search_help_text = gettext_lazy("Job id (42 or #42) or record pk (7 or customers.customer:7).")
    # The record timeline links to the record's jobs with these two (ids only).
    extra_lookups = ("content_type", "object_id")
    list_select_related = ("content_type",)
    date_hierarchy = "created_at"
    list_per_page = 50
    _job_fields = ("id", "handler", "record", "lane", "status", "reason_code", "error_class")
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
        return search_ids(queryset, search_term, "pk"), False

    @admin.display(description=gettext_lazy("snapshot"))
    def snapshot(self, obj: Job) -> str:
        return _gv(obj.generation, obj.version)

    @admin.display(description=gettext_lazy("owner"))
    def owner_while_claimed(self, obj: Job) -> str:
        # The worker holding the lease; once the job is no longer running nobody holds it (the
        # column keeps the last holder, which the event table shows per event).
        return obj.owner if obj.status == Job.Status.RUNNING and obj.owner else "-"

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_reason(self, obj: Job) -> str:
        if not obj.reason:
            return obj.get_status_display()
        return format_html(
            '{}<br><span class="tg-note">{}</span>',
            obj.get_status_display(),
            _breakable(obj.reason),
        )

    @admin.display(description=gettext_lazy("handler"), ordering="handler")
    def handler_name(self, obj: Job) -> str:
        return _breakable(obj.handler)

    @admin.display(description=gettext_lazy("record"), ordering="object_id")
    def record_snapshot(self, obj: Job) -> str:
        # The reference may wrap after its dot (a narrow column); the snapshot under it.
        return format_html(
            '<a href="{}">{}</a><br><span class="tg-note">{}</span>',
            timeline_url(obj.content_type_id, obj.object_id),
            _breakable(_record_ref(obj)),
            _gv(obj.generation, obj.version),
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

    def allowed_actions(self, request: HttpRequest, job: Job) -> list[operations.StaffAction]:
        return [
            action
            for action in operations.available(job)
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
            extra["job_events"] = job.history()
            extra["staff_actions"] = [
                (a, reverse("admin:tombstones_job_act", args=(quote(job.pk), a.slug)))
                for a in self.allowed_actions(request, job)
            ]
            extra["timeline_url"] = timeline_url(job.content_type_id, job.object_id)
            extra["record_ref"] = _record_ref(job)
        return super().change_view(request, object_id, form_url, extra)

    def action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Two steps: GET shows what will happen; POST with confirm=yes does it, once."""
        staff_action = operations.ACTIONS.get(action)
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
            if staff_action.perform(job, seen, operations.staff_ref(request.user.pk)):
                self.log_change(
                    request,
                    job,
                    f"{staff_action.slug}: job {job.pk} {seen} -> {job.status}"
                    + (f" ({job.reason})" if job.reason else ""),
                )
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
        possible = staff_action in operations.available(job)
        context = {
            **self.admin_site.each_context(request),
            "media": self.media,
            "title": _("%(action)s: job %(job)s") % {"action": staff_action.title, "job": job.pk},
            "opts": self.opts,
            "job": job,
            "record_ref": _record_ref(job),
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
            "identity": data.identity,
            "svg": data.svg,
            "legend": [
                (label, timeline.STATUS_COLOURS[value]) for value, label in Job.Status.choices
            ],
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
            **dashboard.context(),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "tombstones/admin/dashboard.html", context)


@admin.register(JobEvent)
class JobEventAdmin(AuditColumns):
    list_display = (
        "id",
        "created",
        "event",
        "job_link",
        "record",
        "reason_code",
        "expected",
        "found",
    )
    list_filter = ("event", "reason", "created_at")
    search_fields = ("=object_id",)
    search_help_text = gettext_lazy("Job id (#42) or record pk (7 or customers.customer:7).")
    list_select_related = ("content_type",)
    fields = (*list_display, "worker")
    readonly_fields = fields

    created = time_column("created_at", gettext_lazy("created"))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[JobEvent], search_term: str
    ) -> tuple[QuerySet[JobEvent], bool]:
        return search_ids(queryset, search_term, "job_id"), False

    @admin.display(description=gettext_lazy("job"), ordering="job_id")
    def job_link(self, obj: JobEvent) -> str:
        url = reverse("admin:tombstones_job_change", args=(obj.job_id,))
        return format_html('<a href="{}">{}</a>', url, obj.job_id)

    @admin.display(description=gettext_lazy("expected"))
    def expected(self, obj: JobEvent) -> str:
        return _gv(obj.expected_generation, obj.expected_version)


def _csv_cell(value: Any) -> str:
    text = "" if value is None else str(value)
    # A spreadsheet must never evaluate a cell (CSV injection): ids only, but be safe.
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


# The rejection log's columns, shared by the list and the CSV export: (header, value).
REJECTION_COLUMNS: tuple[tuple[str, Callable[[Rejection], Any]], ...] = (
    ("timestamp", lambda r: r.created_at.isoformat()),
    ("reason", lambda r: r.reason),
    ("job id", lambda r: r.job_id),
    ("record", _record_ref),
    ("expected generation", lambda r: r.expected_generation),
    ("expected version", lambda r: r.expected_version),
    ("found generation", lambda r: r.found_generation),
    ("found version", lambda r: r.found_version),
)


@admin.register(Rejection)
class RejectionAdmin(AuditColumns):
    list_display = (
        "timestamp",
        "reason_code",
        "job_link",
        "record",
        "expected_generation",
        "expected_version",
        "found_generation",
        "found_version",
    )
    list_display_links = ("timestamp",)
    list_filter = ("reason", "created_at")
    search_fields = ("=object_id",)
    search_help_text = gettext_lazy("Job id (#42) or record pk (7 or customers.customer:7).")
    list_select_related = ("content_type",)
    date_hierarchy = "created_at"
    fields = (
        "timestamp",
        "reason_code",
        "job_link",
        "record",
        "expected_generation",
        "expected_version",
        "found_generation",
        "found_version",
        "worker",
    )
    readonly_fields = fields
    change_list_template = "tombstones/admin/rejection_change_list.html"

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Rejection], search_term: str
    ) -> tuple[QuerySet[Rejection], bool]:
        return search_ids(queryset, search_term, "job_id"), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # The page keeps its name; its counter reads "4 rejections" (the model's plural).
        title = _("Rejection log")
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    timestamp = time_column("created_at", gettext_lazy("timestamp"))

    @admin.display(description=gettext_lazy("reason"), ordering="reason")
    def reason_code(self, obj: Job | JobEvent) -> str:
        # A rejection always has its reason; the list and the CSV show it bare.
        return obj.reason

    @admin.display(description=gettext_lazy("job id"), ordering="job_id")
    def job_link(self, obj: Rejection) -> str:
        url = reverse("admin:tombstones_job_change", args=(obj.job_id,))
        return format_html('<a href="{}">{}</a>', url, obj.job_id)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "export.csv",
                self.admin_site.admin_view(self.export_csv),
                name="tombstones_rejection_export",
            ),
            *super().get_urls(),
        ]

    def export_csv(self, request: HttpRequest) -> HttpResponse:
        """The rejection log as CSV: the list's columns, its filters and search applied."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponse(_("Invalid filter."), status=400, content_type="text/plain")
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response["Content-Disposition"] = f'attachment; filename="rejections-{stamp}.csv"'
        writer = csv.writer(response)
        writer.writerow([header for header, _ in REJECTION_COLUMNS])
        for row in changelist.queryset.iterator(chunk_size=2000):
            writer.writerow([_csv_cell(value(row)) for _, value in REJECTION_COLUMNS])
        return response


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
