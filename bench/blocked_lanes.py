"""Does a due job starve behind blocked lanes, and does the claim's cost follow them? (issue 32)

    .venv/bin/python bench/blocked_lanes.py                   # both databases, ~5-10 minutes
    .venv/bin/python bench/blocked_lanes.py --db sqlite --lanes 100,1000 --kind retry

For each database (``--db``), kind of block (``--kind``) and number of blocked lanes (``--lanes``):

1. reset the scratch tables and create N + 2 customers;
2. enqueue, through ``tombstones.enqueue``, one job per blocked record (the lane heads), then a
   second job per blocked record (queued behind its head), 500 per transaction;
3. put the N heads in their blocked state with ONE ``UPDATE`` of the job table (columns
   ``status``, ``run_after``, ``lease_expires_at``, ``claim_token``, ``owner``, ``started_at``
   only; see ``BLOCKED``): ``retry`` = ``retry_wait`` due in an hour (what a transient failure
   with a long backoff leaves), ``running`` = ``running`` under a live lease (an hour) held by
   another claim token, ``paused`` = ``paused``. Every blocked lane is older than the fresh jobs
   below (its jobs' ``queued_at`` and ids are earlier);
   right after it, one fresh job for another record, run as in 5: every job just enqueued has
   a due hint (the block's ``UPDATE`` writes none) and the fresh job's is the last, so the
   claims look at each of them once first (work that follows the burst, not the blocked lanes);
4. the cost of one claim with nothing claimable: ``tombstones.jobs.ledger.claim`` with the
   engine's arguments (``runner.pump``: the batch size, the cluster's worker count, ``whole``
   False (a process's first claim, slow handlers) and True (quick handlers)), in autocommit as
   the engine runs it, median and p90 of ``--reps`` calls after one warm-up, and the SQL
   statements per call (``connection.execute_wrapper``; savepoints and transaction control not
   counted); then the wall time of one ``tombstones.worker.run()`` (a whole wake-up) likewise;
5. enqueue ONE fresh job for another record (its own lane) and call ``tombstones.worker.run()``
   in this process, every ``--poll`` seconds, until the job has an outcome or ``--bound`` seconds
   passed ("starved"); printed: the wall time from the enqueue to the run that finished it;
6. enqueue a second fresh job (another record) and time the claim again with it claimable, each
   call in a transaction rolled back afterwards (the same backlog every time), and whether the
   claim took it.

In-process ``run()`` calls in a loop are kinder than a real cluster, which pumps only when a
message or an alarm arrives: "starved" here is starved there too. The wake-up messages go to
django-q2's ORM broker in the scratch database, under a queue name of this process (no Redis,
no cluster reads them). A table per database; ``xN0`` is the claim's median at N over its
median at the smallest N (same kind, mode and case): the figure that should stay about 1.0.

Scratch databases: ``postgres://postgres@127.0.0.1:5432/bench_blocked`` (created when missing;
``--pg-url``; a test database is refused) and ``/tmp/tombstones-bench/blocked.sqlite3``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
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
    pct,
    reset_tables,
    strip_parent_args,
)

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench_blocked"
DEFAULT_SQLITE = "/tmp/tombstones-bench/blocked.sqlite3"
KINDS = ("retry", "running", "paused")
MODES = (("share", False), ("whole", True))  # the claim's ``whole`` argument
PARENT_ARGS = ("--db", "--json", "--child", "--out")  # set by the parent per child
CHUNK = 500  # enqueues per transaction while setting up
# Transaction control, not counted as statements of the claim.
CONTROL = re.compile(r"^\s*(SAVEPOINT|RELEASE|ROLLBACK|BEGIN|COMMIT)\b", re.IGNORECASE)
OTHER_TOKEN = "blockbench0000other0claim0token0"  # 32 characters: the column's size


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", default="both", help="postgres | sqlite | both")
    p.add_argument("--lanes", default="100,1000,10000", help="blocked lanes (comma list)")
    p.add_argument("--kind", default=",".join(KINDS), help="retry,running,paused")
    p.add_argument("--reps", type=int, default=15, help="timed claims per case (median, p90)")
    p.add_argument("--bound", type=float, default=10.0, help="seconds before 'starved'")
    p.add_argument("--poll", type=float, default=0.1, help="seconds between two run() calls")
    p.add_argument("--workers", type=int, default=2, help="the cluster's workers (Q_WORKERS)")
    p.add_argument("--no-analyze", action="store_true", help="PostgreSQL: no ANALYZE after setup")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_BLOCKED_PG_URL", DEFAULT_PG))
    p.add_argument("--sqlite-path", default=os.environ.get("BENCH_BLOCKED_SQLITE", DEFAULT_SQLITE))
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)  # postgres|sqlite
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --- parent: one child process per database (Django settings are per process) ----------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    dbs = ["postgres", "sqlite"] if args.db == "both" else csv(args.db)
    for db in dbs:
        if db not in ("postgres", "sqlite"):
            raise SystemExit(f"unknown --db {db!r}")
    started = time.time()
    results: dict[str, Any] = {
        "command": " ".join(["bench/blocked_lanes.py", *(argv or sys.argv[1:])]),
        "machine": machine(),
        "code": {"git": git_head(), "tombstones_sha256": code_fingerprint()},
        "settings": {
            "lanes": [int(n) for n in csv(args.lanes)],
            "kinds": csv(args.kind),
            "reps": args.reps,
            "bound_s": args.bound,
            "poll_s": args.poll,
            "workers": args.workers,
            "analyze": not args.no_analyze,
        },
        "databases": {},
    }
    code = 0
    for db in dbs:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            out = tmp.name
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", db, "--out", out]
        cmd += strip_parent_args(argv if argv is not None else sys.argv[1:], PARENT_ARGS)
        print(f"== {db}", flush=True)
        rc = subprocess.call(cmd, cwd=str(ROOT))
        try:
            data = json.loads(Path(out).read_text() or "{}")
        except (OSError, ValueError):
            data = {}
        finally:
            Path(out).unlink(missing_ok=True)
        if rc != 0:
            print(f"!! the {db} child exited with {rc}", flush=True)
            code = rc
        if data:
            ratios(data["cases"])
            results["databases"][db] = data
    results["seconds"] = round(time.time() - started, 1)
    print()
    for db, data in results["databases"].items():
        print(render(db, data))
        print()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(f"JSON: {args.json}")
    return code


# --- child: one database --------------------------------------------------------------------


def child(args: argparse.Namespace) -> int:
    db = args.child
    if db == "postgres":
        ensure_pg_database(args.pg_url)  # refuses a test database
        os.environ["DATABASE_URL"] = args.pg_url
    else:
        Path(args.sqlite_path).parent.mkdir(parents=True, exist_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{Path(args.sqlite_path).resolve()}"
    os.environ["REDIS_URL"] = ""  # django-q2's ORM broker, in the scratch database
    os.environ["Q_NAME"] = f"blockbench-{os.getpid()}"  # a queue nobody else reads
    os.environ["Q_WORKERS"] = str(args.workers)
    os.environ.pop("Q_SYNC", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ.setdefault("TEST_DB_SUFFIX", "")
    import django

    django.setup()
    logging.getLogger("tombstones").setLevel(logging.ERROR)  # a line per outcome otherwise
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    out: dict[str, Any] = {
        "vendor": connection.vendor,
        "server": server_version(),
        "cases": [],
    }
    for kind in csv(args.kind):
        if kind not in KINDS:
            raise SystemExit(f"unknown --kind {kind!r}")
        for n in [int(v) for v in csv(args.lanes)]:
            case = one_case(args, kind, n)
            out["cases"].append(case)
            print(one_line(case), flush=True)
            Path(args.out).write_text(json.dumps(out))  # partial results survive
    reset_tables()  # leave the scratch database small
    return 0


def server_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT version()" if connection.vendor == "postgresql" else "SELECT sqlite_version()"
        )
        return str(cursor.fetchone()[0])[:60]


def blocked_state(kind: str) -> dict[str, Any]:
    """The columns a head's block leaves, written in the database's clock.

    Only the columns the issue allows (status, run_after, lease_expires_at, claim_token, owner,
    started_at): the rewrite may add columns, with defaults.

    - retry: what a transient failure with a long backoff leaves (``outcomes._write``): status
      ``retry_wait``, ``run_after`` = now + 1 h, no lease, no token, the claim's owner and start;
    - running: claimed by another worker whose lease (now + 1 h) is alive;
    - paused: the record could not be read (``tombstone_unreadable``), no lease, no token.
    """
    from django.db.models import Value
    from django.db.models.functions import Now

    from tombstones.models import Job

    hour = Now() + Value(timedelta(hours=1))
    common = {"started_at": Now(), "owner": "blockbench:other-worker"}
    if kind == "retry":
        return {
            **common,
            "status": Job.Status.RETRY_WAIT,
            "run_after": hour,
            "lease_expires_at": None,
            "claim_token": "",
        }
    if kind == "running":
        return {
            **common,
            "status": Job.Status.RUNNING,
            "lease_expires_at": hour,
            "claim_token": OTHER_TOKEN,
        }
    return {**common, "status": Job.Status.PAUSED, "lease_expires_at": None, "claim_token": ""}


def build(args: argparse.Namespace, kind: str, n: int) -> tuple[list[Any], dict[str, Any]]:
    """N blocked lanes, each a head in ``kind``'s state and one queued job behind it; returns
    the three records left for the fresh jobs and what the setup took."""
    from django.db import connection, models, transaction

    import tombstones
    import tombstones.worker
    from project.customers.models import Customer
    from tombstones.models import Job

    t0 = time.perf_counter()
    reset_tables()
    rows = [
        Customer(reference=f"L{i:07d}", name="Bench", email="bench@example.invalid")
        for i in range(n + 5)
    ]
    models.QuerySet(Customer).bulk_create(rows, batch_size=500)
    records = list(Customer.objects.order_by("pk"))
    blocked, warm, fresh = records[:n], records[n], records[n + 1 :]
    # This process runs one quick job first, on the empty ledger: from then on it claims as a
    # worker whose last claim ran quickly (``whole`` claims), in every case alike.
    with transaction.atomic():
        warmed = tombstones.enqueue(HANDLER, warm)
    tombstones.worker.run(warmed.pk)
    warm_status = Job.objects.filter(pk=warmed.pk).values_list("status", flat=True).get()
    ids: dict[str, list[int]] = {"head": [], "behind": []}
    for role in ("head", "behind"):  # every head first: heads and followers in id ranges
        for start in range(0, n, CHUNK):
            with transaction.atomic():
                for record in blocked[start : start + CHUNK]:
                    ids[role].append(tombstones.enqueue(HANDLER, record).pk)
    t_enqueue = time.perf_counter() - t0
    lo, hi = min(ids["head"]), max(ids["head"])
    if hi - lo + 1 != n:
        raise RuntimeError(f"the heads' ids are not one range ({lo}..{hi} for {n})")
    # The heads' block: ONE UPDATE of the job table over the heads' id range (see above).
    changed = Job.objects.filter(pk__gte=lo, pk__lte=hi).update(**blocked_state(kind))
    if changed != n:
        raise RuntimeError(f"{changed} heads blocked, {n} expected")
    if connection.vendor == "postgresql" and not args.no_analyze:
        with connection.cursor() as cursor:  # what autovacuum would do (off on this server)
            cursor.execute(f"ANALYZE {Job._meta.db_table}")
            cursor.execute(f"ANALYZE {Customer._meta.db_table}")
    statuses = dict(Job.objects.values_list("status").annotate(models.Count("id")).order_by())
    return fresh, {
        "setup_s": round(time.perf_counter() - t0, 2),
        "enqueue_s": round(t_enqueue, 2),
        "jobs_by_status": {str(k): v for k, v in statuses.items()},
        "warm_up_job": str(warm_status),
    }


class Counter:
    """SQL statements run through the connection (transaction control apart)."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not CONTROL.match(sql):
            self.statements.append(sql)
        return execute(sql, params, many, context)


