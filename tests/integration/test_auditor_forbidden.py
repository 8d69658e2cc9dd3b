"""An auditor who opens a staff-only admin page gets a page that explains the role, still a 403;
anyone else gets Django's 403."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from tests.factories import CustomerFactory
from tombstones.jobs.enqueue import enqueue

pytestmark = pytest.mark.django_db

PLANTED_NAME = "Zyxwvut Rolename"
PLANTED_EMAIL = "planted-role@pii.test"


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_auditor__a_staff_only_page_explains_the_role(auditor: User) -> None:
    customer = CustomerFactory(name=PLANTED_NAME, email=PLANTED_EMAIL)
    job = enqueue("customers.update_sheet_row", customer)
    client = _client(auditor)
    for url in (
        reverse("admin:customers_customer_changelist"),
        reverse("admin:customers_customer_change", args=(customer.pk,)),
        reverse("admin:tombstones_job_act", args=(job.pk, "cancel")),
    ):
        response = client.get(url)
        assert response.status_code == 403, url
        html = response.content.decode()
        assert 'id="auditor-role"' in html, url
        assert "What auditors can see" in html
        assert reverse("admin:tombstones_job_changelist") in html
        assert reverse("admin:tombstones_rejection_changelist") in html
        assert "superuser" in html  # whom to ask
        assert PLANTED_NAME not in html
        assert PLANTED_EMAIL not in html


def test_other_staff__get_djangos_own_403(auditor: User) -> None:
    staff = User.objects.create_user("clerk", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    response = _client(staff).get(reverse("admin:customers_customer_changelist"))
    assert response.status_code == 403
    assert 'id="auditor-role"' not in response.content.decode()


def test_auditor__outside_the_admin_gets_djangos_403(auditor: User, settings: object) -> None:
    from django.core.exceptions import PermissionDenied
    from django.test import RequestFactory

    from tombstones.views import permission_denied

    request = RequestFactory().get("/not-admin/")
    request.user = auditor
    response = permission_denied(request, PermissionDenied())
    assert response.status_code == 403
    assert b"auditor-role" not in response.content
