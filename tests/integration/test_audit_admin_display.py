"""How the job audit shows things: one time format, no dead fields, the owner only while claimed,
staff decisions named by the staff user, the rejection log's counter."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import claim, run
from tests.jobkit import record as record_outcome
from tombstones.jobs.enqueue import enqueue
from tombstones.jobs.ledger import worker_id
from tombstones.models import Job, JobEvent

pytestmark = pytest.mark.django_db

# Django's own formats: "Dec. 1, 2026, 4:12 a.m." (no seconds) and "...:48.123456" (padded).
DJANGO_DATETIME = re.compile(r"[ap]\.m\.|\d{2}:\d{2}:\d{2}\.\d{6}<")
ONE_FORMAT = re.compile(r"<span>\d{4}-\d{2}-\d{2}</span> <span>\d{2}:\d{2}:\d{2}</span>")


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


def test_times__tombstone_admin_and_history_pages_use_the_same_format(
    admin_client: Client, staff_client: Client
) -> None:
    customer = CustomerFactory()
    # Through the admin, so that the record's History has an entry.
    delete = reverse("admin:customers_customer_delete", args=(customer.pk,))
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    job = enqueue("customers.update_sheet_row", CustomerFactory())
    cancel = reverse("admin:tombstones_job_act", args=(job.pk, "cancel"))
    assert staff_client.post(cancel, {"confirm": "yes", "seen_status": "queued"}).status_code == 302
    changelist = reverse("admin:customers_customer_changelist")
    for client, url in (
        (admin_client, changelist + "?records=tombstones"),
        (admin_client, changelist + "?records=all"),
        (admin_client, reverse("admin:customers_customer_change", args=(customer.pk,))),
        (admin_client, reverse("admin:customers_customer_history", args=(customer.pk,))),
        (staff_client, reverse("admin:tombstones_job_history", args=(job.pk,))),
    ):
        html = _page(client, url)
        assert not DJANGO_DATETIME.search(html), (url, DJANGO_DATETIME.search(html))
        assert ONE_FORMAT.search(html), url
    # The tombstone's note says when it was deleted, to the second.
    tombstone = _page(admin_client, reverse("admin:customers_customer_change", args=(customer.pk,)))
    note = re.search(r'class="errornote tombstone-note">(.*?)</p>', tombstone, re.S)
    assert note
    assert ONE_FORMAT.search(note.group(1))


@pytest.mark.parametrize("declared", ["fieldsets", "readonly_fields"])
def test_times__a_subclass_naming_deleted_at_gets_the_same_format_once(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch, declared: str
) -> None:
    customer_admin = admin.site._registry[Customer]
    if declared == "fieldsets":
        fieldsets = [(None, {"fields": ["reference", ("name", "email"), "deleted_at"]})]
        monkeypatch.setattr(customer_admin, "fieldsets", fieldsets)
    else:
        monkeypatch.setattr(customer_admin, "readonly_fields", ("deleted_at",))
    monkeypatch.setattr(customer_admin, "list_display", ("reference", "deleted_at"))
    customer = CustomerFactory()
    html = _page(admin_client, reverse("admin:customers_customer_change", args=(customer.pk,)))
    assert html.count("Deleted at:") == 1  # its one read-only field, "-" while live
    assert "field-deleted_at" not in html
    listing = _page(admin_client, reverse("admin:customers_customer_changelist"))
    assert "column-deleted" in listing
    assert "column-deleted_at" not in listing


def _field(html: str, name: str) -> str:
    """The text of one read-only field of the job page."""
    match = re.search(rf'field-{name}\b.*?<div class="readonly">(.*?)</div>', html, re.S)
    assert match, name
    return match.group(1).strip()


def test_q_task_id__is_gone_from_the_model_and_the_job_page(staff_client: Client) -> None:
    assert "q_task_id" not in {f.name for f in Job._meta.get_fields()}
    job = enqueue("customers.update_sheet_row", CustomerFactory())
    html = _page(staff_client, reverse("admin:tombstones_job_change", args=(job.pk,)))
    assert "q_task_id" not in html
    assert "Q task id" not in html


def test_owner__shown_while_the_job_is_claimed_only(staff_client: Client) -> None:
    job = enqueue("customers.update_sheet_row", CustomerFactory())
    url = reverse("admin:tombstones_job_change", args=(job.pk,))
    held = claim(job)
    owner = Job.objects.get(pk=job.pk).owner
    assert owner
    assert _field(_page(staff_client, url), "owner_while_claimed") == owner
    record_outcome(held, Job.Status.SUCCEEDED)
    assert Job.objects.get(pk=job.pk).owner == owner  # the column keeps the last holder
    assert _field(_page(staff_client, url), "owner_while_claimed") == "-"


def test_staff_decision__its_event_names_the_staff_user_by_id(
    staff_client: Client, staff: User
) -> None:
    job = enqueue("customers.update_sheet_row", CustomerFactory())
    url = reverse("admin:tombstones_job_act", args=(job.pk, "cancel"))
    response = staff_client.post(url, {"confirm": "yes", "seen_status": "queued"})
    assert response.status_code == 302
    event = JobEvent.objects.get(job=job, event=JobEvent.Event.CANCELLED)
    assert event.worker == f"staff:{staff.pk}"
    html = _page(staff_client, reverse("admin:tombstones_job_change", args=(job.pk,)))
    assert f"staff:{staff.pk}" in html
    assert worker_id() not in html  # not this web server's process
    assert staff.username not in event.worker


def test_rejection_log__counter_reads_n_rejections(staff_client: Client) -> None:
    for _ in range(4):
        customer = CustomerFactory()
        job = enqueue("customers.update_sheet_row", customer)
        customer.delete()
        assert run(job).status == Job.Status.REJECTED
    html = _page(staff_client, reverse("admin:tombstones_rejection_changelist"))
    assert re.search(r"4\s+rejections\b", html)
    assert "rejection log" not in html.replace("Rejection log", "")  # never "4 rejection log"
    assert "<h1>Rejection log</h1>" in html
    index = _page(staff_client, reverse("admin:app_list", args=("tombstones",)))
    assert ">Rejections<" in index


def test_migrations__match_the_models() -> None:
    from django.core.management import call_command

    call_command("makemigrations", "tombstones", check=True, dry_run=True, verbosity=0)
