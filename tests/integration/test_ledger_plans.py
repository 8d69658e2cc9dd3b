"""The engine does not pay for finished rows: with a ledger full of finished jobs, every
statement of the claim, the outcome and the sweep reads the job table through an index on
unfinished jobs (or the primary key), and never scans the job or event table (PostgreSQL's
plans, after ANALYZE, as autovacuum keeps them)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

import tombstones
from bench.ledger import seed_finished
from project.customers.models import Customer
from tests.factories import SheetRowFactory
from tests.jobkit import run, seed_queued
from tombstones.jobs.engine.sweep import sweep

pytestmark = pytest.mark.django_db

LEDGER = 200_000
TABLES = re.compile(r'"?tombstones_job(event)?"?', re.I)
SEQ_SCAN = re.compile(r"Seq Scan on (tombstones_job(?:event)?)\b")
INDEX = re.compile(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan) (?:using |on )(\w+)")
# The job table's indexes over unfinished jobs only, its primary key, and the indexes over the
# few rows that carry a hint or a claim's token (a finished job leaves them within a moment).
UNFINISHED_ONLY = {
    "tombstones_job_pkey",
    "tombstones_job_lane_place",
    "tombstones_job_one_running_per_lane",
    "tombstones_job_hint",
    "tombstones_job_hint_lane",
    "tombstones_job_held",
    "tombstones_job_paused",
    "tombstones_job_priority",
}


def job_indexes() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'tombstones_job'")
        return {name for (name,) in cursor.fetchall()}


def plans(queries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(statement, plan) of every statement that reads or writes the job or event table."""
    found = []
    with connection.cursor() as cursor:
        for query in queries:
            sql = query["sql"]
            verb = sql.lstrip().split(None, 1)[0].upper()
            if verb not in ("SELECT", "UPDATE", "DELETE", "WITH") or not TABLES.search(sql):
                continue
            cursor.execute("EXPLAIN " + sql)
            found.append((sql, "\n".join(row[0] for row in cursor.fetchall())))
    return found


def test_plans__claim_outcome_and_sweep_use_indexes_on_a_full_ledger(postgres_only: None) -> None:
    seed_finished(LEDGER)
    customers = [SheetRowFactory().customer for _ in range(3)]
    jobs = [tombstones.enqueue("customers.update_sheet_row", c) for c in customers]
    Customer.objects.get(pk=customers[1].pk).delete()  # one rejection among them
    with CaptureQueriesContext(connection) as captured:
        run(jobs[0])  # claims every due head: the claim, the checks, the outcomes
        sweep()
    checked = plans(captured.captured_queries)
    assert len(checked) >= 5, "the engine ran no statement on the job table?"
    scans = [(SEQ_SCAN.findall(plan), sql) for sql, plan in checked if SEQ_SCAN.search(plan)]
    assert scans == [], "\n\n".join(f"{tables}: {sql[:400]}" for tables, sql in scans)
    assert job_indexes() >= UNFINISHED_ONLY
    others = job_indexes() - UNFINISHED_ONLY
    wide = [
        (sorted(used), sql) for sql, plan in checked if (used := set(INDEX.findall(plan)) & others)
    ]
    assert wide == [], "\n\n".join(f"{used}: {sql[:400]}" for used, sql in wide)


def _savepoint() -> Any:
    """A savepoint to roll back to (Django 6.1 renamed transaction.savepoint())."""
    from django.db import transaction

    make = getattr(transaction, "savepoint_create", None) or transaction.savepoint
    return make()


BACKLOG = 30_000
# Rows a statement may read from the job table with BACKLOG queued jobs waiting: the work in
# hand (a claim's lanes, a lapsed claim, a paused job), never the backlog.
READ_AT_MOST = 1_000


def rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of the job table read (returned or filtered out, every loop)."""
    found = 0
    if plan.get("Relation Name") == "tombstones_job":
        loops = int(plan.get("Actual Loops", 1))
        kept = int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
        found += kept * max(loops, 1)
    for child in plan.get("Plans", []):
        found += rows_read(child)
    return found


def rows_read_by(statements: list[str]) -> list[tuple[int, str]]:
    """Rows each statement reads from the job table (run under EXPLAIN ANALYZE, each rolled
    back to a savepoint: as the state was before it), with its start."""
    from django.db import transaction

    read = []
    with connection.cursor() as cursor:
        for sql in statements:
            undo = _savepoint()
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            (plan,) = cursor.fetchone()[0]
            transaction.savepoint_rollback(undo)
            read.append((rows_read(plan["Plan"]), sql[:300]))
    return read


def test_plans__timers_sweep_and_take_back_read_the_work_not_the_backlog(
    postgres_only: None,
) -> None:
    """With 30,000 queued jobs waiting, the timers' next-due question, the sweep (a paused job
    to resume) and the take-back of a dead claim (two jobs) read a few rows each: each of them
    read the whole backlog (a MIN over an expression, a paused job found by a table scan, a
    correlated lookup the held-jobs index could not serve, once per lapsed job)."""
    from django.db import transaction

    from tombstones.models import Job

    seed_queued(BACKLOG)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tombstones_job SET status = 'paused', ready_at = NULL WHERE lane = 'backlog:7'"
        )
        cursor.execute(
            "UPDATE tombstones_job SET status = 'running', claim_token = 'dead', owner = 'gone', "
            "attempts = 1, started_at = now(), ready_at = NULL, "
            "lease_expires_at = now() - interval '1 minute' "
            "WHERE lane IN ('backlog:8', 'backlog:9')"
        )
        cursor.execute("ANALYZE tombstones_job")
    undo = _savepoint()
    with CaptureQueriesContext(connection) as captured:
        assert Job.objects.next_due_in() is not None
        counts = sweep(dispatch=False)
    transaction.savepoint_rollback(undo)
    assert (counts["requeued"], counts["resumed"]) == (2, 1)  # it did the work
    read = rows_read_by(
        [
            q["sql"]
            for q in captured.captured_queries
            if q["sql"].lstrip().split(None, 1)[0].upper() in ("SELECT", "UPDATE", "DELETE", "WITH")
            and TABLES.search(q["sql"])
        ]
    )
    assert len(read) >= 5, read
    assert [r for r in read if r[0] > READ_AT_MOST] == [], read


def test_plans__a_claim_finds_its_jobs_by_id_before_any_statistics(postgres_only: None) -> None:
    """A backlog queued since the last ANALYZE (after a drain, a burst): the claim's statements
    that name their jobs by id (lock, take, settle the hints) look them up by primary key,
    whatever the planner believes of the table. Joined to an unnest of ids, the take and the
    hints' UPDATE scanned the whole table once per claim (seen in a 20,000-job drain: 45 scans a
    second of 20,000 rows each, half the drain's speed)."""

    from tombstones.jobs import ledger

    # The statistics of a drained ledger (every job finished), emptied (as the bench does
    # between runs), then a backlog queued since: the planner believes the table is small and
    # that no job is queued.
    seed_queued(2_000, prefix="drained")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tombstones_job SET status = 'succeeded', ready_at = NULL")
        cursor.execute("ANALYZE tombstones_job")
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # (no pending deferred checks)
        cursor.execute("TRUNCATE tombstones_job, tombstones_jobevent RESTART IDENTITY CASCADE")
    seed_queued(BACKLOG)
    with CaptureQueriesContext(connection) as captured:
        taken = ledger.claim(20, whole=True)
    assert taken is not None
    assert len(taken.jobs) == 20
    named = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].startswith(("SELECT j.id", "UPDATE")) and TABLES.search(q["sql"])
    ]
    assert len(named) >= 2, named  # the lock and the take (settling hints: none left here)
    read = rows_read_by(named)
    # (An index scan with no index condition reads the whole index: as bad as a table scan.)
    assert [r for r in read if r[0] > READ_AT_MOST] == [], read


