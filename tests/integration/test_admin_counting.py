"""The audit lists at scale: counts that stop at a cap (and estimate past it on PostgreSQL),
filter choices and date-hierarchy dates read by skip scans, never a scan of the whole ledger."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import tombstones
from bench.ledger import seed_finished
from project.customers.models import Customer
from tests.factories import CustomerFactory, SheetRowFactory
from tombstones.admin import counting
from tombstones.models import Job

pytestmark = pytest.mark.django_db


def test_count__exact_under_the_cap_estimated_past_it(
    postgres_only: None, monkeypatch: Any
) -> None:
    seed_finished(3000, events=False)
    monkeypatch.setattr(counting, "COUNT_CAP", 1000)
    small = counting.LedgerPaginator(Job.objects.filter(status="failed"), 50)
    assert small.count == Job.objects.filter(status="failed").count()  # 90 of them: exact
    big = counting.LedgerPaginator(Job.objects.order_by("-id"), 50)
    with CaptureQueriesContext(connection) as queries:
        estimated = big.count
    assert 1000 < estimated <= 6000  # the planner's, not a count of every row
    assert not any(
        q["sql"].startswith('SELECT COUNT(*) AS "__count" FROM "tombstones_job"')
        for q in queries.captured_queries
    )
    assert any("LIMIT 1001" in q["sql"] for q in queries.captured_queries)


def test_distinct_values__by_skip_scan() -> None:
    customer = SheetRowFactory().customer
    tombstones.enqueue("customers.update_sheet_row", customer)
    tombstones.enqueue("customers.send_welcome", customer)
    tombstones.enqueue("customers.update_sheet_row", customer)
    assert counting.distinct_values(Job, "handler") == [
        "customers.send_welcome",
        "customers.update_sheet_row",
    ]


def test_date_hierarchy__dates_read_by_probes() -> None:
    seed_finished(200, events=False)
    qs = counting.with_probed_dates(Job.objects.all())
    for kind in ("year", "month", "day"):
        expected = list(Job.objects.datetimes("created_at", kind))
        with CaptureQueriesContext(connection) as queries:
            found = qs.datetimes("created_at", kind)
        assert found == expected
        assert len(queries.captured_queries) == len(found) + 1  # one probe per moment, one last
        assert not any("DISTINCT" in q["sql"] for q in queries.captured_queries)


def test_jobs_list__pages_use_them(admin_client: Any) -> None:
    customer = SheetRowFactory().customer
    tombstones.enqueue("customers.update_sheet_row", customer)
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(reverse("admin:tombstones_job_changelist"))
    assert page.status_code == 200
    assert "customers.update_sheet_row" in page.content.decode()
    sqls = [q["sql"] for q in queries.captured_queries]
    assert not any("DISTINCT" in sql and "tombstones_job" in sql for sql in sqls)
    assert any("WITH RECURSIVE" in sql for sql in sqls)  # the handler filter's skip scan
    # A month's days: one probe each.
    now = timezone.localtime()
    url = reverse("admin:tombstones_job_changelist")
    page = admin_client.get(f"{url}?created_at__year={now.year}&created_at__month={now.month}")
    assert page.status_code == 200
    assert f"created_at__day={now.day}" in page.content.decode()


def _counter(html: str) -> str | None:
    """The search bar's "4 results (5 total)", spaces collapsed; None when Django shows none."""
    found = re.search(r'<span class="small quiet">(.*?)</span>', html, re.S)
    return None if found is None else re.sub(r"<[^>]+>", "", " ".join(found.group(1).split()))


def test_record_list__total_counts_the_list_its_link_opens(admin_client: Any) -> None:
    live = [CustomerFactory(reference=f"C-77{i}") for i in range(4)]
    CustomerFactory(reference="C-7799").delete()  # a tombstone: not in the live list
    url = reverse("admin:customers_customer_changelist")

    # The live list (the default) is the whole of what "total" opens: no "4 results (5 total)".
    default = admin_client.get(url)
    assert default.context["cl"].result_count == 4
    assert default.context["cl"].full_result_count == 4
    assert _counter(default.content.decode()) is None
    # A search narrows it: its total is the live records, which its link (no parameters) lists.
    searched = admin_client.get(url, {"q": live[0].reference})
    assert _counter(searched.content.decode()) == "1 result (4 total)"
    assert Customer.objects.count() == 4
    # The tombstones are counted in their own list.
    tombs = admin_client.get(url, {"records": "tombstones"})
    assert tombs.context["cl"].result_count == 1
