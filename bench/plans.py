"""The engine's queries at 2,000 and 200,000 queued jobs: does any cost follow the backlog?
(issue 34)

    .venv/bin/python bench/plans.py --json bench/results/plans-2k-200k.json   # about 20 s
    .venv/bin/python bench/plans.py --sizes 2000,20000,200000 --mix many --runs 3

For each mix (``--mix``) and backlog size N (``--sizes``), in a PostgreSQL database of its own
(``postgres://postgres@127.0.0.1:5432/bench_plans``, created when missing, ``--pg-url``; a test
database is refused):

1. empty the tables, then write in SQL (``INSERT ... SELECT generate_series``: seconds, not the
   ORM's minutes) N queued jobs of ``bench.touch`` as ``tombstones.enqueue`` leaves them: one
   customer per lane (``customers.customer:<pk>``, its row in ``tombstones_lane``), status
   ``queued``, no claim token, ``created_at = run_after = queued_at = ready_at`` = its enqueue
   time (the columns' ``db_default``, and the INSERT's place: a queued job's hint is due from its
   enqueue), one job a millisecond, the last one a millisecond ago; ``many``: one job per record
   (N lanes), ``bursty``: ``--burst`` (20) jobs per record back to back (N / 20 lanes). Then
   ``VACUUM ANALYZE`` (this server runs no autovacuum).
2. run the engine's own functions, each phase in a transaction rolled back at its end (every
   phase sees the same backlog; ``Now()`` is ``STATEMENT_TIMESTAMP()``, so the clock moves):

   - ``enqueue``: ``tombstones.enqueue("bench.touch", customer)`` once more for a record of the
     backlog, after one warm-up (its lane's row then known: the one-statement INSERT);
   - ``claim/share``: ``ledger.claim(batch, workers=2, whole=False)``, as ``runner.pump`` calls
     it first in a worker (``due_lanes``, then the look), then the lease keeper's statements on
     that claim: ``ledger.renew``, ``ledger.holds_any`` (a heartbeat), ``oldest_hint_wait()``
     (``call_help``) and ``ledger.give_back`` (a slow claim's jobs back to the queue);
   - ``claim/whole``: ``ledger.claim(batch, workers=2, whole=True)`` (a worker whose last claim
     ran quickly), then ``runner.run_claim`` on it: the check's read, each job's fenced
     ``UPDATE`` (``ctx.update``), the group's outcome ``UPDATE`` (``outcomes._write``);
   - ``tick``: an alarm's tick (``Alarms.tick``): ``ledger.take_back_lapsed()``, the hinted
     head, ``next_due_in()`` (``arm_next``);
   - ``sweep``: ``sweep()`` (every ``SWEEP_MINUTES``; its wake-up goes nowhere);
   - ``rescue``: ``ledger.take_back_lapsed()`` (a tick's, the sweep's) once a worker died: 10
     lanes' heads running under a lease that ran out (5 of one claim, 5 of a claim each; in
     ``bursty`` each lane's next 2 jobs reserved by its head's claim), and 10 more lanes'
     reserved followers whose claim's heads ended (orphans), written in the phase's
     transaction before it (``dead_claims``).

   Every statement they send (``connection.execute_wrapper``) runs first ``--runs`` (5) times
   under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)``, each in a savepoint rolled back, then for
   real: each plan is that of the engine's statement in the state it met. While ``run_claim``
   runs, ``group.GROUP_SECONDS`` and ``keeper.WATCH_SECONDS`` are raised to an hour: the
   EXPLAINs make every statement several times slower, and the engine would otherwise close its
   group early or give the claim's jobs back: other statements than it sends at full speed.
3. print one table per mix: per statement (phase, the engine's function that sent it, and the
   number of times it ran in the phase), the execution time at each N (median of the runs; of
   the executions for a statement run several times), the ratio largest/smallest N, the rows its
   scans read and the buffers it touched at each N, and its plan (top node > the scans of the
   job, lane and customer tables); ``grows`` marks a statement at more than 1.5x and over 1 ms,
   ``rows`` one whose rows read grew more than 10x. ``--json`` keeps every statement's SQL,
   parameters, timings and its median run's whole plan (zero block counters left out).

No cluster, no Redis: nothing but ``127.0.0.1:5432`` (django-q2's ORM broker would be the
scratch database; no message is sent). About 20 s for 2,000 and 200,000, both mixes, on this
2-core machine (most of it writing and vacuuming the 200,000 jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402 - after the path set-up
    HANDLER,
    code_fingerprint,
    csv,
    ensure_pg_database,
    git_head,
    machine,
)

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_plans"
MIXES = ("many", "bursty")
WORKERS = 2  # the cluster the claims are told of (Q_WORKERS), as the other benches
# Statements explained: reads and writes; transaction control and settings pass through.
EXPLAINED = re.compile(r"^\s*(SELECT|UPDATE|INSERT|DELETE|WITH)\b", re.IGNORECASE)
SOURCE = ROOT / "tombstones"
TABLES = ("tombstones_job", "tombstones_lane", "tombstones_jobevent", "customers_customer")
# "grows": over 1.5x and over 1 ms at the largest N; "rows": rows read over 10x.
GROWS_RATIO, GROWS_MS, ROWS_RATIO = 1.5, 1.0, 10.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="2000,200000", help="queued jobs (comma list)")
    p.add_argument("--mix", default="many,bursty", help="many,bursty")
    p.add_argument("--burst", type=int, default=20, help="jobs per record in the bursty mix")
    p.add_argument("--runs", type=int, default=5, help="EXPLAIN ANALYZE runs per statement")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PLANS_PG_URL", DEFAULT_PG))
    p.add_argument("--json", default="", help="write the results (with the plans) here")
    p.add_argument("--keep", action="store_true", help="leave the last backlog in the database")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = sorted(int(n) for n in csv(args.sizes))
    mixes = csv(args.mix)
    for mix in mixes:
        if mix not in MIXES:
            raise SystemExit(f"unknown --mix {mix!r}")
    if args.runs < 1 or not sizes or min(sizes) < 1 or max(sizes) > 2_000_000:
        raise SystemExit("--runs >= 1 and --sizes between 1 and 2,000,000")
    started = time.time()
    setup_django(args)
    from django.db import connection

    results: dict[str, Any] = {
        "command": " ".join(["bench/plans.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "server": server_version(),
        "code": {"git": git_head(), "tombstones_sha256": code_fingerprint()},
        "settings": {
            "sizes": sizes,
            "mixes": mixes,
            "burst": args.burst,
            "runs": args.runs,
            "workers": WORKERS,
            **engine_settings(),
        },
        "mixes": {},
    }
    for mix in mixes:
        cases = []
        for n in sizes:
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            seeded = seed(mix, n, args.burst)
            case = {"mix": mix, "jobs": n, "seed": seeded, "load_1m": [round(load, 2)]}
            t1 = time.perf_counter()
            case["statements"] = run_phases(args.runs)
            case["phases_s"] = round(time.perf_counter() - t1, 1)
            case["load_1m"].append(round(os.getloadavg()[0], 2))
            case["seconds"] = round(time.perf_counter() - t0, 1)
            cases.append(case)
            print(
                f"{mix} N={n:,}: seeded in {seeded['seconds']} s, {len(case['statements'])} "
                f"statements explained in {case['phases_s']} s (load {case['load_1m']})",
                flush=True,
            )
        results["mixes"][mix] = {"cases": cases, "rows": compare(cases)}
    if not args.keep:
        empty_tables()
    connection.close()
    results["seconds"] = round(time.time() - started, 1)
    print()
    print(render(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        # Compact: the plans are most of it (jq or python -m json.tool to read it).
        Path(args.json).write_text(json.dumps(results, separators=(",", ":"), default=str) + "\n")
        print(f"JSON: {args.json}")
    return 0


# --- set-up -----------------------------------------------------------------------------------


def setup_django(args: argparse.Namespace) -> None:
    ensure_pg_database(args.pg_url)  # refuses a test database
    os.environ["DATABASE_URL"] = args.pg_url
    os.environ["REDIS_URL"] = ""  # django-q2's ORM broker, in the scratch database
    os.environ["Q_NAME"] = f"plansbench-{os.getpid()}"  # a queue nobody reads
    os.environ["Q_WORKERS"] = str(WORKERS)
    os.environ.pop("Q_SYNC", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ.setdefault("TEST_DB_SUFFIX", "")
    import logging

    import django

    django.setup()
    logging.getLogger("tombstones").setLevel(logging.ERROR)  # a line per outcome otherwise
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("bench/plans.py reads PostgreSQL's plans: --pg-url postgres://...")
    call_command("migrate", verbosity=0, interactive=False)
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '60s'")  # bounded, whatever a plan does


def server_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        found = str(cursor.fetchone()[0])[:60]
        settings = {}
        for name in ("shared_buffers", "work_mem", "jit", "random_page_cost", "autovacuum"):
            cursor.execute(f"SHOW {name}")
            settings[name] = cursor.fetchone()[0]
    return found + " (" + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")"


def engine_settings() -> dict[str, Any]:
    from tombstones.conf import tombstone_settings

    return {
        "batch_size": tombstone_settings.BATCH_SIZE,
        "wake_budget": tombstone_settings.WAKE_BUDGET,
        "lease_s": tombstone_settings.LEASE.total_seconds(),
        "sweep_minutes": tombstone_settings.SWEEP_MINUTES,
    }


def empty_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE tombstones_jobevent, tombstones_job, tombstones_lane, customers_sheetrow, "
            "customers_customer RESTART IDENTITY CASCADE"
        )


def seed(mix: str, n: int, burst: int) -> dict[str, Any]:
    """N queued jobs as the enqueues of ``mix`` leave them (see the module docstring)."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    from project.customers.models import Customer

    t0 = time.perf_counter()
    per = 1 if mix == "many" else max(1, burst)
    records = -(-n // per)
    ct = ContentType.objects.get_for_model(Customer).pk
    empty_tables()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO customers_customer (generation, version, reference, name, email, phone) "
            "SELECT 1, 1, 'P' || lpad(g::text, 9, '0'), 'Bench', 'bench@example.invalid', '' "
            "FROM generate_series(1, %s) AS g ORDER BY g",
            [records],
        )
        # RESTART IDENTITY: the customers' pks are 1..records, their lanes 'customers.customer:pk'
        cursor.execute(
            "INSERT INTO tombstones_lane (key) SELECT 'customers.customer:' || g "
            "FROM generate_series(1, %s) AS g ORDER BY g",
            [records],
        )
        # Job g of N: record (g - 1) / per + 1, enqueued (N - g + 1) ms ago (ids in place order).
        cursor.execute(
            "INSERT INTO tombstones_job (handler, content_type_id, object_id, generation, "
            "version, lane, status, reason, error_class, params, attempts, rereads, external, "
            "created_at, run_after, queued_at, ready_at, owner, claim_token) "
            "SELECT %s, %s, r::text, 1, 1, 'customers.customer:' || r, 'queued', '', '', "
            "'{}'::jsonb, 0, 0, false, at, at, at, at, '', '' "
            "FROM (SELECT g, (g - 1) / %s + 1 AS r, "
            "statement_timestamp() - make_interval(secs => (%s - g + 1) / 1000.0) AS at "
            "FROM generate_series(1, %s) AS g) AS s ORDER BY g",
            [HANDLER, ct, per, n, n],
        )
        t_insert = time.perf_counter() - t0
        for table in ("tombstones_job", "tombstones_lane", "customers_customer"):
            cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute(
            "SELECT count(*), count(DISTINCT lane), count(ready_at), "
            "pg_total_relation_size('tombstones_job') FROM tombstones_job"
        )
        jobs, lanes, hinted, size = cursor.fetchone()
    return {
        "jobs": jobs,
        "lanes": lanes,
        "hinted": hinted,
        "per_record": per,
        "job_table_mb": round(size / 2**20, 1),
        "insert_s": round(t_insert, 2),
        "seconds": round(time.perf_counter() - t0, 2),
    }


