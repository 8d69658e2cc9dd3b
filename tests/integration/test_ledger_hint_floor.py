"""A pinned horizon (a long transaction open while jobs finish) does not make the claim step
over every hint cleared meanwhile: a worker scans the hints from its floor (issue 35), and a hint
below the floor still runs: at once when the claim finds nothing above it, within a second when
the worker is busy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.models import F
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

import tombstones
from tests.factories import CustomerFactory
from tests.jobkit import seed_queued, temp_handler
from tombstones.jobs import ledger
from tombstones.jobs.ledger import hint_floor
from tombstones.models import Job

Status = Job.Status
CLEARED = 20_000  # hints cleared under the pin: jobs claimed and finished in the last hour


def _touch(ctx: Any) -> None:
    ctx.update(phone=f"+{ctx.job.pk}")


@pytest.fixture
def touch(settings: Any) -> Iterator[None]:
    settings.TOMBSTONES_Q_OPTIONS = {}  # nothing runs until the test claims
    with temp_handler("t.touch", _touch):
        yield


def _taken(claim: ledger.Claim | None) -> list[int]:
    return [] if claim is None else [j.pk for j in claim.jobs]


def _hint_scans(queries: list[dict[str, Any]]) -> list[str]:
    """The claim's scans of the hints (those that came due, oldest first, a LIMIT)."""
    due = '"tombstones_job"."ready_at" <= (STATEMENT_TIMESTAMP())'
    return [q["sql"] for q in queries if q["sql"].startswith("SELECT") and due in q["sql"]]


def _blocks(sql: str) -> int:
    """Index and table pages the statement reads (hit or read), run again under EXPLAIN."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        (raw,) = cursor.fetchone()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def test_pinned_horizon__the_claim_does_not_step_over_the_hints_cleared_under_the_pin(
    transactional_db: None, touch: None, postgres_only: None
) -> None:
    seed_queued(
        CLEARED, prefix="old", hinted_at="NOW() - INTERVAL '1 hour' + g * INTERVAL '100 ms'"
    )
    settings = connection.settings_dict
    pin = psycopg.connect(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        user=settings["USER"] or None,
        dbname=settings["NAME"],
        autocommit=False,
    )
    try:
        pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT count(*) FROM tombstones_job").fetchone()  # the snapshot: pinned
        # The hour's jobs were claimed and finished: their hints cleared, under the pin.
        Job.objects.filter(lane__startswith="old:").update(
            status=Status.SUCCEEDED, ready_at=None, finished_at=F("queued_at")
        )
        with connection.cursor() as cursor:
            cursor.execute("VACUUM tombstones_job")  # what it may remove: nothing
        fresh = [tombstones.enqueue("t.touch", c) for c in CustomerFactory.create_batch(3)]

        first = ledger.claim(1, using="default")  # from the first hint: it sets the floor
        assert _taken(first) == [fresh[0].pk]
        with CaptureQueriesContext(connection) as captured:
            second = ledger.claim(1, using="default")
        assert _taken(second) == [fresh[1].pk]

        (scan,) = _hint_scans(captured.captured_queries)
        whole = Job.objects.hinted().values_list("lane", "id", "ready_at", "status")[:4]
        from_first = _blocks(_sql(whole))
        assert from_first > 40, f"the pin left {from_first} pages of cleared hints? (test setup)"
        assert _blocks(scan) <= 6, f"the claim's scan read {_blocks(scan)} pages"
    finally:
        pin.close()


def _sql(qs: Any) -> str:
    """The statement of a queryset with its parameters in it, as PostgreSQL runs it."""
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cursor:
        return cursor.mogrify(sql, params)  # type: ignore[no-any-return]


@pytest.mark.parametrize("workers", [1, 2])
def test_floor__a_hint_written_below_it_runs_when_the_scan_finds_nothing_above(
    db: None, touch: None, workers: int
) -> None:
    first = tombstones.enqueue("t.touch", CustomerFactory())
    taken = ledger.claim(5, workers=workers, using="default")
    assert _taken(taken) == [first.pk]
    assert hint_floor.current(("default", ("default",))) is not None
    # A hint older than the floor, committed after the scan (a long transaction's enqueue).
    late = tombstones.enqueue("t.touch", CustomerFactory())
    Job.objects.filter(pk=late.pk).update(ready_at=F("ready_at") - timedelta(hours=1))

    again = ledger.claim(5, workers=workers, using="default")
    assert _taken(again) == [late.pk]


def test_floor__after_a_claim_that_takes_nothing_above_it_the_next_looks_from_the_first_hint(
    db: None, touch: None
) -> None:
    """Above the floor, only the hint of a lane its running head holds; below it, a hint that
    committed late. The claim looks at the held lane and takes nothing (clearing that hint); the
    next claim (a pump's look once more before it stops) finds nothing above the floor and
    takes the late job."""
    from tests.jobkit import claim

    first = tombstones.enqueue("t.touch", CustomerFactory())
    assert _taken(ledger.claim(5, using="default")) == [first.pk]  # the floor is set
    customer = CustomerFactory()
    running = tombstones.enqueue("t.touch", customer)
    behind = tombstones.enqueue("t.touch", customer)
    claim(running)
    # A hint on the held lane, above the floor (as a change of the lane's jobs leaves one).
    Job.objects.filter(pk=behind.pk).update(ready_at=Now())
    late = tombstones.enqueue("t.touch", CustomerFactory())
    Job.objects.filter(pk=late.pk).update(ready_at=F("ready_at") - timedelta(hours=1))

    assert ledger.claim(5, using="default") is None
    assert _taken(ledger.claim(5, using="default")) == [late.pk]


def test_floor__a_busy_worker_reads_from_the_first_hint_within_a_second(
    db: None, touch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(hint_floor, "monotonic", lambda: now[0])
    first = tombstones.enqueue("t.touch", CustomerFactory())
    taken = ledger.claim(5, using="default")
    assert _taken(taken) == [first.pk]
    late = tombstones.enqueue("t.touch", CustomerFactory())
    Job.objects.filter(pk=late.pk).update(ready_at=F("ready_at") - timedelta(hours=1))
    busy = tombstones.enqueue("t.touch", CustomerFactory())

    now[0] += hint_floor.WHOLE_EVERY / 2
    above = ledger.claim(5, using="default")
    assert _taken(above) == [busy.pk]  # the floor holds

    now[0] += hint_floor.WHOLE_EVERY / 2
    whole = ledger.claim(5, using="default")
    assert _taken(whole) == [late.pk]
