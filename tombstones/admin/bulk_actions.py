"""Staff decisions as changelist actions on the Jobs list, with a confirmation page.

The same :data:`tombstones.jobs.staff_actions.ACTIONS` as the job page's buttons, each behind
its own permission (``@admin.action(permissions=[...])``), in two steps like Django's
``delete_selected``: the first POST shows which selected jobs the decision applies to and which
are skipped and why; the second (``post=yes``) applies it to each job still in the status it was
shown in. Pages and messages name jobs by id, status and handler only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.text import format_lazy
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..jobs import staff_actions
from ..jobs.models import Job

# The permission each decision needs: (name for @admin.action, codename on tombstones.Job).
PERMISSIONS = {
    "resolve_job": "resolve",
    "resume_job": "resume",
    "cancel_job": "cancel",
    "skip_lane_head": "skip_lane_head",
}

# The most jobs one confirmation page lists (a larger selection is refused, not truncated).
MAX_SELECTED = 500

SEEN_PREFIX = "seen_"


def _make_action(staff_action: staff_actions.StaffAction) -> Callable[..., Any]:
    def act(
        modeladmin: StaffActionsMixin, request: HttpRequest, queryset: QuerySet[Job]
    ) -> HttpResponse | None:
        return modeladmin.confirm_bulk(request, queryset, staff_action)

    act.__name__ = staff_action.slug.replace("-", "_")
    return admin.action(
        permissions=[PERMISSIONS[staff_action.permission]],
        description=format_lazy(
            gettext_lazy("{action} (selected jobs)"), action=staff_action.title
        ),
    )(act)


def log_message(staff_action: staff_actions.StaffAction, job: Job, before: str) -> str:
    """The admin log's line for a staff decision: job id, statuses and reason code only."""
    reason = f" ({job.reason})" if job.reason else ""
    return f"{staff_action.slug}: job {job.pk} {before} -> {job.status}{reason}"


BULK_ACTIONS = tuple(_make_action(action) for action in staff_actions.ACTIONS.values())


class StaffActionsMixin(admin.ModelAdmin):
    """Adds the staff decisions to a Job admin's changelist actions."""

    actions = BULK_ACTIONS

    def _has(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"tombstones.{codename}")

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "resolve_job")

    def has_resume_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "resume_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "cancel_job")

    def has_skip_lane_head_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "skip_lane_head")

    def confirm_bulk(
        self, request: HttpRequest, queryset: QuerySet[Job], staff_action: staff_actions.StaffAction
    ) -> HttpResponse | None:
        # Django offers only the actions this user may take; a forged POST is refused here too.
        if not (self.has_view_permission(request) and self._has(request, staff_action.permission)):
            raise PermissionDenied
        jobs = list(queryset.defer("params").order_by("pk")[: MAX_SELECTED + 1])
        if len(jobs) > MAX_SELECTED:
            self.message_user(
                request,
                _("Select at most %(n)d jobs for one decision; nothing changed.")
                % {"n": MAX_SELECTED},
                messages.ERROR,
            )
            return None
        if request.POST.get("post") == "yes":
            self._apply(request, jobs, staff_action)
            return None  # back to the changelist
        eligible, skipped = [], []
        for job in jobs:
            why = staff_actions.why_not(staff_action, job)
            if why:
                skipped.append((job, why))
            else:
                eligible.append(job)
        context = {
            **self.admin_site.each_context(request),
            "title": _("%(action)s: %(eligible)d of %(selected)d selected jobs")
            % {"action": staff_action.title, "eligible": len(eligible), "selected": len(jobs)},
            "opts": self.opts,
            "media": self.media,
            "action": staff_action,
            "action_name": request.POST.get("action", ""),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "eligible": eligible,
            "skipped": skipped,
            "seen_prefix": SEEN_PREFIX,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "tombstones/admin/confirm_bulk_action.html", context)

    def _apply(
        self, request: HttpRequest, jobs: list[Job], staff_action: staff_actions.StaffAction
    ) -> None:
        by = staff_actions.staff_ref(request.user.pk)
        done: list[int] = []
        skipped: Counter[str] = Counter()
        for job in jobs:
            seen = request.POST.get(f"{SEEN_PREFIX}{job.pk}", "")
            if seen not in staff_action.from_status:
                skipped[_("not confirmed in an allowed status")] += 1
                continue
            before = job.status
            if staff_action.perform(job, seen, by):
                done.append(job.pk)
                self.log_change(request, job, log_message(staff_action, job, before))
            else:
                skipped[_("changed since the confirmation page")] += 1
        level = messages.SUCCESS if done and not skipped else messages.WARNING
        text = _("%(action)s: done for %(n)d job(s)") % {
            "action": staff_action.title,
            "n": len(done),
        }
        if done:
            text += " (" + ", ".join(f"#{pk}" for pk in done) + ")"
        if skipped:
            text += _("; skipped %(list)s") % {
                "list": "; ".join(f"{n}: {why}" for why, n in sorted(skipped.items()))
            }
        self.message_user(request, text + ".", level)
