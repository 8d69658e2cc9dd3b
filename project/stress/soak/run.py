"""One soak from start to verdict, once Django points at the private servers (bench/soak.py).

seed records → start the cluster and the editor → feed, with the chaos between bursts → stop
the editor → drain (bounded) → stop the cluster → load the evidence → check → report.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from django.core.management import call_command
from django.db.models import Count

from tombstones.models import Job

from ..cluster import MANAGE, Cluster
from ..models import StressEntity
from . import chaos, checks, evidence, journal, report
from .feeder import Feeder, FeedStats
from .outages import retrying
from .plans import Plan
from .servers import PrivatePostgres, PrivateRedis

# Off a terminal too: a progress line this often (seconds).
PROGRESS_EVERY = 10.0


@dataclass
class Servers:
    """The private servers and the scratch directory bench/soak.py made for this run."""

    postgres: PrivatePostgres
    redis: PrivateRedis
    journal: Path
    directory: Path


class Soak:
    """One run: the cluster, the editor, the feed with its faults, the drain, the verdict."""

    def __init__(self, plan: Plan, servers: Servers, queue: str, err: TextIO) -> None:
        self.plan = plan
        self.servers = servers
        self.queue = queue
        self.err = err
        self.rng = random.Random(plan.seed)
        self.cluster: Cluster | None = None
        self.editor: subprocess.Popen[bytes] | None = None
        self.last_line = 0.0

    def say(self, text: str) -> None:
        self.err.write(f"[soak {time.strftime('%H:%M:%S')}] {text}\n")
        self.err.flush()

    def run(self) -> dict[str, Any]:
        plan = self.plan
        began = time.monotonic()
        try:
            call_command("migrate", verbosity=0, interactive=False)
            StressEntity.objects.bulk_create(
                StressEntity(key=f"S{i:05d}", payload="seed") for i in range(plan.records)
            )
            record_ids = list(StressEntity.all_objects.values_list("pk", flat=True))
            self.cluster = Cluster(
                plan.workers,
                name=self.queue,
                log_path=str(self.servers.directory / "qcluster.log"),
            )
            self.say(f"cluster of {plan.workers} workers starting (log {self.cluster.log_path})")
            self.cluster.start(ready_timeout=120)
            self._start_editor()
            faults = chaos.plan(plan.kills, plan.redis_restarts, plan.postgres_restarts, self.rng)
            mayhem = chaos.Chaos(faults, self.cluster, self.servers.postgres, self.servers.redis)
            feeder = Feeder(plan.jobs, record_ids, plan.backlog, self.rng)
            self.say(f"feeding {plan.jobs} jobs over {plan.records} records, {len(faults)} faults")

            def tick(progress: float) -> None:
                mayhem.tick(progress)
                self._progress(feeder.stats.enqueued, mayhem)

            stats = feeder.run(tick)
            mayhem.finish()
            fed_at = journal.now()
            tally = self._stop_editor()
            self.say(f"fed in {stats.seconds:.0f}s; draining (at most {plan.drain_timeout:.0f}s)")
            drained = self._drain(plan.drain_timeout)
            self.say("drained" if drained else "drain timed out: jobs left unfinished")
        finally:
            self._stop_editor()
            if self.cluster is not None:
                self.cluster.stop()
        self.say("checking")
        found = evidence.load(self.servers.journal)
        result = self._report(found, mayhem.log, stats, tally, fed_at)
        result["summary"]["drained"] = drained
        result["summary"]["wall_seconds"] = round(time.monotonic() - began, 1)
        return result

    # --- processes ------------------------------------------------------------------------

    def _start_editor(self) -> None:
        log = open(self.servers.directory / "editor.log", "wb")  # noqa: SIM115 - kept by Popen
        self.editor = subprocess.Popen(
            [sys.executable, str(MANAGE), "soak_editor", "--rate", str(self.plan.edit_rate),
             "--seed", str(self.plan.seed)],
            cwd=str(MANAGE.parent),
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )  # fmt: skip
        log.close()  # the child holds its own copy

    def _stop_editor(self) -> dict[str, int]:
        proc, self.editor = self.editor, None
        if proc is None:
            return {}
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate(timeout=10)
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            return dict(json.loads(lines[-1])) if lines else {}
        except ValueError:
            return {"unreadable_tally": 1}

    # --- feeding and draining ---------------------------------------------------------------

    def _progress(self, enqueued: int, mayhem: chaos.Chaos) -> None:
        now = time.monotonic()
        if now - self.last_line < PROGRESS_EVERY:
            return
        self.last_line = now
        unfinished = retrying(lambda: Job.objects.filter(status__in=Job.UNFINISHED).count())
        restarts = [r.server for r in mayhem.log.restarts]
        self.say(
            f"{enqueued}/{self.plan.jobs} enqueued, {unfinished} unfinished, "
            f"{len(mayhem.log.kills)} kills, {restarts.count('redis')} redis and "
            f"{restarts.count('postgres')} postgres restarts"
        )

    def _drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = retrying(lambda: Job.objects.filter(status__in=Job.UNFINISHED).count())
            if not left:
                return True
            if time.monotonic() - self.last_line >= PROGRESS_EVERY:
                self.last_line = time.monotonic()
                self.say(f"{left} jobs unfinished")
            time.sleep(0.25)
        return False

    # --- the verdict ------------------------------------------------------------------------

    def _report(
        self,
        found: evidence.Evidence,
        log: chaos.ChaosLog,
        stats: FeedStats,
        tally: dict[str, int],
        fed_at: int,
    ) -> dict[str, Any]:
        trace = checks.Trace([k.at for k in log.kills], found.claims, found.enqueued)
        violations = checks.order_violations(found.jobs, found.starts, found.effects, trace)
        evidence.add_events(violations)
        headless = checks.headless_followers(found.jobs, found.claims)
        lost = checks.lost_updates(found.records, found.effects, found.edits)
        effects = checks.effect_problems(found.jobs, found.effects)
        calls = checks.call_problems(found.jobs, found.calls)
        stuck = checks.stuck(found.jobs)
        unexplained = checks.without_reason(found.jobs)
        blind = checks.blind_checks(
            found.jobs, found.records, found.effects, found.edits, found.starts, found.calls
        )
        span = evidence.span()
        first = journal.micros(span["first"]) if span["first"] else fed_at
        last = journal.micros(span["last"]) if span["last"] else fed_at
        jobs = len(found.jobs)
        restarts = [r.server for r in log.restarts]
        summary = {
            "jobs": jobs,
            "kills": len(log.kills),
            "kills_hit": sum(1 for k in log.kills if k.held_after),
            "kills_mid_external": sum(1 for k in log.kills if k.sending),
            "kills_large": sum(1 for k in log.kills if k.followers >= chaos.LARGE),
            "kills_missed": log.missed_kills,
            "redis_restarts": restarts.count("redis"),
            "postgres_restarts": restarts.count("postgres"),
            "lost_updates": len(lost),
            "doubled_effects": len(effects["doubled"]),
            "effects_without_success": len(effects["without_success"]),
            "successes_without_effect": len(effects["success_without_effect"]),
            "repeated_external_calls": len(calls["repeated"]),
            "external_successes_without_call": len(calls["success_without_call"]),
            "stuck_jobs": len(stuck),
            "lane_order_violations": len(violations),
            "jobs_out_of_order": len({v["job"]["id"] for v in violations}),
            "claims_with_headless_followers": len(headless),
            "rejections_without_reason": len(unexplained),
            "blind_checks": len(blind),
            "drain_seconds": round(max(last - fed_at, 0) / 1e6, 1),
            "jobs_per_s": round(jobs / ((last - first) / 1e6), 1) if last > first else 0.0,
            "feed_seconds": round(stats.seconds, 1),
        }
        outcomes = Job.objects.values_list("status", "reason").annotate(n=Count("id"))
        return {
            "form": self.plan.form,
            "plan": asdict(self.plan),
            "summary": summary,
            "outcomes": {f"{s}/{r or '-'}": n for s, r, n in sorted(outcomes)},
            "handlers": dict(stats.by_handler),
            "feeder": {
                "enqueued": stats.enqueued,
                "skipped_tombstones": stats.skipped_tombstones,
                "refused": stats.refused,
            },
            "editor": tally,
            "handler_runs": checks.handler_runs(found.starts, found.ends),
            "external_calls": len(found.calls),
            "order_patterns": report.patterns(violations, self.plan.lease * 1000),
            "chaos": log.as_dict(),
            "headless_followers": headless,
            "details": {
                "lane_order_violations": violations,
                "lost_updates": lost,
                "doubled_effects": effects["doubled"],
                "effects_without_success": effects["without_success"],
                "successes_without_effect": effects["success_without_effect"],
                "repeated_external_calls": calls["repeated"],
                "external_successes_without_call": calls["success_without_call"],
                "stuck_jobs": stuck,
                "rejections_without_reason": unexplained,
                "blind_checks": blind,
            },
        }
