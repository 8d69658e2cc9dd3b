"""Real-browser layout checks of every admin page at 1280 and 1440 px: the dashboard, the job
list and a job's page, the event log, the rejection log, the customer list and its delete.

On each page: nothing scrolls sideways; the title and its subtitle (the rejection log's
retention, the event log's note on what it lists) sit above the buttons, not under them; each
status badge shows a coloured shape and a word on a readable background. Screenshots go to
artifacts/screenshots/ (``20-*``). The browser, the users and the helpers are test_browser.py's.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from project.customers.models import Customer
from tests.acceptance.test_browser import (
    CHROMIUM,
    PLANTED_EMAIL,
    PLANTED_NAME,
    _auditor,
    _boxes_overlap,
    _login,
    _no_horizontal_scroll,
    _race_with_history,
    _shot,
    _staff,
    browser,
)
from tests.factories import CustomerFactory
from tombstones.admin.statuses import STATUS_STYLES
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job
from tombstones.worker import run as run_worker

__all__ = ["browser"]  # the module-scoped fixture, shared with test_browser.py

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not __import__("os").path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing"),
]

WIDTHS = (1280, 1440)


@pytest.fixture(autouse=True)
def _broker_not_inline(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}


def _jobs_of_every_kind() -> Job:
    """Successes, rejections (both reasons), a queued job and an uncertain one; returns the
    uncertain one (its page has the most buttons)."""
    _record, jobs = _race_with_history(jobs=3)
    for job in jobs[1:]:
        run_worker(job.pk)
    for _ in range(2):
        customer = CustomerFactory()
        job = enqueue("customers.update_sheet_row", customer)
        customer.delete()
        run_worker(job.pk)
    enqueue("customers.update_sheet_row", CustomerFactory())
    uncertain = enqueue("customers.update_sheet_row", CustomerFactory())
    Job.objects.filter(pk=uncertain.pk).update(
        status=Job.Status.UNCERTAIN, reason=Job.Reason.OUTCOME_UNKNOWN
    )
    return uncertain


def _context(browser: Any, width: int) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    return context


# The title and subtitle: children of #content up to Django 6.0, of its .titles box (beside the
# buttons, in one row) from Django 6.1.
TITLE = "#content > h1, #content .titles > h1"
SUBTITLE = "#content > h2, #content .titles > h2"


def _heading_above_the_buttons(page: Any, what: str) -> None:
    """The title, and the subtitle or note under it, overlap no button, and a text that shares
    a button's columns ends above it: Django 5.2 floats the buttons up beside the title, where
    they covered the subtitle (Django 6.1 sets them beside the titles, in a row of their own)."""
    tools = page.locator("#content .object-tools a")
    texts = [page.locator(TITLE).first]
    for selector in (SUBTITLE, "#events-scope"):
        if page.locator(selector).count():
            texts.append(page.locator(selector).first)
    boxes = [t.bounding_box() for t in texts]
    assert all(box is not None for box in boxes), what
    for i in range(tools.count()):
        tool = tools.nth(i).bounding_box()
        assert tool is not None, what
        for box in boxes:
            assert not _boxes_overlap(tool, box), (what, tools.nth(i).inner_text(), tool, box)
            shares_columns = (
                box["x"] < tool["x"] + tool["width"] and tool["x"] < box["x"] + box["width"]
            )
            if shares_columns:
                assert box["y"] + box["height"] <= tool["y"] + 1, (what, "text under a button")


def _badges_read_without_colour(page: Any, what: str, at_least: int) -> int:
    """Each status badge: a shape drawn in its status's colour, a word, a white background
    with a visible border; returns how many there are."""
    found = page.evaluate(
        """() => [...document.querySelectorAll('.tg-status')].map(el => {
            const path = el.querySelector('svg.tg-status-icon path');
            const word = el.querySelector('.tg-status-text');
            const style = getComputedStyle(el);
            const icon = el.querySelector('svg.tg-status-icon');
            const box = icon ? icon.getBoundingClientRect() : null;
            return {
              status: el.dataset.status, shape: el.dataset.shape,
              paint: path ? (path.getAttribute('fill') !== 'none'
                  ? path.getAttribute('fill') : path.getAttribute('stroke')) : null,
              word: word ? word.innerText.trim() : '',
              colour: style.color, background: style.backgroundColor,
              border: style.borderTopStyle + ' ' + style.borderTopWidth,
              iconSize: box ? [box.width, box.height] : null,
            };
        })"""
    )
    assert len(found) >= at_least, (what, len(found))
    for badge in found:
        style = STATUS_STYLES[badge["status"]]
        assert badge["paint"] == style.colour, (what, badge)
        assert badge["shape"] == style.shape, (what, badge)
        assert badge["word"], (what, badge)
        assert badge["background"] == "rgb(255, 255, 255)", (what, badge)
        assert badge["colour"] == "rgb(31, 31, 31)", (what, badge)  # 16:1 on the white
        assert badge["border"] == "solid 1px", (what, badge)
        assert badge["iconSize"] == [12, 12], (what, badge)  # drawn, not collapsed
    return len(found)


@pytest.mark.parametrize("width", WIDTHS)
def test_browser_layout__audit_pages_at_common_widths(
    browser: Any, live_server: Any, width: int
) -> None:
    staff = _staff()
    uncertain = _jobs_of_every_kind()
    rejections = reverse("admin:tombstones_rejection_changelist")
    pages = {
        "dashboard": (reverse("admin:tombstones_job_dashboard"), 12),
        "jobs-list": (reverse("admin:tombstones_job_changelist"), 5),
        "job-page": (reverse("admin:tombstones_job_change", args=(uncertain.pk,)), 1),
        "events-list": (reverse("admin:tombstones_jobevent_changelist"), 1),
        "rejection-log": (rejections, 3),
    }
    context = _context(browser, width)
    page = context.new_page()
    try:
        _login(page, live_server, staff)
        for name, (url, badges) in pages.items():
            page.goto(f"{live_server.url}{url}")
            _shot(page, f"20-{name}-{width}")
            _no_horizontal_scroll(page, f"{name} {width}")
            _heading_above_the_buttons(page, (name, width))
            _badges_read_without_colour(page, (name, width), badges)
        # The rejection log's subtitle is its retention, and it reads above the buttons.
        page.goto(f"{live_server.url}{rejections}")
        assert "Rejections are kept for" in page.locator(SUBTITLE).first.inner_text()
        assert page.locator("#rejection-export").is_visible()
        # The event log says what it does not list, and links to the jobs.
        page.goto(f"{live_server.url}{reverse('admin:tombstones_jobevent_changelist')}")
        scope = page.locator("#events-scope")
        assert "Not listed here" in scope.inner_text()
        assert scope.locator("a").get_attribute("href") == reverse(
            "admin:tombstones_job_changelist"
        )
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_browser_layout__customer_list_and_delete_at_common_widths(
    browser: Any, live_server: Any, width: int
) -> None:
    staff = _staff()
    for _ in range(3):
        CustomerFactory()
    customer = CustomerFactory(name=PLANTED_NAME, email=PLANTED_EMAIL)
    enqueue("customers.update_sheet_row", customer)
    context = _context(browser, width)
    page = context.new_page()
    try:
        _login(page, live_server, staff)
        changelist = reverse("admin:customers_customer_changelist")
        page.goto(f"{live_server.url}{changelist}")
        _shot(page, f"20-customer-list-{width}")
        _no_horizontal_scroll(page, f"customer list {width}")
        # Four live customers: Django's counter does not say "(5 total)" of a list of four.
        assert page.locator("#changelist-search .small.quiet").count() == 0

        page.goto(
            f"{live_server.url}{reverse('admin:customers_customer_delete', args=(customer.pk,))}"
        )
        _shot(page, f"20-customer-delete-{width}")
        _no_horizontal_scroll(page, f"customer delete {width}")
        page.click("#content form input[type=submit]")
        message = page.locator(".messagelist li.success")
        message.wait_for()
        text = message.inner_text()
        assert text.startswith(f"The customer with ID {customer.pk} is now a tombstone.")
        assert "jobs are fenced" in text
        assert "deleted successfully" not in text
        assert PLANTED_NAME not in page.content()
        _shot(page, f"20-customer-deleted-{width}")
        _no_horizontal_scroll(page, f"customer list after delete {width}")
        # Three live customers and a tombstone: the live list's counter does not read
        # "3 results (4 total)" (its "total" link opens the same three).
        assert page.locator("#changelist-search .small.quiet").count() == 0
        assert page.locator("#result_list tbody tr").count() == 3
        assert Customer.all_objects.get(pk=customer.pk).deleted_at is not None
    finally:
        context.close()


def test_browser_layout__auditor_sees_the_same_layout(browser: Any, live_server: Any) -> None:
    """The auditor's pages (no staff buttons): the rejection log's subtitle still above its
    buttons at the narrower width."""
    auditor = _auditor()
    _jobs_of_every_kind()
    context = _context(browser, WIDTHS[0])
    page = context.new_page()
    try:
        _login(page, live_server, auditor)
        for name in ("rejection", "jobevent", "job"):
            page.goto(f"{live_server.url}{reverse(f'admin:tombstones_{name}_changelist')}")
            _shot(page, f"20-auditor-{name}-list-{WIDTHS[0]}")
            _no_horizontal_scroll(page, name)
            _heading_above_the_buttons(page, name)
            _badges_read_without_colour(page, name, 1)
    finally:
        context.close()
