"""A 403 page that explains the auditor role, for the project's ``handler403``.

Django answers a staff-only admin page with a bare "403 Forbidden". Install this handler in the
project's root URLconf and an auditor (a member of the "Auditors" group) who opens such a page
inside the admin learns what the role can see and whom to ask for staff rights::

    handler403 = "tombstones.views.permission_denied"

Anyone else, and any page outside the admin, gets Django's own 403 page. The page names no
record, field value or person: only the audit pages and the permission model.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext as _
from django.views import defaults

from .roles import AUDITORS

TEMPLATE = "tombstones/admin/auditor_forbidden.html"


def is_auditor(user: Any) -> bool:
    return bool(
        getattr(user, "is_authenticated", False)
        and getattr(user, "is_staff", False)
        and user.groups.filter(name=AUDITORS).exists()
    )


def _in_admin(request: HttpRequest, site: admin.AdminSite) -> bool:
    try:
        return request.path.startswith(reverse(f"{site.name}:index"))
    except NoReverseMatch:
        return False


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler403``: the auditor role page inside the admin, Django's 403 page elsewhere."""
    site = admin.site
    if not (_in_admin(request, site) and is_auditor(request.user)):
        return defaults.permission_denied(request, exception or Exception())
    context = {
        **site.each_context(request),
        "title": _("This page is for staff"),
        "auditors_group": AUDITORS,
    }
    return render(request, TEMPLATE, context, status=403)
