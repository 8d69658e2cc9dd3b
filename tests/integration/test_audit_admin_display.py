"""How the job audit shows things: one time format, no dead fields, the owner only while claimed,
staff decisions named by the staff user, the rejection log's counter."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from tests.factories import CustomerFactory
from tests.jobkit import STAFF_CODENAMES, run
from tombstones.dispatch import enqueue
from tombstones.models import Job

pytestmark = pytest.mark.django_db

# Django's own formats: "Dec. 1, 2026, 4:12 a.m." (no seconds) and "...:48.123456" (padded).
DJANGO_DATETIME = re.compile(r"[ap]\.m\.|\d{2}:\d{2}:\d{2}\.\d{6}<")
ONE_FORMAT = re.compile(r"<span>\d{4}-\d{2}-\d{2}</span> <span>\d{2}:\d{2}:\d{2}</span>")


@pytest.fixture
def staff() -> User:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="tombstones", codename__in=STAFF_CODENAMES
        )
    )
    return user


@pytest.fixture
def staff_client(staff: User) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def _page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def test_times__lists_detail_and_event_tables_share_one_format_with_seconds(
    staff_client: Client,
) -> None:
    customer = CustomerFactory()
    job = run(enqueue("customers.update_sheet_row", customer))
    late = enqueue("customers.update_sheet_row", customer)
    customer.delete()
    assert run(late).status == Job.Status.REJECTED
    for url in (
        reverse("admin:tombstones_job_changelist"),
        reverse("admin:tombstones_job_change", args=(job.pk,)),
        reverse("admin:tombstones_jobevent_changelist"),
        reverse("admin:tombstones_rejection_changelist"),
        reverse("admin:tombstones_job_timeline", args=(job.content_type_id, job.object_id)),
    ):
        html = _page(staff_client, url)
        assert not DJANGO_DATETIME.search(html), (url, DJANGO_DATETIME.search(html))
        assert ONE_FORMAT.search(html), url
    detail = _page(staff_client, reverse("admin:tombstones_job_change", args=(job.pk,)))
    # The job's own times (created, started, finished) and each of its events.
    assert len(ONE_FORMAT.findall(detail)) >= 3 + job.events.count()
    assert Job.objects.count() == 2
