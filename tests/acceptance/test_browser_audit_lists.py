"""Real-browser tests of the audit lists' layout: the rejection log and the event log show their
essential columns inside the list's own box at common screen widths (no sideways scroll).

The browser, the users and the helpers are test_browser.py's.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tests.acceptance.test_browser import (
    CHROMIUM,
    _login,
    _no_horizontal_scroll,
    _race_with_history,
    _shot,
    _staff,
    browser,
)
from tests.factories import CustomerFactory
from tombstones.jobs.enqueue import enqueue
from tombstones.worker import run as run_worker

__all__ = ["browser"]  # the module-scoped fixture, shared with test_browser.py

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not __import__("os").path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing"),
]

# Each list's essential columns: what a row is about, its ids and its time.
ESSENTIAL = {
    "rejection": ("timestamp", "reason_code", "job_link", "record", "expected", "found"),
    "jobevent": ("created", "event_name", "job_link", "record", "reason_code", "expected", "found"),
}


def _inside(inner: dict[str, float] | None, outer: dict[str, float] | None, what: Any) -> None:
    # The table is 100 % of its box: its last column ends at the box's edge, give or take the
    # sub-pixel rounding of the column widths.
    assert inner is not None, what
    assert outer is not None, what
    assert inner["x"] >= outer["x"] - 1, (what, inner, outer)
    assert inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 1, (what, inner, outer)


@pytest.fixture(autouse=True)
def _broker_not_inline(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}


def _rejections() -> None:
    """Both rejection reasons, on long-ish record references, among successes."""
    _race_with_history(jobs=3)  # a generation_changed rejection and three successes
    for _ in range(4):
        customer = CustomerFactory()
        job = enqueue("customers.update_sheet_row", customer)
        customer.delete()
        run_worker(job.pk)


@pytest.mark.parametrize("width", [1280, 1440])
@pytest.mark.parametrize("model", ["rejection", "jobevent"])
def test_browser__rejection_and_event_logs_show_their_columns_without_scrolling(
    browser: Any, live_server: Any, model: str, width: int
) -> None:
    staff = _staff()
    _rejections()
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        _login(page, live_server, staff)
        page.goto(f"{live_server.url}{reverse(f'admin:tombstones_{model}_changelist')}")
        _shot(page, f"13-{model}-list-{width}")
        results = page.locator("#changelist .results")
        box = results.bounding_box()
        for column in ESSENTIAL[model]:
            header = page.locator(f"#result_list th.column-{column}")
            assert header.count() == 1, (model, column)
            _inside(header.bounding_box(), box, (model, width, column))
            cell = page.locator(f"#result_list tbody tr:first-child .field-{column}")
            assert cell.count() == 1, (model, column)
            _inside(cell.bounding_box(), box, (model, width, column))
        # The table itself fits its box: the admin's box would scroll it sideways.
        scroll, client = results.evaluate("el => [el.scrollWidth, el.clientWidth]")
        assert scroll <= client, (model, width, "scrolls sideways", scroll, client)
        _no_horizontal_scroll(page, model)
    finally:
        context.close()