# --- explaining the engine's statements in place ----------------------------------------------


class Explainer:
    """An execute wrapper: each read or write runs ``runs`` times under EXPLAIN ANALYZE, each in
    a savepoint rolled back (the data stays as it was), then for real."""

    def __init__(self, runs: int) -> None:
        self.runs = runs
        self.phase = ""
        self.label = ""
        self.paused = False  # set-up statements of a phase: run, not explained
        self.found: list[dict[str, Any]] = []

    @contextmanager
    def setting_up(self) -> Iterator[None]:
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    @contextmanager
    def named(self, label: str) -> Iterator[None]:
        """Statements sent in the block are ``label``'s (not the engine function's)."""
        before, self.label = self.label, label
        try:
            yield
        finally:
            self.label = before

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if many or self.paused or not EXPLAINED.match(sql):
            return execute(sql, params, many, context)
        conn = context["connection"]
        if not conn.in_atomic_block:
            raise RuntimeError("explained statements run inside the phase's transaction")
        runs, error = [], ""
        with conn.connection.cursor() as cursor:
            for _ in range(self.runs):
                cursor.execute("SAVEPOINT bench_plan")
                try:
                    cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
                    out = cursor.fetchone()[0]
                    runs.append((json.loads(out) if isinstance(out, str) else out)[0])
                except Exception as exc:  # noqa: BLE001 - kept in the results, the engine goes on
                    error = f"{type(exc).__name__}: {exc}"[:300]
                finally:
                    cursor.execute("ROLLBACK TO SAVEPOINT bench_plan")
                    cursor.execute("RELEASE SAVEPOINT bench_plan")
                if error:
                    break
        self.found.append(
            {
                "phase": self.phase,
                "name": self.label or engine_caller(),
                "sql": sql,
                "params": params,
                "runs": runs,
                "error": error,
            }
        )
        return execute(sql, params, many, context)