def test_plans__a_claim_from_its_floor_reads_the_first_hints_not_the_backlog(
    postgres_only: None,
) -> None:
    """A worker's scans of the hints start at its floor (issue 35). Written ``ready_at >= floor
    AND ready_at <= now``, PostgreSQL rated the range at 0.5% of the table and, with a backlog
    queued since its last statistics, read every hint in it (a bitmap scan and a sort: 30,000
    rows a claim), not the first few in the hint index's order."""

    from tombstones.jobs import ledger

    # The statistics of an empty table (the bench empties it between runs), then a backlog.
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("TRUNCATE tombstones_job, tombstones_jobevent RESTART IDENTITY CASCADE")
        cursor.execute("ANALYZE tombstones_job")
    seed_queued(BACKLOG)
    # Quick handlers' claims (the bench's), which read the lanes to look at, 100 hints.
    assert ledger.claim(20, workers=4, whole=True) is not None  # from the first hint: the floor
    with CaptureQueriesContext(connection) as captured:
        taken = ledger.claim(20, workers=4, whole=True)
    assert taken is not None
    assert len(taken.jobs) == 20
    look = ") AS scan_"  # the scan's parts (heads._scan), not the lanes' read
    scans = [q["sql"] for q in captured.captured_queries if look in q["sql"]]
    assert len(scans) == 1, [q["sql"][:200] for q in captured.captured_queries]
    read = rows_read_by(scans)
    assert [r for r in read if r[0] > READ_AT_MOST] == [], read


def test_plans__a_worker_of_one_queue_reads_none_of_anothers_backlog(
    postgres_only: None, settings: Any
) -> None:
    """Named queues (issue 36): with 30,000 due jobs in "default", a worker serving "emails"
    finds its one job reading a few rows: the hint and priority indexes start with the queue,
    and its look reads one range of each per queue it serves, in index order, however the
    planner's statistics were taken (an empty table's here, then the backlog)."""
    from tombstones.jobs import ledger
    from tombstones.models import Job

    settings.TOMBSTONES_QUEUES = {"emails": None}
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("TRUNCATE tombstones_job, tombstones_jobevent RESTART IDENTITY CASCADE")
        cursor.execute("ANALYZE tombstones_job")
    seed_queued(BACKLOG)
    seed_queued(1, prefix="mail")
    Job.objects.filter(lane="mail:1").update(queue="emails", lane="queue:emails/mail:1")
    for workers in (1, 4):  # the sizing scan (several workers), then the look
        with CaptureQueriesContext(connection) as captured:
            taken = ledger.claim(20, workers=workers, queues=("emails",))
        assert taken is not None
        assert [job.lane for job in taken.jobs] == ["queue:emails/mail:1"]
        scans = [q["sql"] for q in captured.captured_queries if '"queue"' in q["sql"]]
        assert scans, [q["sql"][:200] for q in captured.captured_queries]
        read = rows_read_by(scans)
        assert [r for r in read if r[0] > READ_AT_MOST] == [], read
        Job.objects.filter(queue="emails").update(
            status="queued", claim_token="", attempts=0, ready_at=F("queued_at")
        )


def test_plans__on_sqlite_the_engine_reads_through_indexes_too() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's plans (PostgreSQL's are pinned above)")
    seed_finished(20_000)
    customers = [SheetRowFactory().customer for _ in range(3)]
    jobs = [tombstones.enqueue("customers.update_sheet_row", c) for c in customers]
    Customer.objects.get(pk=customers[1].pk).delete()
    with CaptureQueriesContext(connection) as captured:
        run(jobs[0])
        sweep()
    scans = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            sql = query["sql"]
            verb = sql.lstrip().split(None, 1)[0].upper()
            if verb not in ("SELECT", "UPDATE", "DELETE") or not TABLES.search(sql):
                continue
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            # A full scan reads "SCAN <table or alias>" without "USING ... INDEX".
            plan = [row[-1] for row in cursor.fetchall()]
            full = [s for s in plan if s.startswith("SCAN ") and "USING" not in s]
            full = [s for s in full if "django_content_type" not in s and "CONSTANT" not in s]
            # The claim's own subqueries (one lane's first jobs, its hints; the jobs above
            # priority 0 and the hints: index searches) and its list of ids.
            subqueries = ("SCAN part_", "SCAN scan_", "SCAN json_each")
            full = [s for s in full if not s.startswith(subqueries)]
            if full:
                scans.append((full, sql[-500:]))
    assert scans == [], scans


