"""What does the fencing cost? Plain django-q2 tasks vs fenced jobs, measured in one run.

    .venv/bin/python bench/run.py                      # the full matrix (see bench/README.md)
    .venv/bin/python bench/run.py --db sqlite --workers 2 --mix bursty --jobs 500 --reps 1
    .venv/bin/python bench/run.py --soak 100000        # worker RSS over many fenced ordered jobs

Variants, each on the same database, broker, worker count and job list:

- ``baseline``: ``async_task("bench.tasks.plain_touch", pk)``, an unguarded UPDATE, every
  result saved, a connection per task (the demo's ``CONN_MAX_AGE = 0``);
- ``baseline-fast``: the plain task a careful user would run: results not saved
  (``save=False``), persistent connections (``CONN_MAX_AGE``), completion read from the column
  it writes;
- ``unordered``: ``tombstones.enqueue("bench.touch", record, ordering_key=<unique>)``;
- ``ordered``: ``tombstones.enqueue("bench.touch", record)`` (the record's lane).

Opt-in (``--variants ordered,tasks,tasks-db,baseline-fast``): Django's tasks framework.

- ``tasks``: ``bench.benchapp.tasks.touch.enqueue(record)``, a ``@task`` of ``TombstoneBackend``
  doing the ``ordered`` variant's fenced write (``context.update``), run by the same qcluster;
- ``tasks-db``: ``bench.benchapp.tasks_db.touch.enqueue(pk)``, django-tasks-db's
  ``DatabaseBackend`` (the ``bench`` extra) doing ``baseline-fast``'s unfenced write, run by
  ``--workers`` ``manage.py db_worker`` processes (bench/db_workers.py) polling every
  ``--db-worker-interval`` seconds (default 0: no sleep), persistent connections as
  ``baseline-fast``.

Per repetition: reset the tables, create the entities, start a real ``manage.py qcluster``
(project/stress/cluster.py) and wait until it ran a ping task; then start the clock, enqueue
every job from this process, wait until every job finished (ledger / django-q2 task rows, with
a timeout), stop the clock, let the cluster drain its leftover messages, stop it.

One (database, broker) pair runs per child process (Django settings are per process); the
parent merges, prints the table and writes the JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The default --variants (make bench's matrix); the tasks variants are opt-in.
VARIANTS = ("baseline", "baseline-fast", "unordered", "ordered")
TASKS_VARIANTS = ("tasks", "tasks-db")
# Every variant, in the order of the table.
ALL_VARIANTS = ("baseline", "baseline-fast", "tasks-db", "unordered", "ordered", "tasks")
PLAIN = "bench.tasks.plain_touch"
FAST = "bench.tasks.fast_touch"
# The tasks variants' @task functions (their module paths: django-tasks-db's task_path).
TASK = "bench.benchapp.tasks.touch"
DB_TASK = "bench.benchapp.tasks_db.touch"
DB_BACKEND = "tasks_db"  # the TASKS alias of django-tasks-db in bench/settings.py
# CONN_MAX_AGE of the baseline-fast cluster (seconds): connections kept across tasks.
FAST_CONN_MAX_AGE = 600
HANDLER = "bench.touch"
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
DEFAULT_SQLITE = "/tmp/tombstones-bench/bench.sqlite3"
BROKER_FOR = {"postgres": "redis", "sqlite": "orm"}


# --- arguments -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--db", default="postgres,sqlite", help="postgres,sqlite (comma list)")
    p.add_argument(
        "--broker",
        default="auto",
        help="orm,redis (comma list; crossed with --db); auto: postgres+redis, sqlite+orm",
    )
    p.add_argument("--workers", default="1,2,4", help="Q_WORKERS values (comma list)")
    p.add_argument("--jobs", type=int, default=300, help="jobs per run")
    p.add_argument(
        "--mix", default="many,bursty", help="many (1 job/entity), bursty, hot (1 entity)"
    )
    p.add_argument("--burst", type=int, default=20, help="jobs per entity in the bursty mix")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median, min, max)")
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"default {','.join(VARIANTS)}; also {','.join(TASKS_VARIANTS)} (Django's tasks)",
    )
    p.add_argument(
        "--db-worker-interval",
        type=float,
        default=0.0,
        help="tasks-db: db_worker --interval, seconds between polls of an idle worker (0: none)",
    )
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to finish after the last enqueue"
    )
    p.add_argument("--rss-interval", type=float, default=0.25, help="RSS sampling period (s)")
    p.add_argument(
        "--backlog",
        action="store_true",
        help="pause the cluster (SIGSTOP) while enqueueing: jobs/s is the drain of a backlog",
    )
    p.add_argument("--soak", type=int, default=0, help="N fenced ordered jobs, RSS over time")
    p.add_argument("--soak-recycle", action="store_true", help="keep django-q2's recycling")
    p.add_argument("--conn-max-age", type=int, default=None, help="CONN_MAX_AGE for all sides")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", DEFAULT_PG))
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    p.add_argument("--sqlite-path", default=os.environ.get("BENCH_SQLITE", DEFAULT_SQLITE))
    p.add_argument("--pgbench", default="auto", help="auto|no: the SQL-only ceiling (postgres)")
    p.add_argument("--pgbench-seconds", type=int, default=10)
    p.add_argument("--keep-logs", action="store_true", help="keep the qcluster logs")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def check_variants(args: argparse.Namespace) -> None:
    """Refuse an unknown variant, and tasks-db without django-tasks-db, before anything runs."""
    from importlib.util import find_spec

    variants = csv(args.variants)
    unknown = [v for v in variants if v not in ALL_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown --variants {','.join(unknown)}: one of {','.join(ALL_VARIANTS)}")
    if "tasks-db" in variants and find_spec("django_tasks_db") is None:
        raise SystemExit(
            "--variants tasks-db needs django-tasks-db, a bench-only dependency: "
            f'{Path(sys.executable).name} -m pip install -e ".[bench]" (make bench does it)'
        )
    if args.db_worker_interval < 0:
        raise SystemExit("--db-worker-interval must be 0 or more")


def combos(args: argparse.Namespace) -> list[tuple[str, str]]:
    dbs = csv(args.db)
    for db in dbs:
        if db not in BROKER_FOR:
            raise SystemExit(f"unknown --db {db!r}")
    if args.broker == "auto":
        return [(db, BROKER_FOR[db]) for db in dbs]
    brokers = csv(args.broker)
    for broker in brokers:
        if broker not in ("orm", "redis"):
            raise SystemExit(f"unknown --broker {broker!r}")
    return [(db, broker) for db in dbs for broker in brokers]


# --- parent: one child per (database, broker), then the table ----------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_variants(args)
    interrupt_on_signals()
    if args.child:
        return child(args)
    started = time.time()
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, "bench/run.py", *(argv or sys.argv[1:])]),
        "machine": machine(),
        "settings": {
            "jobs": args.jobs,
            "reps": args.reps,
            "burst": args.burst,
            "workers": csv(args.workers),
            "mix": csv(args.mix),
            "variants": csv(args.variants),
            "soak": args.soak,
            "conn_max_age": args.conn_max_age,
            "db_worker_interval": args.db_worker_interval,
            "clock": "drain (backlog)" if args.backlog else "enqueue+run",
        },
        "code": {"git": git_head(), "tombstones_sha256": code_fingerprint()},
        "runs": [],
        "soaks": [],
        "pgbench": None,
    }
    for db, broker in combos(args):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            out = tmp.name
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--db", db]
        cmd += ["--broker", broker, "--json", out]
        cmd += strip_parent_args(argv if argv is not None else sys.argv[1:])
        print(f"== {db} + {broker} broker", flush=True)
        code = call_child(cmd)
        try:
            data = json.loads(Path(out).read_text() or "{}")
        except (OSError, ValueError):
            data = {}
        finally:
            Path(out).unlink(missing_ok=True)
        if code != 0:
            print(f"!! the {db}+{broker} child exited with {code}", flush=True)
        results["runs"].extend(data.get("runs", []))
        if data.get("soak"):
            soak_run = data["soak"]
            for key in ("sql_breakdown", "enqueue_breakdown"):
                soak_run[key] = mean_breakdown([soak_run], key)
            results["soaks"].append(soak_run)
    if "postgres" in csv(args.db) and args.pgbench != "no" and not args.soak:
        from bench import pgbench_ceiling

        clients = [int(w) for w in csv(args.workers)]
        results["pgbench"] = pgbench_ceiling.run(
            args.pg_url, clients=clients, seconds=args.pgbench_seconds
        )
    results["summary"] = summarise(results["runs"])
    compact(results)
    versions = sorted({r.get("code", "") for r in results["runs"]} | {code_fingerprint()})
    results["code"]["versions_seen"] = versions
    if len(versions) > 1:
        print(f"!! tombstones/ changed during the benchmark: {versions}", flush=True)
    results["seconds"] = round(time.time() - started, 1)
    print()
    print(render(results))
    if args.json:
        write_json(args.json, results)
        print(f"\nJSON: {args.json}")
    return 0


def write_json(path: str, results: dict[str, Any]) -> None:
    """A bench script's JSON (indented, keys sorted), its folder made if missing."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def run_header(script: str, argv: list[str] | None) -> dict[str, Any]:
    """What every bench script's JSON starts with: its command, date, machine and code."""
    return {
        "command": " ".join([Path(sys.executable).name, script, *(argv or sys.argv[1:])]),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(),
        "code": {"git": git_head(), "tombstones_sha256": code_fingerprint()},
    }


