"""The chaos soak (issue 32): per-record order, no lost or doubled effect, under kills and
restarts. ``make soak`` runs the long form; ``make soak SOAK_ARGS=--short`` the CI one.

    .venv/bin/python bench/soak.py                 # long: 100,000 jobs, 110 kills, 3+3 restarts
    .venv/bin/python bench/soak.py --short         # short: 8,000 jobs, 16 kills, 1+1 (< 4 min)
    .venv/bin/python bench/soak.py --jobs 20000 --kills 25 --redis-restarts 1 --pg-restarts 1

It starts its own PostgreSQL (initdb + pg_ctl, as the ``postgres`` user when run as root) and
its own redis-server on ports of their own (55432 and 56379, or free ones), in a scratch
directory removed at the end (``--keep`` keeps it, with the cluster's log and the journals).
The shared servers are never touched. A script rather than a management command because the
database must exist before Django reads its settings (as in bench/hosts.py).

Exit status: 0 when every check is zero, 1 otherwise (the table says which), 2 when the
servers cannot be started here, 128 + N when stopped by signal N.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from project.stress.soak import servers  # noqa: E402 - after the path: run as a script
from project.stress.soak.plans import SHORT, Plan  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--short", action="store_true", help="the CI form (under 4 minutes)")
    parser.add_argument("--jobs", type=int, help="fenced jobs the feeder enqueues")
    parser.add_argument("--records", type=int, help="records (lanes)")
    parser.add_argument("--workers", type=int, help="qcluster worker processes")
    parser.add_argument("--kills", type=int, help="SIGKILLs of workers holding a claim")
    parser.add_argument("--redis-restarts", type=int)
    parser.add_argument("--pg-restarts", type=int, dest="postgres_restarts")
    parser.add_argument("--lease", type=float, help="TOMBSTONES_LEASE, seconds")
    parser.add_argument("--backlog", type=int, help="unfinished jobs the feeder allows")
    parser.add_argument("--edit-rate", type=float, help="editor changes per second")
    parser.add_argument("--drain-timeout", type=float, help="seconds to wait for the drain")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--pg-port", type=int, default=55432)
    parser.add_argument("--redis-port", type=int, default=56379)
    parser.add_argument("--json", dest="json_path", help="write the full report here")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return parser.parse_args(argv)


def plan_from(args: argparse.Namespace) -> Plan:
    plan = SHORT if args.short else Plan()
    given = {
        name: getattr(args, name)
        for name in ("jobs", "records", "workers", "kills", "redis_restarts",
                     "postgres_restarts", "lease", "backlog", "edit_rate", "drain_timeout", "seed")
        if getattr(args, name) is not None
    }  # fmt: skip
    form = plan.form if not given else ("short (custom)" if args.short else "custom")
    return replace(plan, form=form, **given)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_from(args)
    why = servers.missing_binaries()
    if why:
        print(f"soak: cannot start its own servers: {why}", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="tombstones-soak-"))
    journal_dir = directory / "journal"
    journal_dir.mkdir()
    postgres = servers.PrivatePostgres(directory, servers.pick_port(args.pg_port))
    redis = servers.PrivateRedis(directory, servers.pick_port(args.redis_port))
    queue = f"soak-{uuid.uuid4().hex[:8]}"
    # Django reads these once, at setup; it connects only when first asked, once the servers run.
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "project.stress.soak.settings",
            "DATABASE_URL": postgres.url,
            "REDIS_URL": redis.url,
            "Q_NAME": queue,
            "Q_WORKERS": str(plan.workers),
            "SOAK_LEASE": str(plan.lease),
            "SOAK_JOURNAL": str(journal_dir),
            "TEST_DB_SUFFIX": "",
        }
    )
    import django

    django.setup()
    from project.stress import harness
    from project.stress.soak.report import failed, table
    from project.stress.soak.run import Servers, Soak

    print(f"[soak] scratch directory {directory}", file=sys.stderr)
    try:
        with harness.stop_on_signals():
            postgres.init()
            redis.start()
            soak = Soak(plan, Servers(postgres, redis, journal_dir, directory), queue, sys.stderr)
            result = soak.run()
    except BaseException as exc:
        stop = harness.stopped_by(exc)
        if stop is None:
            raise
        print(f"soak: stopped by {stop}; its cluster and servers are stopped", file=sys.stderr)
        return 128 + stop.signum
    finally:
        redis.stop()
        try:
            postgres.stop()
        except servers.ServerError as exc:
            print(f"soak: {exc}", file=sys.stderr)
        if args.keep:
            print(f"[soak] kept {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=1, default=str) + "\n")
    table(result, sys.stdout)
    return 1 if failed(result["summary"]) else 0


if __name__ == "__main__":
    sys.exit(main())
