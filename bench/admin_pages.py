"""How long the audit pages take on a large ledger: each page fetched through Django's test
client (the whole view, template included), median of ``--repeat`` fetches after one warm-up.

    .venv/bin/python bench/admin_pages.py --pg-url postgres://postgres@127.0.0.1:5432/bench_ledger_full

Run it against a database that bench/ledger_scale.py seeded (never a test database). It adds a
superuser and one customer whose pk is one of the seeded records (so its change page and
timeline list that record's seeded jobs), and prints a JSON line per page and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

RECORD_PK = 12345  # a seeded record: bench/ledger.py spreads jobs over pks 0..49,999


def _body(response: Any) -> bytes:
    """The whole body: a streamed one (the CSV export) read to its end, as a browser would."""
    if response.streaming:
        return b"".join(response.streaming_content)
    return response.content


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/bench_ledger_full")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--full-export",
        action="store_true",
        help="also the rejection log's whole CSV export (every rejection: seconds at 10 M)",
    )
    args = parser.parse_args()
    if args.pg_url.rsplit("/", 1)[-1].startswith("test"):
        raise SystemExit("refusing a test database")
    os.environ["DATABASE_URL"] = args.pg_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

    import django

    django.setup()
    from django.conf import settings

    settings.ALLOWED_HOSTS = ["*"]
    from django.contrib.auth.models import User
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection
    from django.test import Client
    from django.urls import reverse
    from django.utils import timezone

    from project.customers.models import Customer
    from tombstones.models import Job

    user = User.objects.filter(username="bench-admin").first() or User.objects.create_superuser(
        "bench-admin", "bench@example.invalid", "x"
    )
    customer = Customer.all_objects.filter(pk=RECORD_PK).first()
    if customer is None:
        customer = Customer.objects.create(
            pk=RECORD_PK, reference="BENCH-12345", name="Bench", email="bench@example.invalid"
        )
    ct = ContentType.objects.get_for_model(Customer)
    client = Client()
    client.force_login(user)
    jobs = reverse("admin:tombstones_job_changelist")
    rejections = reverse("admin:tombstones_rejection_changelist")
    events = reverse("admin:tombstones_jobevent_changelist")
    export = reverse("admin:tombstones_rejection_export")
    today = timezone.localdate()
    week = f"created_at__gte={today - timedelta(days=7)}&created_at__lt={today + timedelta(days=1)}"
    day = f"created_at__gte={today - timedelta(days=1)}&created_at__lt={today}"
    pages = {
        "Jobs list": jobs,
        "Jobs list filtered by status (failed)": f"{jobs}?status__exact=failed",
        "Jobs list filtered by status (succeeded)": f"{jobs}?status__exact=succeeded",
        "Jobs list filtered by reason (handler_error)": f"{jobs}?reason__exact=handler_error",
        "Jobs list filtered by handler": f"{jobs}?handler=bench.touch",
        "Jobs list filtered by date (last 7 days)": f"{jobs}?{week}",
        "Rejection log": rejections,
        "Rejection log filtered by reason": f"{rejections}?reason__exact=source_deleted",
        "Rejection log filtered by date (yesterday)": f"{rejections}?{day}",
        "Rejection log CSV export (yesterday)": f"{export}?{day}",
        "Job events": events,
        "Job events filtered by event (rejected)": f"{events}?event__exact=rejected",
        "Dashboard": reverse("admin:tombstones_dashboard_changelist"),
        "Record timeline": reverse("admin:tombstones_job_timeline", args=(ct.pk, RECORD_PK)),
        "Record change page": reverse("admin:customers_customer_change", args=(RECORD_PK,)),
    }
    if args.full_export:
        pages["Rejection log CSV export (all)"] = export
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'tombstones_job'")
        ledger = cursor.fetchone()[0]
    rows = []
    for name, url in pages.items():
        response = client.get(url, follow=True)  # warm-up (and a check that the page works)
        if response.redirect_chain:
            url = response.redirect_chain[-1][0]
        if response.status_code != 200:
            raise SystemExit(f"{name}: {url} answered {response.status_code}")
        _body(response)
        times, firsts = [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            answer = client.get(url)
            if answer.streaming:  # when its first bytes were ready
                chunks = iter(cast(Any, answer).streaming_content)
                head = next(chunks, b"")
                firsts.append((time.perf_counter() - started) * 1000)
                body = head + b"".join(chunks)
            else:
                body = answer.content
            times.append((time.perf_counter() - started) * 1000)
        row = {
            "page": name,
            "ms": round(statistics.median(times), 1),
            "max_ms": round(max(times)),
            "bytes": len(body),
        }
        if firsts:
            row["first_bytes_ms"] = round(statistics.median(firsts), 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\nledger: ~{ledger:,} jobs ({Job.objects.filter(owner='seed').exists() and 'seeded'})")
    print("| page | median ms | max ms |\n|---|---:|---:|")
    for row in rows:
        print(f"| {row['page']} | {row['ms']} | {row['max_ms']} |")


if __name__ == "__main__":
    main()