def interrupt_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt (a background shell may have SIGINT ignored),
    so the ``finally`` blocks stop the cluster."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def call_child(cmd: list[str]) -> int:
    proc = subprocess.Popen(cmd, cwd=str(ROOT))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        raise


def code_fingerprint() -> str:
    """A hash of the library's source: runs measured on different code are told apart."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "tombstones").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=str(ROOT), capture_output=True, text=True, check=False)
    return out.stdout.strip()


def git_head() -> str:
    try:
        dirty = _git("status", "--porcelain", "tombstones")
        return _git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")
    except OSError:
        return ""


def strip_parent_args(
    argv: list[str], names: tuple[str, ...] = ("--db", "--broker", "--json")
) -> list[str]:
    """The user's arguments minus ``names``, which the parent sets per child."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in names:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def machine() -> dict[str, Any]:
    import django
    import django_q

    try:
        import psutil

        memory = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        memory = None
    return {
        "cpus": os.cpu_count(),
        "memory_gib": memory,
        "python": platform.python_version(),
        "django": django.__version__,
        "django_q2": getattr(django_q, "__version__", ""),
        "platform": platform.platform(),
    }


# --- child: one (database, broker) pair --------------------------------------------------------


def child(args: argparse.Namespace) -> int:
    db, broker = args.db, args.broker
    setup_django(args, db, broker)
    out: dict[str, Any] = {"runs": [], "soak": None}
    if args.soak:
        out["soak"] = soak(args, db, broker)
    else:
        variants = csv(args.variants)
        for workers in [int(w) for w in csv(args.workers)]:
            for mix in csv(args.mix):
                for rep in range(args.reps):
                    # Rotate the order per repetition: drift (caches, autovacuum) hits every
                    # variant alike.
                    shift = rep % len(variants)
                    for variant in variants[shift:] + variants[:shift]:
                        run = run_retrying(args, db, broker, variant, workers, mix, args.jobs)
                        run["rep"] = rep
                        out["runs"].append(run)
                        print(one_line(run), flush=True)
                        if args.json:  # partial results survive an interrupted matrix
                            Path(args.json).write_text(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out))
    return 0


