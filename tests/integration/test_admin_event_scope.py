"""The event log lists stored event rows; a job's page shows its whole trail, part of which its
own row keeps (its enqueue, and a first-claim success's claim, check and success). The log says
so above its rows, and, searched by a job id, how many of that job's events its page shows."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import CustomerFactory
from tests.jobkit import run
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job, JobEvent

pytestmark = pytest.mark.django_db

HANDLER = "customers.update_sheet_row"


def _rows(html: str) -> int:
    body = html.split('id="result_list"')[1].split("</tbody>")[0]
    return len(re.findall(r"<tr[ >]", body.split("<tbody>")[1]))


def _scope(html: str) -> str:
    found = re.search(r'<p class="tg-note tg-scope" id="events-scope">(.*?)</p>', html, re.S)
    assert found is not None, "the event log says nothing about what it leaves out"
    return " ".join(found.group(1).split())


def test_event_log__says_which_events_are_not_rows_and_links_to_the_jobs(
    admin_client: Client,
) -> None:
    done = run(enqueue(HANDLER, CustomerFactory()))
    assert done.status == Job.Status.SUCCEEDED
    trail = [ev.event for ev in done.history()]
    assert len(trail) > JobEvent.objects.filter(job=done).count()  # the gap being explained

    html = admin_client.get(reverse("admin:tombstones_jobevent_changelist")).content.decode()

    scope = _scope(html)
    assert "enqueue" in scope
    assert "claim, check and success of a job that succeeded at its first claim" in scope
    assert f'href="{reverse("admin:tombstones_job_changelist")}"' in scope
    assert 'id="events-scope-job"' not in scope  # no job searched


def test_event_log__searched_by_job_counts_its_trail_and_links_its_page(
    admin_client: Client,
) -> None:
    customer = CustomerFactory()
    done = run(enqueue(HANDLER, customer))
    rejected = enqueue(HANDLER, customer)
    customer.delete()
    rejected = run(rejected)
    url = reverse("admin:tombstones_jobevent_changelist")

    for job in (done, rejected):
        html = admin_client.get(url, {"q": f"#{job.pk}"}).content.decode()
        trail = job.history()
        stored = JobEvent.objects.filter(job=job).count()
        rows = _rows(html) if stored else 0
        assert rows == stored
        scope = _scope(html)
        page = reverse("admin:tombstones_job_change", args=(job.pk,))
        assert (
            f'The <a href="{page}">page of job {job.pk}</a> shows all {len(trail)} of its events; '
            f"{stored} of them are stored rows."
        ) in scope
    # The job page shows that many events, one row each.
    page = admin_client.get(reverse("admin:tombstones_job_change", args=(done.pk,)))
    table = page.content.decode().split('id="job-events"')[1].split("</tbody>")[0]
    assert len(re.findall(r"<tr>", table)) - 1 == len(done.history())  # minus the header row


def test_event_log__events_that_end_in_a_status_show_its_badge(admin_client: Client) -> None:
    customer = CustomerFactory()
    job = enqueue(HANDLER, customer)
    customer.delete()
    run(job)
    html = admin_client.get(reverse("admin:tombstones_jobevent_changelist")).content.decode()
    assert 'class="tg-status tg-status--rejected" data-status="rejected" data-shape="cross"' in html