def engine_caller() -> str:
    """``module.function`` of the innermost frame of the library (the engine's sender)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(SOURCE):
            return f"{path.stem}.{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


@contextmanager
def phase(explainer: Explainer, name: str) -> Iterator[None]:
    """A phase: its statements explained, all of it rolled back at the end."""
    from django.db import connection, transaction

    explainer.phase = name
    with connection.execute_wrapper(explainer), transaction.atomic():
        try:
            yield
        finally:
            transaction.set_rollback(True)


@contextmanager
def patched(module: Any, **values: Any) -> Iterator[None]:
    before = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(module, name, value)


def run_phases(runs: int) -> list[dict[str, Any]]:
    """The engine's functions on the backlog (see the module docstring); every statement they
    sent, explained."""
    from django.db import connection

    import tombstones
    from project.customers.models import Customer
    from tombstones.conf import tombstone_settings
    from tombstones.jobs import ledger
    from tombstones.jobs.engine import group, keeper, runner, sweep
    from tombstones.models import Job

    size = min(tombstone_settings.BATCH_SIZE, tombstone_settings.WAKE_BUDGET)
    explainer = Explainer(runs)
    record = Customer.objects.order_by("pk").first()
    connection.ensure_connection()

    from django.db import transaction

    with transaction.atomic():  # the warm-up: the lane's row is known from then on
        tombstones.enqueue(HANDLER, record)
        transaction.set_rollback(True)
    with phase(explainer, "enqueue"):
        tombstones.enqueue(HANDLER, record)

    with phase(explainer, "claim/share"):
        claim = ledger.claim(size, workers=WORKERS, whole=False)
        if claim is None or not claim.jobs:
            raise RuntimeError("the share claim took nothing from the backlog")
        explainer.phase = "keeper"
        ledger.renew([claim.token])
        ledger.holds_any(claim.token)
        with explainer.named("models.oldest_hint_wait"):
            Job.objects.oldest_hint_wait()
        ledger.give_back(claim)

    with phase(explainer, "claim/whole"):
        claim = ledger.claim(size, workers=WORKERS, whole=True)
        if claim is None or not claim.jobs:
            raise RuntimeError("the whole claim took nothing from the backlog")
        explainer.phase = "job"
        with patched(group, GROUP_SECONDS=3600.0), patched(keeper, WATCH_SECONDS=3600.0):
            done, _ = runner.run_claim(claim, workers=WORKERS)
        if len(done) != len(claim.jobs):
            raise RuntimeError(f"{len(done)} outcomes for the {len(claim.jobs)} jobs claimed")

    with phase(explainer, "tick"):
        ledger.take_back_lapsed()
        with explainer.named("alarms.tick (hinted head)"):
            Job.objects.hinted().values_list("id", flat=True).first()
        with explainer.named("models.next_due_in"):
            Job.objects.next_due_in()

    with phase(explainer, "sweep"), patched(sweep, wake_soon=lambda *a, **k: None):
        sweep.sweep()

    with phase(explainer, "rescue"):
        with explainer.setting_up():
            dead = dead_claims()
        taken = ledger.take_back_lapsed()
        if taken["requeued"] + taken["crashed"] + taken["uncertain"] < dead:
            raise RuntimeError(f"take_back_lapsed took back {taken} of {dead} lapsed jobs")

    return summarise(explainer.found)


def dead_claims(lanes: int = 10, behind: int = 2) -> int:
    """What a worker that died leaves (the ``rescue`` phase's backlog, in its transaction): the
    heads of the first ``lanes`` lanes ``running`` under a lease that ran out a minute ago, half
    of them taken by one claim, the other half each by a claim of its own (a share claim of one
    head, a suspect claimed alone), each lane's next ``behind`` jobs reserved by its head's claim
    (queued, the claim's token; none in the ``many`` mix: one job per lane), and a claim of the
    next ``lanes`` lanes whose heads succeeded but whose reserved followers were never given
    back (orphans). Returns the lapsed jobs."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT lane FROM tombstones_job GROUP BY lane ORDER BY min(id) LIMIT %s", [2 * lanes]
        )
        found = [row[0] for row in cursor.fetchall()]
        for n, lane in enumerate(found):
            claim = 0 if n < lanes // 2 else n if n < lanes else lanes
            token = f"plansbenchdeadclaim{claim:013d}"  # 32 characters
            cursor.execute(
                "SELECT id FROM tombstones_job WHERE lane = %s AND status = 'queued' "
                "ORDER BY queued_at, id LIMIT %s",
                [lane, 1 + behind],
            )
            head, *followers = [row[0] for row in cursor.fetchall()]
            if n < lanes:  # the dead claim's running head
                cursor.execute(
                    "UPDATE tombstones_job SET status = 'running', claim_token = %s, "
                    "owner = 'plansbench:dead', attempts = 1, ready_at = NULL, "
                    "started_at = now() - interval '2 minutes', "
                    "lease_expires_at = now() - interval '1 minute' WHERE id = %s",
                    [token, head],
                )
            else:  # the head ended; its claim's followers were left reserved
                cursor.execute(
                    "UPDATE tombstones_job SET status = 'succeeded', owner = 'plansbench:dead', "
                    "attempts = 1, started_at = now() - interval '2 minutes', "
                    "finished_at = now() - interval '1 minute', "
                    "ready_at = now() - interval '1 minute' WHERE id = %s",
                    [head],
                )
            if followers:
                cursor.execute(
                    "UPDATE tombstones_job SET claim_token = %s, attempts = 1, ready_at = NULL "
                    "WHERE id = ANY(%s)",
                    [token, followers],
                )
    return min(lanes, len(found))


# --- what the plans say ------------------------------------------------------------------------


def walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)