def run_retrying(
    args: argparse.Namespace, db: str, broker: str, variant: str, workers: int, mix: str, jobs: int
) -> dict[str, Any]:
    """run_once, again from scratch when the database went away (a shared server restarted)."""
    from django.db import DatabaseError, connections

    for attempt in range(3):
        try:
            run = run_once(args, db, broker, variant, workers, mix, jobs)
            run["retries"] = attempt
            return run
        except DatabaseError as exc:
            print(
                f"!! {variant} w={workers} {mix}: {type(exc).__name__}: {exc}; retrying", flush=True
            )
            connections.close_all()
            deadline = time.time() + 120
            while time.time() < deadline:
                try:
                    connections["default"].ensure_connection()
                    break
                except DatabaseError:
                    connections.close_all()
                    time.sleep(2)
    return run_once(args, db, broker, variant, workers, mix, jobs)


def setup_django(args: argparse.Namespace, db: str, broker: str) -> None:
    if db == "postgres":
        ensure_pg_database(args.pg_url)
        os.environ["DATABASE_URL"] = args.pg_url
    else:
        Path(args.sqlite_path).parent.mkdir(parents=True, exist_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{Path(args.sqlite_path).resolve()}"
    os.environ["REDIS_URL"] = args.redis_url if broker == "redis" else ""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ.setdefault("TEST_DB_SUFFIX", "")
    if args.conn_max_age is not None:
        os.environ["BENCH_CONN_MAX_AGE"] = str(args.conn_max_age)
    import django

    django.setup()
    from django.core.management import call_command

    from bench import sqlcount

    sqlcount.install()
    call_command("migrate", verbosity=0, interactive=False)


def ensure_pg_database(url: str) -> None:
    """Create the scratch database when missing (never a test database)."""
    from urllib.parse import urlparse

    import psycopg

    parts = urlparse(url)
    name = parts.path.lstrip("/")
    if not name or name.startswith("test"):
        raise SystemExit(f"refusing database {name!r}: use a scratch database such as 'bench'")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not found:
            conn.execute(f'CREATE DATABASE "{name}"')


def reset_tables() -> None:
    from django.core.management.color import no_style
    from django.db import connection
    from django_q.models import OrmQ, Task

    from project.customers.models import Customer, SheetRow
    from tombstones.models import Job, JobEvent

    tables = [m._meta.db_table for m in (JobEvent, Job, Task, OrmQ, SheetRow, Customer)]
    db_result = db_task_result_model()
    if db_result is not None:
        tables.append(db_result._meta.db_table)
    sql = connection.ops.sql_flush(no_style(), tables, reset_sequences=True, allow_cascade=True)
    connection.ops.execute_sql_flush(sql)


def db_task_result_model() -> Any:
    """django-tasks-db's task table (DBTaskResult), or None when it is not installed."""
    from django.apps import apps

    if not apps.is_installed("django_tasks_db"):
        return None
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult


def seed(mix: str, jobs: int, burst: int) -> list[Any]:
    """Create the entities; return the record of every job, in enqueue order."""
    from django.db import connection, models

    from project.customers.models import Customer

    if mix == "many":
        entities, per = jobs, 1
    elif mix == "hot":  # every job for one record: one lane, drained serially
        entities, per = 1, jobs
    elif mix == "bursty":
        per = max(1, burst)
        entities = max(1, jobs // per)
    else:
        raise SystemExit(f"unknown --mix {mix!r}")
    rows = [
        Customer(reference=f"B{i:07d}", name="Bench", email="bench@example.invalid")
        for i in range(entities)
    ]
    models.QuerySet(Customer).bulk_create(rows, batch_size=500)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE customers_customer")
    records = list(Customer.objects.order_by("pk"))
    # Bursty: each entity's jobs back to back (a save storm), entity after entity.
    plan = [record for record in records for _ in range(per)]
    return plan[:jobs] if len(plan) >= jobs else plan + records[: jobs - len(plan)]


class RssSampler(threading.Thread):
    """Sample the RSS of the cluster's process tree (psutil) every ``interval`` seconds."""

    def __init__(self, root_pid: int, interval: float, series: bool = False) -> None:
        super().__init__(daemon=True, name="bench-rss")
        self.root_pid = root_pid
        self.interval = interval
        self.peak: dict[int, int] = {}
        self.parent: dict[int, int] = {}
        self.series: list[tuple[float, dict[int, int]]] | None = [] if series else None
        self.halt = threading.Event()

    def sample(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        now: dict[int, int] = {}
        for proc in procs:
            try:
                rss = proc.memory_info().rss
                self.parent.setdefault(proc.pid, proc.ppid())
            except psutil.Error:
                continue
            now[proc.pid] = rss
            self.peak[proc.pid] = max(rss, self.peak.get(proc.pid, 0))
        if self.series is not None:
            self.series.append((time.time(), now))

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.interval)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)

    def role(self, pid: int, roles: dict[int, str]) -> str:
        if roles.get(pid):
            return roles[pid]
        if pid == self.root_pid:
            return "main"
        if self.parent.get(pid) == self.root_pid:
            return "sentinel"
        return "pusher"


def db_workers_class() -> Any:
    """The tasks-db variant's runner: ``Cluster``'s start, stop, SIGSTOP and logs, for N
    ``manage.py db_worker`` processes under bench/db_workers.py (defined here: it subclasses
    project.stress.cluster.Cluster, which reads the settings at import)."""
    from project.stress.cluster import Cluster

    class DbWorkers(Cluster):
        def __init__(self, workers: int, *, interval: float, **kwargs: Any) -> None:
            super().__init__(workers, **kwargs)
            self.interval = interval

        def command(self) -> list[str]:
            return [
                sys.executable,
                str(ROOT / "bench" / "db_workers.py"),
                str(self.workers),
                "--backend",
                DB_BACKEND,
                "--interval",
                f"{self.interval:g}",
                "--no-startup-delay",
                "--no-reload",
            ]

        def launch(self) -> Any:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            self.process = subprocess.Popen(
                self.command(),
                cwd=str(ROOT),
                env=self.environment(),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # one process group: --backlog's SIGSTOP, stop()
            )
            return self

        def wait_ready(self, timeout: float) -> None:
            """A ping task recorded as successful, and every worker in its polling loop (its
            counter file shows a look at the task table)."""
            from bench import sqlcount
            from bench.benchapp.tasks_db import ping

            table = db_task_result_model()._meta.db_table
            ping_id = ping.enqueue().id
            sqldir = self.extra_env["BENCH_SQL_DIR"]
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"db_workers exited early:\n{self.log_tail()}")
                polling = [
                    pid
                    for pid, d in sqlcount.read_dir(sqldir).items()
                    if d.get("role") == "worker"
                    and any(sql.startswith("SELECT") and table in sql for sql in d["statements"])
                ]
                done = (
                    db_task_result_model().objects.filter(id=ping_id, status="SUCCESSFUL").exists()
                )
                if done and len(polling) >= self.workers:
                    return
                time.sleep(0.1)
            raise TimeoutError(f"db_workers not ready after {timeout}s:\n{self.log_tail()}")

    return DbWorkers


