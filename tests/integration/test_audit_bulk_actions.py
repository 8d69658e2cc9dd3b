"""Staff decisions as changelist actions on the Jobs list: confirmation page, skipped jobs and
why, permissions (an auditor neither sees nor performs them, even with a forged POST)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from tests.factories import CustomerFactory
from tests.jobkit import run
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job, JobEvent

pytestmark = pytest.mark.django_db

PLANTED_NAME = "Zyxwvut Bulkname"
CHANGELIST = "admin:tombstones_job_changelist"


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _queued() -> Job:
    return enqueue("customers.update_sheet_row", CustomerFactory(name=PLANTED_NAME))


def _post(client: Client, action: str, jobs: list[Job], **extra: Any) -> Any:
    data: dict[str, Any] = {
        "action": action,
        ACTION_CHECKBOX_NAME: [str(job.pk) for job in jobs],
        **extra,
    }
    return client.post(reverse(CHANGELIST), data)


def test_bulk__staff_sees_the_decisions_as_changelist_actions(staff: User) -> None:
    _queued()
    html = _client(staff).get(reverse(CHANGELIST)).content.decode()
    for name in ("cancel", "resume", "skip", "resolve_delivered", "resolve_resend"):
        assert f'<option value="{name}">' in html, name
    assert 'name="_selected_action"' in html


def test_bulk__cancel_confirms_then_applies_to_allowed_jobs_and_says_what_it_skipped(
    staff: User,
) -> None:
    client = _client(staff)
    # First: running a job runs every due job.
    done = run(enqueue("customers.update_sheet_row", CustomerFactory()))
    assert done.status == Job.Status.SUCCEEDED
    first, second = _queued(), _queued()

    page = _post(client, "cancel", [first, second, done])
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="bulk-eligible"' in html
    assert f'data-job="{first.pk}"' in html
    assert f'data-job="{second.pk}"' in html
    assert "its status is succeeded" in html
    assert PLANTED_NAME not in html
    # Nothing happened yet.
    assert set(Job.objects.values_list("status", flat=True)) == {"queued", "succeeded"}

    # The confirmation, as the page's form sends it.
    confirm = {f"seen_{job.pk}": "queued" for job in (first, second)}
    response = _post(client, "cancel", [first, second], post="yes", **confirm)
    assert response.status_code == 302
    for job in (first, second):
        job.refresh_from_db()
        assert (job.status, job.reason) == (Job.Status.CANCELLED, Job.Reason.CANCELLED_BY_STAFF)
        event = JobEvent.objects.get(job=job, event=JobEvent.Event.CANCELLED)
        assert event.worker == f"staff:{staff.pk}"
    done.refresh_from_db()
    assert done.status == Job.Status.SUCCEEDED
    message = client.get(reverse(CHANGELIST)).content.decode()
    assert "Cancel: done for 2 job(s)" in message


def test_bulk__a_job_that_changed_after_the_confirmation_page_is_skipped(staff: User) -> None:
    client = _client(staff)
    job, other = _queued(), _queued()
    assert _post(client, "cancel", [job, other]).status_code == 200
    Job.objects.filter(pk=job.pk).update(status=Job.Status.PAUSED)  # a worker acted meanwhile
    confirm = {f"seen_{j.pk}": "queued" for j in (job, other)}
    response = _post(client, "cancel", [job, other], post="yes", **confirm)
    assert response.status_code == 302
    job.refresh_from_db()
    other.refresh_from_db()
    assert job.status == Job.Status.PAUSED
    assert other.status == Job.Status.CANCELLED
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert "done for 1 job(s)" in html
    assert "skipped 1: changed since the confirmation page" in html


def test_bulk__nothing_applicable_says_so_and_offers_no_confirm_button(staff: User) -> None:
    done = run(enqueue("customers.update_sheet_row", CustomerFactory()))
    html = _post(_client(staff), "resume", [done]).content.decode()
    assert 'id="bulk-nothing"' in html
    assert 'id="confirm-bulk-action"' not in html
    assert "its status is succeeded" in html


def test_bulk__auditor_sees_no_actions_and_a_forged_post_changes_nothing(auditor: User) -> None:
    client = _client(auditor)
    job = _queued()
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert 'name="action"' not in html
    assert 'name="_selected_action"' not in html
    for step in ({}, {"post": "yes", f"seen_{job.pk}": "queued"}):
        response = _post(client, "cancel", [job], **step)
        # Django ignores an action the user is not offered: the plain list, or a refusal.
        assert response.status_code in (200, 302, 403)
        assert 'id="bulk-eligible"' not in response.content.decode()
        job.refresh_from_db()
        assert job.status == Job.Status.QUEUED
    assert not job.events.exclude(event="enqueued").exists()


def test_bulk__staff_without_the_permission_cannot_use_that_decision(staff: User) -> None:
    staff.user_permissions.remove(Permission.objects.get(codename="cancel_job"))
    client = _client(staff)
    job = _queued()
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert '<option value="cancel">' not in html
    assert '<option value="resume">' in html
    _post(client, "cancel", [job], post="yes", **{f"seen_{job.pk}": "queued"})
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED


def test_bulk__permission_check_in_the_action_itself(staff: User) -> None:
    """Even called directly (bypassing Django's filtering), the action refuses without the
    permission."""
    from django.contrib import admin
    from django.core.exceptions import PermissionDenied
    from django.test import RequestFactory

    from tombstones.jobs import staff_actions

    staff.user_permissions.remove(Permission.objects.get(codename="cancel_job"))
    staff = User.objects.get(pk=staff.pk)  # drop the permission cache
    request = RequestFactory().post("/")
    request.user = staff
    model_admin = admin.site._registry[Job]
    with pytest.raises(PermissionDenied):
        model_admin.confirm_bulk(request, Job.objects.all(), staff_actions.ACTIONS["cancel"])
