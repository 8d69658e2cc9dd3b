"""Job statuses read with and without colour: each status has one colour (contrast 4.5:1 on
white or more) and one shape of its own, from one table (:mod:`tombstones.admin.statuses`), and
every page that shows a status shows its badge: shape, colour and word."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import CustomerFactory
from tests.jobkit import run
from tombstones.admin import dashboard, statuses, timeline_svg
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job

pytestmark = pytest.mark.django_db

Status = Job.Status
HANDLER = "customers.update_sheet_row"
BADGE = re.compile(
    r'<span class="tg-status tg-status--(?P<status>[a-z_]+)" data-status="(?P=status)" '
    r'data-shape="(?P<shape>[a-z-]+)"><svg class="tg-status-icon"[^>]*><path d="[^"]+" '
    r'(?:fill|fill="none" stroke)="(?P<colour>#[0-9a-f]{6})"'
)


def _luminance(colour: str) -> float:
    def channel(value: int) -> float:
        c = value / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast_on_white(colour: str) -> float:
    return (1.0 + 0.05) / (_luminance(colour) + 0.05)


def test_styles__every_status_has_a_readable_colour_and_a_shape_of_its_own() -> None:
    assert set(statuses.STATUS_STYLES) == set(Status.values)
    for status, style in statuses.STATUS_STYLES.items():
        assert contrast_on_white(style.colour) >= 4.5, (status, style.colour)
    shapes = [style.shape for style in statuses.STATUS_STYLES.values()]
    paths = [style.path for style in statuses.STATUS_STYLES.values()]
    assert len(set(shapes)) == len(shapes)  # read without colour: no two alike
    assert len(set(paths)) == len(paths)
    # One table: the timeline and the charts read the same colours.
    assert timeline_svg.STATUS_COLOURS is statuses.STATUS_COLOURS
    assert dashboard.STATUS_COLOURS is statuses.STATUS_COLOURS


def test_badge__shape_colour_and_word() -> None:
    html = statuses.status_badge(Status.REJECTED)
    found = BADGE.search(html)
    assert found is not None, html
    assert found["status"] == "rejected"
    assert found["shape"] == "cross"
    assert found["colour"] == statuses.STATUS_COLOURS[Status.REJECTED]
    assert ">Rejected</span></span>" in html  # the word, after the shape
    assert 'aria-hidden="true"' in html  # the shape is not read out: the word is


def _badges(html: str) -> dict[str, tuple[str, str]]:
    return {m["status"]: (m["shape"], m["colour"]) for m in BADGE.finditer(html)}


def test_pages__job_list_job_page_rejection_log_and_dashboard_show_badges(
    admin_client: Client,
) -> None:
    done = run(enqueue(HANDLER, CustomerFactory()))
    gone = CustomerFactory()
    rejected = enqueue(HANDLER, gone)
    gone.delete()
    rejected = run(rejected)
    queued = enqueue(HANDLER, CustomerFactory())
    assert (done.status, rejected.status) == (Status.SUCCEEDED, Status.REJECTED)
    expected = {s: (statuses.STATUS_STYLES[s].shape, statuses.STATUS_COLOURS[s]) for s in Status}

    jobs = admin_client.get(reverse("admin:tombstones_job_changelist")).content.decode()
    for status in (Status.SUCCEEDED, Status.REJECTED, Status.QUEUED):
        assert _badges(jobs)[status] == expected[status]

    page = admin_client.get(reverse("admin:tombstones_job_change", args=(queued.pk,)))
    assert _badges(page.content.decode()) == {Status.QUEUED: expected[Status.QUEUED]}

    log = admin_client.get(reverse("admin:tombstones_rejection_changelist")).content.decode()
    assert _badges(log) == {Status.REJECTED: expected[Status.REJECTED]}
    assert ">source_deleted</span></span>" in log  # the reason is the badge's word

    board = admin_client.get(reverse("admin:tombstones_job_dashboard")).content.decode()
    cards = board.split('id="status-counts"')[1].split("</div>\n  </div>")[0]
    assert _badges(cards) == expected  # every status's card, zeros included
    waiting = board.split('id="waiting-jobs"')[1].split("</table>")[0]
    assert _badges(waiting) == {Status.QUEUED: expected[Status.QUEUED]}