def test_plans__on_sqlite_the_claim_takes_its_jobs_by_id() -> None:
    """The claim's UPDATE finds its jobs by id: SQLite's planner would otherwise walk the
    due-jobs index (every queued job behind a blocked head: a cost that follows them)."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's planner (PostgreSQL's plans are pinned above)")
    jobs = [tombstones.enqueue("customers.update_sheet_row", SheetRowFactory().customer)]
    with CaptureQueriesContext(connection) as captured:
        run(jobs[0])
    takes = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].startswith('UPDATE "tombstones_job"') and "RETURNING" in q["sql"]
    ]
    assert takes, "the claim ran no UPDATE ... RETURNING?"
    with connection.cursor() as cursor:
        for sql in takes:
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            plan = [row[-1] for row in cursor.fetchall()]
            assert plan[0] == "SEARCH tombstones_job USING INTEGER PRIMARY KEY (rowid=?)", plan


def test_plans__a_lane_s_hints_are_read_through_the_lane_whatever_the_statistics(
    postgres_only: None,
) -> None:
    """The claim's look at its lanes (their first jobs and their hints, one LATERAL statement)
    reads each lane through the lane's own index. With statistics taken while no job waited (a
    VACUUM or ANALYZE between bursts) both hint indexes looked free to the planner, and it read
    each lane's hints through the index of every hint, filtering on the lane: 12 ms a look at
    10,000,000 finished jobs, 0.66x the drain of an empty ledger (bench/ledger_scale.py)."""
    from django.db import transaction

    from tombstones.jobs import ledger

    seed_finished(LEDGER)  # statistics of a ledger where no job waits: no hint anywhere
    seed_queued(BACKLOG)  # then a burst, hinted, that the statistics never saw
    with CaptureQueriesContext(connection) as captured:
        taken = ledger.claim(20, whole=True)
    assert taken is not None
    looks = [q["sql"] for q in captured.captured_queries if "CROSS JOIN LATERAL" in q["sql"]]
    assert looks, "the claim read no lane?"
    with connection.cursor() as cursor:
        for sql in looks:
            undo = _savepoint()
            cursor.execute("EXPLAIN (ANALYZE) " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            transaction.savepoint_rollback(undo)
            used = set(INDEX.findall(plan))
            assert used == {"tombstones_job_lane_place"}, plan


def test_plans__the_priority_look_reads_the_priority_jobs_not_the_backlog(
    postgres_only: None,
) -> None:
    """Every claim's scan of the hints also reads the due jobs of a priority above 0 (in the
    same statement): from an index of those jobs only, so with a backlog of 30,000 jobs of
    priority 0 it reads the one urgent job and the first hints, not the backlog."""
    from tests import tasks
    from tombstones.jobs import ledger
    from tombstones.models import Job

    seed_queued(BACKLOG)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tombstones_job")
    urgent = Job.objects.get(pk=int(tasks.ping.using(priority=5).enqueue().id))
    with CaptureQueriesContext(connection) as captured:
        taken = ledger.claim(1)
    assert taken is not None
    assert [job.pk for job in taken.jobs] == [urgent.pk]
    looks = [q["sql"] for q in captured.captured_queries if '"priority" > 0' in q["sql"]]
    assert len(looks) == 1, [q["sql"][:200] for q in captured.captured_queries]
    assert [r for r in rows_read_by(looks) if r[0] > READ_AT_MOST] == []


def test_plans__on_sqlite_the_priority_look_reads_its_own_index() -> None:
    """Without statistics SQLite read the due jobs above priority 0 through the index of every
    due job, and sorted them: the whole backlog at each claim."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's planner (PostgreSQL's plans are pinned above)")
    from tombstones.jobs import ledger

    tombstones.enqueue("customers.update_sheet_row", SheetRowFactory().customer)
    with CaptureQueriesContext(connection) as captured:
        assert ledger.claim(1) is not None
    looks = [q["sql"] for q in captured.captured_queries if "AS scan_0" in q["sql"]]
    assert len(looks) == 1, [q["sql"][:200] for q in captured.captured_queries]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + looks[0])
        plan = [row[-1] for row in cursor.fetchall()]
    wanted = "SEARCH tombstones_job USING INDEX tombstones_job_priority (queue=? AND priority>?)"
    assert wanted in plan, plan
    assert not [line for line in plan if "TEMP B-TREE" in line], plan