def scans(plan: dict[str, Any]) -> list[str]:
    """The plan's reads of the tables that matter, as EXPLAIN's text format names them."""
    found = []
    for node in walk(plan):
        relation = node.get("Relation Name")
        index = node.get("Index Name")
        if relation not in TABLES and not (index and index.startswith(TABLES)):
            continue
        kind = node["Node Type"]
        if kind == "ModifyTable":
            continue
        if node.get("Parallel Aware"):
            kind = f"Parallel {kind}"
        if node.get("Scan Direction") == "Backward":
            kind = f"{kind} Backward"
        text = f"{kind} using {index}" if index else f"{kind} on {relation}"
        if not node.get("Actual Loops", 1):
            text += " (never executed)"
        if text not in found:
            found.append(text)
    return found


def top(plan: dict[str, Any]) -> str:
    """The top node and, below it, the first child's chain down to a join or a scan."""
    chain, node = [], plan
    while True:
        kind = node["Node Type"]
        if kind == "ModifyTable":
            kind = node.get("Operation", kind)
        chain.append(kind)
        children = node.get("Plans", [])
        if len(children) != 1 or "Scan" in kind or len(chain) >= 3:
            break
        node = children[0]
    return " > ".join(dict.fromkeys(c for c in chain if "Scan" not in c))


def rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's table scans looked at: returned plus removed by a filter, every loop."""
    total = 0
    for node in walk(plan):
        if node.get("Relation Name") is None or node["Node Type"] == "ModifyTable":
            continue
        seen = (
            node.get("Actual Rows", 0)
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        total += int(seen * node.get("Actual Loops", 1))
    return total


def one_statement(found: dict[str, Any]) -> dict[str, Any]:
    """One explained statement: its median run (by execution time) and the others' times."""
    runs = found["runs"]
    out: dict[str, Any] = {
        "sql": found["sql"],
        "params": repr(found["params"])[:2000],
        "error": found["error"],
    }
    if not runs:
        return out
    times = [r["Execution Time"] for r in runs]
    median = sorted(runs, key=lambda r: r["Execution Time"])[len(runs) // 2]
    plan = median["Plan"]
    out.update(
        {
            "ms": round(statistics.median(times), 3),
            "ms_runs": [round(t, 3) for t in times],
            "planning_ms": round(statistics.median(r["Planning Time"] for r in runs), 3),
            "rows_read": rows_read(plan),
            "rows_out": plan.get("Actual Rows", 0),
            "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
            "top": top(plan),
            "scans": scans(plan),
            "plan": pruned(median),
        }
    )
    return out


def pruned(plan: Any) -> Any:
    """The plan without its zero block counters and timings (local, temp, I/O: most keys of a
    plan with BUFFERS, none of them telling anything here)."""
    if isinstance(plan, list):
        return [pruned(item) for item in plan]
    if not isinstance(plan, dict):
        return plan
    zero = ("Blocks", "I/O Read Time", "I/O Write Time")
    return {k: pruned(v) for k, v in plan.items() if not (v == 0 and k.endswith(zero))}


def summarise(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Statements by (phase, sender, text): executions of one text together (a handler's
    UPDATE per job), numbered by first appearance within their phase and sender."""
    by_key: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for item in found:
        by_key.setdefault((item["phase"], item["name"], item["sql"]), []).append(item)
    numbered: dict[tuple[str, str], int] = {}
    out = []
    for (ph, name, _), items in by_key.items():
        numbered[(ph, name)] = numbered.get((ph, name), 0) + 1
        each = [one_statement(item) for item in items]
        timed = [e for e in each if "ms" in e]
        first = dict(sorted(timed, key=lambda e: e["ms"])[len(timed) // 2]) if timed else each[0]
        first.update(
            {
                "phase": ph,
                "name": name,
                "shape": numbered[(ph, name)],
                "executions": len(items),
                "ms_executions": [e["ms"] for e in timed],
            }
        )
        if timed:
            first["ms"] = round(statistics.median(e["ms"] for e in timed), 3)
        out.append(first)
    return out


def key(statement: dict[str, Any]) -> str:
    shape = f" #{statement['shape']}" if statement["shape"] > 1 else ""
    return f"{statement['phase']}: {statement['name']}{shape}"


def compare(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per statement: its figures at each N, the ratios largest / smallest N."""
    rows: dict[str, dict[str, Any]] = {}
    for case in cases:
        for statement in case["statements"]:
            row = rows.setdefault(key(statement), {"statement": key(statement), "at": {}})
            row["at"][str(case["jobs"])] = {
                k: statement.get(k)
                for k in ("ms", "planning_ms", "rows_read", "buffers", "top", "scans", "executions")
            }
            row["at"][str(case["jobs"])]["error"] = statement.get("error", "")
    sizes = [str(case["jobs"]) for case in cases]
    for row in rows.values():
        small, big = row["at"].get(sizes[0]), row["at"].get(sizes[-1])
        row["ratio"] = row["rows_ratio"] = None
        row["grows"] = row["rows_grow"] = False
        if small and big and small.get("ms") and big.get("ms") is not None:
            row["ratio"] = round(big["ms"] / small["ms"], 2)
            row["grows"] = row["ratio"] > GROWS_RATIO and big["ms"] > GROWS_MS
        if small and big and big.get("rows_read") is not None:
            row["rows_ratio"] = round(big["rows_read"] / max(small.get("rows_read") or 0, 1), 1)
            row["rows_grow"] = row["rows_ratio"] > ROWS_RATIO
    return list(rows.values())


# --- the table ---------------------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    lines = [
        f"{results['date']}, {results['machine']['cpus']} cores, {results['server']}, "
        f"code {results['code']['git']} ({results['code']['tombstones_sha256']}), "
        f"{results['seconds']} s"
    ]
    for mix, data in results["mixes"].items():
        cases = data["cases"]
        sizes = [c["jobs"] for c in cases]
        names = [f"{n:,}" for n in sizes]
        seeded = "; ".join(
            f"N={c['jobs']:,}: {c['seed']['lanes']:,} lanes, {c['seed']['hinted']:,} hints due, "
            f"job table {c['seed']['job_table_mb']} MB, load {'/'.join(map(str, c['load_1m']))}"
            for c in cases
        )
        lines += ["", f"mix {mix} ({seeded})", ""]
        head = ["statement", "x"]
        head += [f"ms {n}" for n in names] + [f"{names[-1]}/{names[0]}"]
        head += [f"rows {n}" for n in names] + [f"buffers {n}" for n in names]
        head += [f"plan at {names[-1]}", "grows?"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|---|" + "---:|" * (1 + 3 * len(sizes) + 1) + "---|---|")
        for row in data["rows"]:
            at = [row["at"].get(str(n)) or {} for n in sizes]
            big = at[-1]
            plan = big.get("top") or ""
            if big.get("scans"):
                plan += " > " + ", ".join(big["scans"]) if plan else ", ".join(big["scans"])
            if big.get("error"):
                plan = "error: " + big["error"][:60]
            flags = [f for f, on in (("grows", row["grows"]), ("rows", row["rows_grow"])) if on]
            cells = [row["statement"], str(big.get("executions") or "")]
            cells += [fmt(a.get("ms"), ".3f") for a in at]
            cells.append(fmt(row["ratio"], ".2f"))
            cells += [fmt(a.get("rows_read"), ",") for a in at]
            cells += [fmt(a.get("buffers"), ",") for a in at]
            cells += [plan, ", ".join(flags)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "ms: EXPLAIN ANALYZE's execution time, median of the runs (of the executions' medians "
        "when x > 1: the statement ran x times in the phase); rows: rows its table scans read "
        "(returned + filtered out, every loop); buffers: shared blocks hit + read; plan: top "
        "node > the scans of the job, lane and customer tables. grows: > 1.5x and > 1 ms at the "
        "largest N; rows: rows read grew > 10x.",
    ]
    return "\n".join(lines)


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else f"{value:{spec}}"


if __name__ == "__main__":
    sys.exit(main())