def time_claims(args: argparse.Namespace, whole: bool, *, rollback: bool) -> dict[str, Any]:
    """``ledger.claim`` as ``runner.pump`` calls it, ``--reps`` times after one warm-up."""
    from django.db import connection, transaction

    from tombstones.conf import tombstone_settings
    from tombstones.jobs import ledger
    from tombstones.jobs.engine import runner

    size = min(tombstone_settings.BATCH_SIZE, tombstone_settings.WAKE_BUDGET)
    workers = runner.cluster_workers()

    def once() -> tuple[float, int, list[int]]:
        counter = Counter()
        with connection.execute_wrapper(counter):
            if rollback:
                with transaction.atomic():
                    t = time.perf_counter()
                    claim = ledger.claim(size, workers=workers, whole=whole)
                    t = time.perf_counter() - t
                    transaction.set_rollback(True)
            else:
                t = time.perf_counter()
                claim = ledger.claim(size, workers=workers, whole=whole)
                t = time.perf_counter() - t
        taken = [job.pk for job in claim.jobs] if claim is not None else []
        return t, len(counter.statements), taken

    connection.ensure_connection()
    once()  # warm-up: the statement is compiled once per process
    times, counts, taken = [], [], []
    for _ in range(args.reps):
        t, c, got = once()
        times.append(t)
        counts.append(c)
        taken = got
    return {
        "ms_median": round(1000 * statistics.median(times), 2),
        "ms_p90": round(1000 * (pct(times, 0.9) or 0), 2),
        "ms_min": round(1000 * min(times), 2),
        "statements": max(counts),
        "statements_min": min(counts),
        "taken": taken,  # the jobs the last call took (rolled back or not)
        "size": size,
        "workers": workers,
    }