def pause_safely(pid: int) -> None:
    """SIGSTOP the process group ``pid`` (--backlog). On SQLite, never while one of its processes
    holds the write lock (django-tasks-db's workers poll in an EXCLUSIVE transaction; a worker
    stopped inside one would block every enqueue): probe with a write lock of our own, and if it
    is taken, let the group run a moment and stop it again."""
    import sqlite3

    from django.db import connection

    os.killpg(pid, signal.SIGSTOP)
    if connection.vendor != "sqlite":
        return
    for _ in range(200):
        probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.killpg(pid, signal.SIGCONT)
            time.sleep(0.005)
            os.killpg(pid, signal.SIGSTOP)
        finally:
            probe.close()
    raise RuntimeError("--backlog: the paused workers keep holding SQLite's write lock")


def run_once(
    args: argparse.Namespace,
    db: str,
    broker: str,
    variant: str,
    workers: int,
    mix: str,
    jobs: int,
    *,
    extra_env: dict[str, str] | None = None,
    series: bool = False,
    partial: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from bench import sqlcount
    from project.stress.cluster import Cluster

    reset_tables()
    plan = seed(mix, jobs, args.burst)
    n = len(plan)
    sqldir = tempfile.mkdtemp(prefix="tombstones-bench-sql-")
    env = {
        "BENCH_SQL_DIR": sqldir,
        "TOMBSTONES_LOG_LEVEL": os.environ.get("TOMBSTONES_LOG_LEVEL", "INFO"),
    }
    if args.conn_max_age is not None:
        env["BENCH_CONN_MAX_AGE"] = str(args.conn_max_age)
    elif variant in ("baseline-fast", "tasks-db"):
        # tasks-db too: db_worker closes a connection older than CONN_MAX_AGE after every poll,
        # so the demo's 0 would cost it a new connection per task.
        env["BENCH_CONN_MAX_AGE"] = str(FAST_CONN_MAX_AGE)
    env.update(extra_env or {})
    log_path = str(Path(sqldir).with_suffix(".qcluster.log"))
    if variant == "tasks-db":
        env["BENCH_SQL_ROLE"] = "worker"
        cluster = db_workers_class()(
            workers,
            interval=args.db_worker_interval,
            settings_module="bench.settings",
            env=env,
            log_path=log_path,
        )
    else:
        cluster = Cluster(workers, settings_module="bench.settings", env=env, log_path=log_path)
    cluster.start(ready_timeout=90)
    assert cluster.process is not None
    sampler = RssSampler(cluster.process.pid, args.rss_interval, series=series)
    sampler.start()
    if partial is not None:  # what a soak can still report if the run dies half way
        partial.update(sampler=sampler, sqldir=sqldir, t0=time.time())
    result: dict[str, Any] = {
        "db": db,
        "broker": broker,
        "workers": workers,
        "mix": mix,
        "variant": variant,
        "jobs": n,
        "entities": len({r.pk for r in plan}),
        # Other load on the machine while this run ran (1-minute load average, before/after).
        "loadavg_before": round(os.getloadavg()[0], 2),
        "code": code_fingerprint(),
    }
    try:
        time.sleep(2 * sqlcount.FLUSH_SECONDS + 0.1)
        before = sqlcount.read_dir(sqldir)
        with cluster.messages():
            enq_before = sqlcount.snapshot()
            if args.backlog:
                # Pause the whole cluster while enqueueing: the clock of the drain starts at
                # SIGCONT, with every message waiting (worker throughput, not the enqueue's).
                pause_safely(cluster.process.pid)
            try:
                sent, t0, t_enqueued = enqueue_all(variant, plan)
            finally:
                if args.backlog:
                    os.killpg(cluster.process.pid, signal.SIGCONT)
            t_start = time.time() if args.backlog else t0
            enq_after = sqlcount.snapshot()
            # The timeout counts from the last enqueue (or the SIGCONT of a backlog run).
            complete = wait_done(variant, n, max(t_start, t_enqueued) + args.timeout, cluster)
            if variant != "tasks-db":  # no django-q2 there
                settle(broker, cluster.name)
        time.sleep(3 * sqlcount.FLUSH_SECONDS)
        after = sqlcount.read_dir(sqldir)
    finally:
        sampler.stop()
        cluster.stop()
    result["loadavg_after"] = round(os.getloadavg()[0], 2)
    result["clock"] = "drain (backlog)" if args.backlog else "enqueue+run"
    result.update(collect(variant, n, sent, t0, t_enqueued, t_start))
    result["complete"] = complete and result["finished"] == n
    if variant in TASKS_VARIANTS:  # completion: every job succeeded
        result["complete"] = result["complete"] and result["outcomes"].get("succeeded") == n
    result.update(enqueue_summary(enq_before, enq_after, n))
    diffs = sqlcount.diff(before, after)
    result.update(sql_summary(diffs, sampler, n))
    if variant == "tasks-db":
        discount_idle_polls(result, diffs, n)
    result.update(rss_summary(sampler, sqlcount.read_dir(sqldir)))
    if series and sampler.series is not None:
        result["rss_series"] = rss_series(sampler, sqlcount.read_dir(sqldir), t0)
    if not result["complete"] and not args.keep_logs:
        result["log_tail"] = cluster.log_tail(20)
    if not args.keep_logs:
        shutil.rmtree(sqldir, ignore_errors=True)
        Path(log_path).unlink(missing_ok=True)
    return result


def enqueue_all(variant: str, plan: list[Any]) -> tuple[dict[str, float], float, float]:
    """Enqueue every job, each in its own transaction (one request = one enqueue)."""
    from django_q.tasks import async_task

    import tombstones

    sent: dict[str, float] = {}
    t0 = time.time()
    if variant == "baseline":
        for record in plan:
            sent[str(async_task(PLAIN, record.pk))] = time.time()
    elif variant == "baseline-fast":
        for record in plan:
            async_task(FAST, record.pk, save=False)
    elif variant == "ordered":
        for record in plan:
            tombstones.enqueue(HANDLER, record)
    elif variant == "unordered":
        run = uuid.uuid4().hex[:8]
        for i, record in enumerate(plan):
            tombstones.enqueue(HANDLER, record, ordering_key=f"bench:{run}:{i}")
    elif variant == "tasks":
        from bench.benchapp.tasks import touch

        for record in plan:
            touch.enqueue(record)
    elif variant == "tasks-db":
        from bench.benchapp.tasks_db import touch as db_touch

        for record in plan:
            db_touch.enqueue(record.pk)
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    return sent, t0, time.time()


def finished_count(variant: str) -> int:
    from django_q.models import Task

    from tombstones.models import Job

    if variant == "baseline":
        return Task.objects.filter(func=PLAIN).count()
    if variant == "baseline-fast":
        return _fast_done()[0]
    if variant == "tasks-db":
        return _db_tasks().filter(status__in=("SUCCESSFUL", "FAILED")).count()
    return Job.objects.filter(status__in=Job.TERMINAL).count()


def _db_tasks() -> Any:
    """The tasks-db variant's rows of django-tasks-db's task table (not the ready ping's)."""
    return db_task_result_model().objects.filter(task_path=DB_TASK)


def _fast_done() -> tuple[int, Any]:
    """baseline-fast: (writes done, the last one's time), from the column the task writes."""
    from django.db.models import F, Max, Sum

    from project.customers.models import Customer

    found = Customer.all_objects.aggregate(done=Sum(F("version") - 1), last=Max("synced_at"))
    return int(found["done"] or 0), found["last"]


def wait_done(variant: str, n: int, deadline: float, cluster: Any) -> bool:
    # Looks at least once: a long enqueue (a soak) may end past the deadline with all jobs done.
    while True:
        if finished_count(variant) >= n:
            return True
        if cluster.process is not None and cluster.process.poll() is not None:
            return False
        if time.time() >= deadline:
            return False
        time.sleep(0.2)


def settle(broker: str, name: str, limit: float = 15.0) -> None:
    """Let the cluster finish its leftover messages (wake-ups of drained jobs, results)."""
    from django_q.brokers import get_broker
    from django_q.models import OrmQ, Task

    queue = get_broker(list_key=name)
    deadline = time.time() + limit
    last = -1
    while time.time() < deadline:
        tasks = Task.objects.count()
        waiting = (
            OrmQ.objects.filter(key=name).count() if broker == "orm" else queue.queue_size() or 0
        )
        if waiting == 0 and tasks == last:
            return
        last = tasks
        time.sleep(0.3)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def collect(
    variant: str, n: int, sent: dict[str, float], t0: float, t_enqueued: float, t_start: float
) -> dict[str, Any]:
    from django_q.models import Task

    from tombstones.models import Job

    latencies: list[float] = []
    finishes: list[float] = []
    outcomes: Counter[str] = Counter()
    rereads = 0
    if variant == "baseline":
        for task_id, stopped, success in Task.objects.filter(func=PLAIN).values_list(
            "id", "stopped", "success"
        ):
            outcomes["succeeded" if success else "failed"] += 1
            end = stopped.timestamp()
            finishes.append(end)
            if task_id in sent:
                latencies.append(end - sent[task_id])
    elif variant == "baseline-fast":
        done, last = _fast_done()
        outcomes["succeeded"] = done
        if last is not None:
            finishes = [last.timestamp()] * done  # per-job times are not kept: no latency
    elif variant == "tasks-db":
        names = {"SUCCESSFUL": "succeeded", "FAILED": "failed"}
        for enqueued, finished, status in _db_tasks().values_list(
            "enqueued_at", "finished_at", "status"
        ):
            outcomes[names.get(status, status.lower())] += 1
            if finished is not None:
                end = finished.timestamp()
                finishes.append(end)
                latencies.append(end - enqueued.timestamp())
    else:
        for created, finished, status, rr in Job.objects.values_list(
            "created_at", "finished_at", "status", "rereads"
        ):
            outcomes[status] += 1
            rereads += rr
            if finished is not None:
                end = finished.timestamp()
                finishes.append(end)
                latencies.append(end - created.timestamp())
    q_tasks = Task.objects.exclude(func="project.stress.cluster.ping")
    elapsed = (max(finishes) - t_start) if finishes else None
    return {
        "finished": len(finishes),
        "elapsed_s": round(elapsed, 3) if elapsed else None,
        "jobs_per_s": round(len(finishes) / elapsed, 1) if elapsed else None,
        "enqueue_s": round(t_enqueued - t0, 3),
        "enqueue_per_s": round(n / (t_enqueued - t0), 1),
        "latency_p50_ms": _ms(pct(latencies, 0.5)),
        "latency_p95_ms": _ms(pct(latencies, 0.95)),
        "outcomes": dict(outcomes),
        "rereads": rereads,
        "q_tasks_per_job": round(q_tasks.count() / max(n, 1), 3),
        "q_tasks_failed": q_tasks.filter(success=False).count(),
    }


def sql_summary(diffs: dict[int, dict[str, Any]], sampler: RssSampler, n: int) -> dict[str, Any]:
    """Statements per job in the cluster: data statements apart from transaction control."""
    from bench.sqlcount import is_tx_control

    roles = {pid: d["role"] for pid, d in diffs.items()}
    data = tx = commits = connects = autocommit_writes = 0
    by_role: Counter[str] = Counter()
    statements: Counter[tuple[str, str]] = Counter()
    for pid, d in diffs.items():
        role = sampler.role(pid, roles)
        commits += d["commits"]
        connects += d["connects"]
        autocommit_writes += d.get("autocommit_writes", 0)
        for sql, c in d["statements"].items():
            statements[(role, sql)] += c
            if is_tx_control(sql):
                tx += c
            else:
                data += c
                by_role[role] += c
    per = max(n, 1)
    return {
        "sql_per_job": round(data / per, 3),
        "sql_per_job_worker": round(by_role["worker"] / per, 3),
        "sql_per_job_by_role": {k: round(v / per, 3) for k, v in sorted(by_role.items())},
        "tx_control_per_job": round(tx / per, 3),
        "commits_per_job": round(commits / per, 3),
        "autocommit_writes_per_job": round(autocommit_writes / per, 3),
        # Durable write transactions: atomic blocks committed + writes in autocommit.
        "write_tx_per_job": round((commits + autocommit_writes) / per, 3),
        "connects_per_job": round(connects / per, 3),
        "sql_breakdown": [
            {"role": role, "per_job": round(c / per, 3), "sql": sql[:300]}
            for (role, sql), c in statements.most_common()
            if c / per >= 0.002
        ],
    }


def discount_idle_polls(result: dict[str, Any], diffs: dict[int, dict[str, Any]], n: int) -> None:
    """tasks-db: leave out the polls that found no task (at --db-worker-interval 0 an idle
    worker polls without pause, so their number is the harness's reaction time, not the jobs'
    cost): each is a SELECT of the task table in a transaction of its own, committed, and every
    other poll claims its task (an UPDATE setting its status and started_at). Reported apart as
    ``idle_polls_per_job``; the statement breakdown keeps them."""
    table = db_task_result_model()._meta.db_table
    polls = claims = 0
    for d in diffs.values():
        for sql, count in d["statements"].items():
            if table not in sql:
                continue
            if sql.startswith("SELECT"):
                polls += count
            elif sql.startswith("UPDATE") and 'SET "status" = %s, "started_at"' in sql:
                claims += count
    idle = max(polls - claims, 0)
    per = max(n, 1)
    raw_commits = round(result["commits_per_job"] * per)
    idle_commits = min(idle, raw_commits)
    result["idle_polls_per_job"] = round(idle / per, 3)
    result["sql_per_job"] = round(result["sql_per_job"] - idle / per, 3)
    result["sql_per_job_worker"] = round(result["sql_per_job_worker"] - idle / per, 3)
    by_role = result["sql_per_job_by_role"]
    if "worker" in by_role:
        by_role["worker"] = round(by_role["worker"] - idle / per, 3)
    result["commits_per_job"] = round((raw_commits - idle_commits) / per, 3)
    result["write_tx_per_job"] = round(result["write_tx_per_job"] - idle_commits / per, 3)


def enqueue_summary(before: dict[str, Any], after: dict[str, Any], n: int) -> dict[str, Any]:
    from bench.sqlcount import is_tx_control

    counts = Counter(after["statements"])
    counts.subtract(before["statements"])
    per = max(n, 1)
    data = sum(c for sql, c in counts.items() if not is_tx_control(sql))
    return {
        "enqueue_sql_per_job": round(data / per, 3),
        "enqueue_tx_control_per_job": round((sum(counts.values()) - data) / per, 3),
        "enqueue_commits_per_job": round((after["commits"] - before["commits"]) / per, 3),
        "enqueue_write_tx_per_job": round(
            (
                after["commits"]
                - before["commits"]
                + after["autocommit_writes"]
                - before["autocommit_writes"]
            )
            / per,
            3,
        ),
        "enqueue_breakdown": [
            {"per_job": round(c / per, 3), "sql": sql[:300]}
            for sql, c in counts.most_common()
            if c / per >= 0.002
        ],
    }


def rss_summary(sampler: RssSampler, files: dict[int, dict[str, Any]]) -> dict[str, Any]:
    roles = {pid: d.get("role", "") for pid, d in files.items()}
    peaks: dict[str, int] = {}
    for pid, rss in sampler.peak.items():
        role = sampler.role(pid, roles)
        peaks[role] = max(peaks.get(role, 0), rss)
    mb = {k: round(v / 2**20, 1) for k, v in sorted(peaks.items())}
    return {"peak_rss_worker_mb": mb.get("worker"), "peak_rss_mb_by_role": mb}


def rss_series(sampler: RssSampler, files: dict[int, dict[str, Any]], t0: float) -> list[Any]:
    """(seconds since the clock started, max worker RSS MB, sum of worker RSS MB) per sample."""
    roles = {pid: d.get("role", "") for pid, d in files.items()}
    out = []
    for ts, now in sampler.series or []:
        rss = [v for pid, v in now.items() if sampler.role(pid, roles) == "worker"]
        if rss:
            out.append([round(ts - t0, 1), round(max(rss) / 2**20, 1), round(sum(rss) / 2**20, 1)])
    return out


def soak(args: argparse.Namespace, db: str, broker: str) -> dict[str, Any]:
    from bench import sqlcount

    workers = max(int(w) for w in csv(args.workers))
    mix = csv(args.mix)[0]
    env = {} if args.soak_recycle else {"BENCH_Q_RECYCLE": str(10**9)}
    args.rss_interval = (
        max(args.rss_interval, 1.0) if args.rss_interval == 0.25 else args.rss_interval
    )
    print(f"soak: {args.soak} fenced ordered jobs, {workers} workers, {mix} mix", flush=True)
    partial: dict[str, Any] = {}
    try:
        run = run_once(
            args,
            db,
            broker,
            "ordered",
            workers,
            mix,
            args.soak,
            extra_env=env,
            series=True,
            partial=partial,
        )
    except Exception as exc:  # a shared database restarted: keep the RSS sampled so far
        if "sampler" not in partial:
            raise
        print(f"!! soak interrupted: {type(exc).__name__}: {exc}", flush=True)
        files = sqlcount.read_dir(partial["sqldir"])
        run = {
            "db": db,
            "broker": broker,
            "workers": workers,
            "mix": mix,
            "variant": "ordered",
            "jobs": args.soak,
            "complete": False,
            "interrupted": f"{type(exc).__name__}",
            "jobs_per_s": None,
            "rss_series": rss_series(partial["sampler"], files, partial["t0"]),
        }
        run.update(rss_summary(partial["sampler"], files))
    series = run.get("rss_series", [])
    # Keep the JSON small: at most ~120 points.
    step = max(1, len(series) // 120)
    run["rss_series"] = series[::step]
    run["recycle"] = "django-q2 default (500)" if args.soak_recycle else "off"
    if series:
        during = [p for p in series if p[0] >= 0] or series
        run["worker_rss_first_mb"] = during[0][1]
        run["worker_rss_last_mb"] = during[-1][1]
        run["worker_rss_max_mb"] = max(p[1] for p in during)
    print(one_line(run), flush=True)
    print(
        f"worker RSS first {run.get('worker_rss_first_mb')} MB, last "
        f"{run.get('worker_rss_last_mb')} MB, max {run.get('worker_rss_max_mb')} MB",
        flush=True,
    )
    return run


# --- output ----------------------------------------------------------------------------------


def one_line(run: dict[str, Any]) -> str:
    if run.get("interrupted"):
        return f"  {run['db']}+{run['broker']} soak interrupted ({run['interrupted']})"
    return (
        f"  {run['db']}+{run['broker']} w={run['workers']} {run['mix']:<6} "
        f"{run['variant']:<9} rep={run.get('rep', '-')} "
        f"{run['jobs_per_s']} jobs/s enq {run['enqueue_per_s']}/s "
        f"sql/job {run['sql_per_job']} p50 {run['latency_p50_ms']}ms "
        f"p95 {run['latency_p95_ms']}ms rss {run['peak_rss_worker_mb']}MB "
        f"{'' if run['complete'] else 'INCOMPLETE '}{run['outcomes']}"
    )


def mean_breakdown(reps: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """Statement shapes per job, averaged over the repetitions (SQL cut to 140 characters)."""
    total: Counter[tuple[str, str]] = Counter()
    for run in reps:
        for row in run.get(field, []):
            total[(row.get("role", ""), row["sql"][:140])] += row["per_job"]
    out = []
    for (role, sql), value in total.most_common():
        per_job = round(value / max(len(reps), 1), 3)
        if per_job >= 0.01:
            out.append(
                {"role": role, "per_job": per_job, "sql": sql}
                if role
                else {"per_job": per_job, "sql": sql}
            )
    return out


def compact(results: dict[str, Any]) -> None:
    """Keep the JSON small: statement breakdowns live in the summary, per configuration."""
    for run in results.get("runs", []):
        run.pop("sql_breakdown", None)
        run.pop("enqueue_breakdown", None)


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[(run["db"], run["broker"], run["workers"], run["mix"], run["variant"])].append(run)
    rows = []
    for key, reps in groups.items():
        rates = [r["jobs_per_s"] or 0.0 for r in reps]

        def med(field: str, reps: list[dict[str, Any]] = reps) -> Any:
            values = [r[field] for r in reps if r.get(field) is not None]
            return round(statistics.median(values), 3) if values else None

        rows.append(
            {
                "db": key[0],
                "broker": key[1],
                "workers": key[2],
                "mix": key[3],
                "variant": key[4],
                "reps": len(reps),
                "complete": all(r["complete"] for r in reps),
                "jobs_per_s_median": round(statistics.median(rates), 1),
                "jobs_per_s_min": round(min(rates), 1),
                "jobs_per_s_max": round(max(rates), 1),
                "enqueue_per_s": med("enqueue_per_s"),
                "sql_per_job": med("sql_per_job"),
                "sql_per_job_worker": med("sql_per_job_worker"),
                "tx_control_per_job": med("tx_control_per_job"),
                "enqueue_sql_per_job": med("enqueue_sql_per_job"),
                "commits_per_job": med("commits_per_job"),
                "write_tx_per_job": med("write_tx_per_job"),
                "enqueue_write_tx_per_job": med("enqueue_write_tx_per_job"),
                "connects_per_job": med("connects_per_job"),
                "latency_p50_ms": med("latency_p50_ms"),
                "latency_p95_ms": med("latency_p95_ms"),
                "peak_rss_worker_mb": max((r["peak_rss_worker_mb"] or 0) for r in reps),
                "q_tasks_per_job": med("q_tasks_per_job"),
                "idle_polls_per_job": med("idle_polls_per_job"),
                "rereads": sum(r["rereads"] for r in reps),
                "sql_breakdown": mean_breakdown(reps, "sql_breakdown"),
                "enqueue_breakdown": mean_breakdown(reps, "enqueue_breakdown"),
            }
        )
    for variant, column in (
        ("baseline", "vs_baseline"),
        ("baseline-fast", "vs_baseline_fast"),
        ("tasks-db", "vs_tasks_db"),
        ("ordered", "vs_ordered"),
    ):
        base = {
            (r["db"], r["broker"], r["workers"], r["mix"]): r["jobs_per_s_median"]
            for r in rows
            if r["variant"] == variant
        }
        for r in rows:
            b = base.get((r["db"], r["broker"], r["workers"], r["mix"]))
            r[column] = round(r["jobs_per_s_median"] / b, 2) if b else None
    order = {v: i for i, v in enumerate(ALL_VARIANTS)}
    rows.sort(
        key=lambda r: (
            r["db"] != "postgres",
            r["broker"],
            r["mix"] != "many",
            r["workers"],
            order.get(r["variant"], 9),
        )
    )
    return rows


def render(results: dict[str, Any]) -> str:
    lines = [
        "| db + broker | mix | workers | variant | jobs/s median (min-max) | vs baseline "
        "| vs baseline-fast | enqueue/s | SQL/job worker | SQL/job cluster | write tx/job cluster "
        "| SQL (tx)/job enqueue | p50 ms | p95 ms | peak worker RSS MB |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results.get("summary", []):
        flag = "" if r["complete"] else " (incomplete)"
        lines.append(
            f"| {r['db']} + {r['broker']} | {r['mix']} | {r['workers']} | {r['variant']}{flag} "
            f"| {r['jobs_per_s_median']:.0f} ({r['jobs_per_s_min']:.0f}-{r['jobs_per_s_max']:.0f}) "
            f"| {fmt(r['vs_baseline'], '.2f', 'x')} "
            f"| {fmt(r.get('vs_baseline_fast'), '.2f', 'x')} | {fmt(r['enqueue_per_s'], '.0f')} "
            f"| {fmt(r['sql_per_job_worker'], '.2f')} | {fmt(r['sql_per_job'], '.2f')} "
            f"| {fmt(r['write_tx_per_job'], '.2f')} | {fmt(r['enqueue_sql_per_job'], '.0f')} "
            f"({fmt(r['enqueue_write_tx_per_job'], '.0f')}) "
            f"| {fmt(r['latency_p50_ms'], '.0f')} | {fmt(r['latency_p95_ms'], '.0f')} "
            f"| {fmt(r['peak_rss_worker_mb'], '.0f')} |"
        )
    pg = results.get("pgbench")
    if pg:
        lines.append("")
        lines.append(
            "SQL-only ceiling (pgbench, bench/pgbench_cycle.sql, claim + write + complete):"
        )
        for row in pg.get("runs", []):
            lines.append(
                f"- {row['clients']} client(s): {row['tps']:.0f} jobs/s "
                f"({row['transactions']} cycles in {row['seconds']} s, {row['failed']} failed)"
            )
        lines += against_ceiling(results["summary"], pg)
    lines += tasks_comparison(results.get("summary", []))
    for soak_run in results.get("soaks", []):
        lines.append("")
        lines.append(
            f"Soak: {soak_run['jobs']} fenced ordered jobs ({soak_run['mix']} mix, "
            f"{soak_run['workers']} workers, recycling {soak_run.get('recycle')}"
            f"{', INTERRUPTED' if soak_run.get('interrupted') else ''}): "
            f"{soak_run['jobs_per_s']} jobs/s, worker RSS first "
            f"{soak_run.get('worker_rss_first_mb')} MB, "
            f"last {soak_run.get('worker_rss_last_mb')} MB, "
            f"max {soak_run.get('worker_rss_max_mb')} MB"
        )
    return "\n".join(lines)


def against_ceiling(summary: list[dict[str, Any]], pg: dict[str, Any]) -> list[str]:
    """Each fenced ordered PostgreSQL run against the ceiling with as many clients as workers
    (a hot record's single lane against the one-client ceiling: a serial lane)."""
    ceiling = {row["clients"]: row["tps"] for row in pg.get("runs", []) if row.get("tps")}
    lines = []
    for r in summary:
        if r["variant"] != "ordered" or r["db"] != "postgres":
            continue
        clients = 1 if r["mix"] == "hot" else r["workers"]
        if clients not in ceiling:
            continue
        share = r["jobs_per_s_median"] / ceiling[clients]
        lines.append(
            f"- ordered, {r['mix']}, {r['workers']} worker(s): {r['jobs_per_s_median']:.0f} "
            f"jobs/s = {share:.0%} of the {clients}-client ceiling"
        )
    return ["", "Against the ceiling:", *lines] if lines else []


def tasks_comparison(summary: list[dict[str, Any]]) -> list[str]:
    """Each ``tasks`` row against ``tasks-db`` (the issue: >= 2x) and ``ordered`` (the native
    road: within 10%) of the same configuration."""
    by_key = {(r["db"], r["broker"], r["workers"], r["mix"], r["variant"]): r for r in summary}
    lines = []
    for r in summary:
        if r["variant"] != "tasks":
            continue
        key = (r["db"], r["broker"], r["workers"], r["mix"])
        parts = [f"{r['jobs_per_s_median']:.0f} jobs/s"]
        for other, column in (("tasks-db", "vs_tasks_db"), ("ordered", "vs_ordered")):
            found = by_key.get((*key, other))
            if found is not None and r.get(column) is not None:
                parts.append(f"{r[column]:.2f}x {other} ({found['jobs_per_s_median']:.0f})")
        lines.append(
            f"- {r['db']} + {r['broker']}, {r['mix']}, {r['workers']} worker(s): "
            + ", ".join(parts)
        )
    if not lines:
        return []
    return ["", "The tasks backend (tasks) against django-tasks-db and the native road:", *lines]


def fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


if __name__ == "__main__":
    sys.exit(main())