def time_wakeups(args: argparse.Namespace) -> dict[str, Any]:
    """One whole ``tombstones.worker.run()`` (a wake-up message's work) on the backlog."""
    from django.db import connection

    import tombstones.worker

    times, counts, carried = [], [], []
    tombstones.worker.run()  # warm-up
    for _ in range(max(3, args.reps // 3)):
        counter = Counter()
        with connection.execute_wrapper(counter):
            t = time.perf_counter()
            result = tombstones.worker.run()
            times.append(time.perf_counter() - t)
        counts.append(len(counter.statements))
        carried += result.get("carried", [])
    return {
        "ms_median": round(1000 * statistics.median(times), 2),
        "ms_p90": round(1000 * (pct(times, 0.9) or 0), 2),
        "statements": max(counts),
        "carried": len(carried),
    }


def hinted_count() -> int | None:
    """Jobs whose hint is due (None on an engine without hints)."""
    from tombstones.models import Job

    hinted = getattr(Job.objects, "hinted", None)
    return None if hinted is None else int(hinted().count())


def time_to_claim(args: argparse.Namespace, record: Any) -> dict[str, Any]:
    """Enqueue one fresh job, run wake-ups until it has an outcome or the bound passes.

    The wake-ups name no job (``run()``, as an alarm's or a lost message's): the claim must find
    the job among the due ones by itself.

    A job still queued at the bound is then set ``cancelled`` (one UPDATE of its status), so
    that the next probe finds the same backlog: N blocked lanes and nothing else due.
    """
    from django.db import transaction

    import tombstones
    import tombstones.worker
    from tombstones.models import Job

    t0 = time.perf_counter()
    with transaction.atomic():  # one request, one enqueue
        job = tombstones.enqueue(HANDLER, record)
    runs = 0
    status = Job.Status.QUEUED
    while True:
        tombstones.worker.run()
        runs += 1
        elapsed = time.perf_counter() - t0
        status = Job.objects.filter(pk=job.pk).values_list("status", flat=True).get()
        if status in Job.TERMINAL or elapsed > args.bound:
            break
        time.sleep(args.poll)
    done = status in Job.TERMINAL
    row = Job.objects.filter(pk=job.pk).values("created_at", "started_at").get()
    db_claim = (
        (row["started_at"] - row["created_at"]).total_seconds()
        if done and row["started_at"]
        else None
    )
    if not done:
        Job.objects.filter(pk=job.pk, status=Job.Status.QUEUED).update(status=Job.Status.CANCELLED)
    return {
        "job": job.pk,
        "claimed": done,
        "status": str(status),
        "seconds": round(elapsed, 3) if done else None,
        "waited_s": round(elapsed, 3),
        "runs": runs,
        "db_enqueue_to_start_s": round(db_claim, 4) if db_claim is not None else None,
    }


def in_new_worker(args: argparse.Namespace, record: Any) -> dict[str, Any]:
    """:func:`time_to_claim` in a forked process, as django-q2 forks its workers: a worker
    that has claimed nothing yet (its first claims are ``whole=False``)."""
    from django.db import connections

    connections.close_all()  # the child opens its own
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the new worker
        os.close(read)
        code = 0
        try:
            result = time_to_claim(args, record)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result, code = {"error": f"{type(exc).__name__}: {exc}", "claimed": False}, 1
        try:
            with os.fdopen(write, "w") as pipe:
                pipe.write(json.dumps(result))
            connections.close_all()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data or '{"error": "no result", "claimed": false}')


def one_case(args: argparse.Namespace, kind: str, n: int) -> dict[str, Any]:
    from django.db import transaction

    import tombstones

    load = os.getloadavg()[0]
    fresh, setup = build(args, kind, n)
    case: dict[str, Any] = {"kind": kind, "lanes": n, "setup": setup, "claim": {}}
    # The machine is shared: the 1-minute load average before the setup and after the case.
    case["load_1m"] = [round(load, 2)]
    # Right after the burst: every job just enqueued has its hint due (the heads' block wrote no
    # hint), and a fresh job's hint is the last of them: claims look at each once first.
    case["hints_after_burst"] = hinted_count()
    case["fresh_after_burst"] = time_to_claim(args, fresh[3])
    case["hints_left"] = hinted_count()
    # Nothing claimable: the claim should find nothing, at a cost that does not follow N.
    for mode, whole in MODES:
        case["claim"][f"idle_{mode}"] = time_claims(args, whole, rollback=False)
    case["wakeup_idle"] = time_wakeups(args)
    # One fresh job on another record: is it claimed, and how fast? By this process (its last
    # claim ran a quick job: whole claims) and by a new worker process (share claims).
    case["fresh"] = time_to_claim(args, fresh[0])
    case["fresh_new_worker"] = in_new_worker(args, fresh[1])
    # Another fresh job, claimable: the claim's cost with one job to hand out (rolled back).
    with transaction.atomic():
        probe = tombstones.enqueue(HANDLER, fresh[2])
    for mode, whole in MODES:
        found = time_claims(args, whole, rollback=True)
        found["took_fresh"] = probe.pk in found["taken"]
        case["claim"][f"fresh_{mode}"] = found
    case["load_1m"].append(round(os.getloadavg()[0], 2))
    return case


# --- the table ------------------------------------------------------------------------------


def ratios(cases: list[dict[str, Any]]) -> None:
    """``ratio``: a claim's median at N over its median at the smallest N of the same kind."""
    for case in cases:
        smallest = min((c for c in cases if c["kind"] == case["kind"]), key=lambda c: c["lanes"])
        for key, found in case["claim"].items():
            base = smallest["claim"].get(key, {}).get("ms_median")
            found["ratio"] = round(found["ms_median"] / base, 2) if base else None


def outcome(probe: dict[str, Any]) -> tuple[str, str]:
    """(claimed?, seconds to claim) of a probe, as printed."""
    if probe.get("error"):
        return "error", "-"
    if probe["claimed"]:
        return "yes", f"{probe['seconds']:.2f}"
    return "starved", f">{probe['waited_s']:.0f}"


def one_line(case: dict[str, Any]) -> str:
    warm, new = outcome(case["fresh"]), outcome(case["fresh_new_worker"])
    burst = outcome(case["fresh_after_burst"])
    claims = ", ".join(
        f"{k} {v['ms_median']} ms/{v['statements']} st" for k, v in case["claim"].items()
    )
    return (
        f"{case['kind']:8} N={case['lanes']:<6} setup {case['setup']['setup_s']} s "
        f"(load {'/'.join(str(v) for v in case.get('load_1m', []))}); "
        f"after the burst ({case['hints_after_burst']} hints due): {burst[0]} {burst[1]} s; "
        f"fresh job: warm worker {warm[0]} {warm[1]} s, new worker {new[0]} {new[1]} s; "
        f"claim {claims}"
    )


def render(db: str, data: dict[str, Any]) -> str:
    head = (
        "| kind | N | after the burst: hints, s to claim "
        "| claimed? warm / new worker | s to claim warm / new | claim "
        "| idle ms p50 / p90 | st | xN0 | fresh ms p50 / p90 | st | took it? | xN0 "
        "| wake-up ms p50 | st |"
    )
    loads = [v for case in data["cases"] for v in case.get("load_1m", [])]
    load = f", load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    lines = [
        f"{db} ({data.get('server', '')}{load})",
        "",
        head,
        "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for case in data["cases"]:
        warm, new = outcome(case["fresh"]), outcome(case["fresh_new_worker"])
        burst = outcome(case["fresh_after_burst"])
        wake = case["wakeup_idle"]
        for i, (mode, _) in enumerate(MODES):
            idle, found = case["claim"][f"idle_{mode}"], case["claim"][f"fresh_{mode}"]
            first = i == 0
            cells = [
                case["kind"] if first else "",
                f"{case['lanes']:,}" if first else "",
                f"{case['hints_after_burst']:,}, {burst[1]}" if first else "",
                f"{warm[0]} / {new[0]}" if first else "",
                f"{warm[1]} / {new[1]}" if first else "",
                mode,
                f"{idle['ms_median']:.2f} / {idle['ms_p90']:.2f}",
                str(idle["statements"]),
                fmt(idle.get("ratio"), ".2f"),
                f"{found['ms_median']:.2f} / {found['ms_p90']:.2f}",
                str(found["statements"]),
                "yes" if found["took_fresh"] else "no",
                fmt(found.get("ratio"), ".2f"),
                f"{wake['ms_median']:.1f}" if first else "",
                str(wake["statements"]) if first else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "after the burst: one fresh job enqueued right after the setup's enqueues, whose hints",
        "are all due (its own the last): seconds until a warm worker's run() calls finished it.",
        "claimed?: the fresh job, run by this process (a warm worker: its last claim ran a quick",
        "job, so it claims whole=True) / by a new forked worker (its first claims: whole=False);",
        "'starved' = still queued after the bound; run() names no job (the claim finds it).",
        "claim: `share` = ledger.claim(whole=False),",
        "`whole` = ledger.claim(whole=True), both with the batch size and the cluster's workers.",
        "idle: nothing claimable; fresh: one fresh job claimable (each call rolled back).",
        "st: SQL statements per call; xN0: median over the median at the smallest N.",
    ]
    return "\n".join(lines)


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else f"{value:{spec}}"


if __name__ == "__main__":
    sys.exit(main())
