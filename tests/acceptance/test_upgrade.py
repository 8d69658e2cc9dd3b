"""An upgrade from the previous release: its database, migrated and filled by its own code, is
migrated by this checkout, and this checkout's worker drains the jobs the old code queued with
every guarantee.

The previous release is the tag ``PREVIOUS_TAG``, or, in a clone without tags, the commit
``PREVIOUS_COMMIT`` (the same one). Its tree (``git archive``) gets a virtualenv of its own, with
this run's Django; its ``manage.py`` migrates a fresh database (a SQLite file, or a new PostgreSQL
database when the suite runs on PostgreSQL) and queues jobs of every kind with no worker running:
fenced jobs, several per record, for live records, a deleted one, a re-created one and one edited
after the enqueue, and plain jobs. Then this checkout's ``migrate``, ``check`` and a real
``qcluster``, and the outcomes: each job's status and reason as the guarantees say, each lane in
its order, no job lost, none run twice; ``makemigrations --check`` finds nothing to write.

The jobs are the chaos soak's (project/stress/soak/handlers.py): the same in both trees, each
internal write leaves a ``SoakEffect`` row in its fenced transaction, and each handler run a
line in the soak's journal (a file per worker process, written whatever becomes of the run).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import django
import pytest
from django.conf import settings
from django.db import connection

from project.stress.cluster import database_url
from tests.acceptance.test_readme import PRIVATE_ENV as README_PRIVATE_ENV
from tombstones.jobs.states import UNFINISHED

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.walkthrough]

ROOT = Path(settings.BASE_DIR)
PREVIOUS_TAG = "v0.1.0"
# The tag's commit, for a clone without tags (update both with each release).
PREVIOUS_COMMIT = "e1e886ef9e78cc927307954ddbc3268cd3dc847b"
# This run's variables that must not reach the two projects (each gets its own below): the
# walk-throughs' and the soak journal's.
PRIVATE_ENV = (*README_PRIVATE_ENV, "SOAK_JOURNAL")
DRAIN_TIMEOUT = 60.0

# Run by the previous release's code, with no worker: records and jobs of every kind. It prints
# the jobs it queued, each with its role (what the guarantees say becomes of it).
FILL = """
import json
import tombstones
from project.stress.models import StressEntity

jobs = []

def queue(role, handler, record, **params):
    job = tombstones.enqueue(handler, record, params=params)
    jobs.append({"id": job.pk, "role": role, "key": record.key})

def plain(role, handler):
    job = tombstones.enqueue_plain(handler)
    jobs.append({"id": job.pk, "role": role, "key": ""})

# Live records, several jobs each (internal writes and an external call): their lanes' order.
for n in range(1, 4):
    record = StressEntity.objects.create(key=f"live-{n}", payload="v1")
    for handler in ("soak.increment", "soak.rmw", "soak.external", "soak.increment", "soak.rmw"):
        queue("live", handler, record)

# Deleted before its jobs run: its writes are rejected; a job that accepts tombstones runs.
record = StressEntity.objects.create(key="deleted", payload="v1")
queue("deleted", "soak.increment", record)
queue("deleted", "soak.rmw", record)
queue("tombstone", "soak.forget", record)
record.delete()

# Deleted and re-created: the old generation's jobs are rejected, the new one's runs.
record = StressEntity.objects.create(key="recreated", payload="v1")
queue("old-generation", "soak.increment", record)
queue("old-generation", "soak.rmw", record)
record.delete()
record = StressEntity.all_objects.recreate(key="recreated", payload="v2")
queue("new-generation", "soak.increment", record)

# Edited after the enqueue: a stale version is read again, not rejected.
record = StressEntity.objects.create(key="edited", payload="v1")
queue("stale", "soak.rmw", record)
queue("stale", "soak.increment", record)
record.payload = "v2"
record.save()

plain("plain", "soak.tick")
plain("plain", "soak.ping")
plain("plain", "soak.tick")
print("FILLED", json.dumps(jobs))
print("CODE", json.dumps(tombstones.__file__))
"""

# Run by this checkout's code once the cluster runs: waits (bounded) until no job is unfinished,
# then prints what the database holds.
REPORT = """
import json, time
from tombstones.models import Job, JobEvent
from project.stress.models import SoakEffect, StressEntity

deadline = time.monotonic() + DRAIN_TIMEOUT
while Job.objects.filter(status__in=Job.UNFINISHED).exists() and time.monotonic() < deadline:
    time.sleep(0.2)
fields = ("id", "handler", "lane", "status", "reason", "attempts", "generation", "version",
          "checked_version", "finished_at")
print("REPORT", json.dumps({
    "jobs": list(Job.objects.order_by("pk").values(*fields)),
    "events": list(JobEvent.objects.order_by("pk").values("job_id", "event", "reason")),
    "effects": list(SoakEffect.objects.order_by("pk").values(
        "job_id", "entity_id", "generation", "version", "counter")),
    "records": list(StressEntity.all_objects.order_by("pk").values(
        "key", "generation", "version", "counter", "deleted_at")),
}, default=str))
"""

# What the guarantees say becomes of each role's jobs: (status, reason).
OUTCOMES = {
    "live": ("succeeded", ""),
    "deleted": ("rejected", "source_deleted"),
    "tombstone": ("succeeded", ""),
    "old-generation": ("rejected", "generation_changed"),
    "new-generation": ("succeeded", ""),
    "stale": ("succeeded", ""),
    "plain": ("succeeded", ""),
}
INTERNAL = ("soak.increment", "soak.rmw", "soak.tick")


def previous_release() -> str:
    """The previous release's commit: the tag, else the constant; a failure if neither is here."""

    def commit(rev: str) -> str | None:
        done = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip() if done.returncode == 0 else None

    tagged = commit(PREVIOUS_TAG)
    if tagged is not None:
        assert tagged == PREVIOUS_COMMIT, (
            f"{PREVIOUS_TAG} is {tagged}, PREVIOUS_COMMIT says {PREVIOUS_COMMIT}: update it"
        )
        return tagged
    found = commit(PREVIOUS_COMMIT)
    if found is None:
        pytest.fail(
            f"neither the tag {PREVIOUS_TAG} nor the commit {PREVIOUS_COMMIT} is in {ROOT}: "
            "the upgrade test needs the previous release (a full clone: git fetch --tags)"
        )
    return found


def run(
    args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def tagged_line(output: str, tag: str) -> Any:
    """The JSON a script printed after ``tag`` (Django's shell may print other lines)."""
    for line in output.splitlines():
        if line.startswith(f"{tag} "):
            return json.loads(line[len(tag) + 1 :])
    pytest.fail(f"no {tag} line in:\n{output}")


@dataclass(frozen=True)
class Database:
    url: str  # DATABASE_URL of both projects
    vendor: str


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    """A fresh database: a SQLite file, or a new PostgreSQL database beside the suite's."""
    if connection.vendor != "postgresql":
        yield Database(f"sqlite:///{tmp_path / 'upgrade.sqlite3'}", "sqlite")
        return
    import psycopg

    name = f"upgrade_{uuid.uuid4().hex[:12]}"
    parts = urlsplit(database_url())  # the suite's server, user and password
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield Database(urlunsplit(parts._replace(path=f"/{name}")), "postgresql")
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def old_release(tmp_path: Path, vendor: str) -> Path:
    """The previous release's tree with a virtualenv of its own; returns its python."""
    tree = tmp_path / "previous"
    tree.mkdir()
    archive = subprocess.Popen(
        ["git", "archive", previous_release()], cwd=ROOT, stdout=subprocess.PIPE
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True, timeout=60)
    assert archive.stdout is not None
    archive.stdout.close()
    assert archive.wait(60) == 0, "git archive failed"

    venv = tmp_path / "venv-previous"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    extras = "demo,postgres" if vendor == "postgresql" else "demo"
    # This run's Django (its wheel is in pip's cache), so the two trees differ in our code only.
    run(
        [str(python), "-m", "pip", "install", "--quiet", f"{tree}[{extras}]",
         f"Django=={django.__version__}"],
        cwd=tmp_path,
        env={**clean_env(), "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        timeout=600,
    )  # fmt: skip
    return python


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
    env.update(PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def journal(directory: Path) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The soak journal's handler starts and ends: job id -> times (microseconds)."""
    starts: dict[int, list[int]] = defaultdict(list)
    ends: dict[int, list[int]] = defaultdict(list)
    for path in directory.glob("journal-*.log"):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if fields[0] == "S":
                starts[int(fields[1])].append(int(fields[-1]))
            elif fields[0] == "E":
                ends[int(fields[1])].append(int(fields[-1]))
    return starts, ends


def test_upgrade__a_database_of_the_previous_release_drains_with_every_guarantee(
    tmp_path: Path, database: Database
) -> None:
    began = time.monotonic()
    old_python = old_release(tmp_path, database.vendor)
    old_tree = tmp_path / "previous"
    queue = f"upgrade-{uuid.uuid4().hex[:10]}"
    # One database, one queue (the ORM broker: the old code's wake-ups wait in the database).
    env = clean_env(
        DATABASE_URL=database.url, Q_NAME=queue, DJANGO_SETTINGS_MODULE="project.settings"
    )
    installed = time.monotonic()

    # The previous release: its migrations, its records, its jobs; no worker.
    run([str(old_python), "manage.py", "migrate", "--noinput"], cwd=old_tree, env=env)
    filled = run([str(old_python), "manage.py", "shell", "-c", FILL], cwd=old_tree, env=env)
    queued = tagged_line(filled.stdout, "FILLED")
    assert len(queued) == 26, queued
    # The old code is the old tree's, not this checkout's (nothing of this run leaked in).
    old_code = Path(tagged_line(filled.stdout, "CODE"))
    assert old_code.is_relative_to(old_tree) or old_code.is_relative_to(old_python.parent.parent)

    # This checkout: its migrations on the filled database, its checks, then its worker.
    new = [sys.executable, "manage.py"]
    migrated = run([*new, "migrate", "--noinput"], cwd=ROOT, env=env).stdout
    run([*new, "migrate", "--check"], cwd=ROOT, env=env)
    run([*new, "check", "--fail-level", "WARNING"], cwd=ROOT, env=env)
    run([*new, "makemigrations", "--check", "--dry-run"], cwd=ROOT, env=env)

    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    log = tmp_path / "qcluster.log"
    worker_env = {**env, "Q_WORKERS": "2", "SOAK_JOURNAL": str(journal_dir)}
    with log.open("wb") as out:
        cluster = subprocess.Popen(
            [*new, "qcluster"],
            cwd=ROOT,
            env=worker_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: every worker process is stopped below
        )
        try:
            script = REPORT.replace("DRAIN_TIMEOUT", repr(DRAIN_TIMEOUT))
            done = run([*new, "shell", "-c", script], cwd=ROOT, env=env, timeout=DRAIN_TIMEOUT + 60)
        finally:
            cluster.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                cluster.wait(20)  # django-q2 stops its workers on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(cluster.pid, signal.SIGKILL)  # whatever of the group is left
            cluster.wait(10)
    drained = time.monotonic()
    report = tagged_line(done.stdout, "REPORT")
    jobs = {job["id"]: job for job in report["jobs"]}
    worker_log = log.read_text(errors="replace")[-4000:]

    # None lost, none added: the jobs the old code queued are the jobs there are, all finished.
    assert sorted(jobs) == sorted(q["id"] for q in queued), (sorted(jobs), queued)
    unfinished = [j for j in jobs.values() if j["status"] in UNFINISHED]
    assert not unfinished, f"not drained in {DRAIN_TIMEOUT}s: {unfinished}\n{worker_log}"

    # Each job's outcome, as the guarantees say; each ran once (one attempt, one handler start).
    starts, ends = journal(journal_dir)
    for q in queued:
        job = jobs[q["id"]]
        status, reason = OUTCOMES[q["role"]]
        assert (job["status"], job["reason"]) == (status, reason), (q, job, worker_log)
        assert job["attempts"] == 1, job
        ran = 1 if status == "succeeded" else 0
        assert len(starts.get(job["id"], [])) == ran, (job, starts.get(job["id"]))
        assert len(ends.get(job["id"], [])) == ran, (job, ends.get(job["id"]))
    events = Counter((e["job_id"], e["event"], e["reason"]) for e in report["events"])
    for q in queued:
        status, reason = OUTCOMES[q["role"]]
        # A rejection is an event row; a plain success is kept in the job's row (at most one).
        expected = 1 if status == "rejected" else events[(q["id"], status, reason)]
        assert events[(q["id"], status, reason)] == expected <= 1, (q, report["events"])

    # Internal writes: one effect row per succeeded internal job, none for a rejected one.
    effects: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for effect in report["effects"]:
        effects[effect["job_id"]].append(effect)
    for q in queued:
        job = jobs[q["id"]]
        wrote = job["handler"] in INTERNAL and job["status"] == "succeeded"
        assert len(effects.get(job["id"], [])) == (1 if wrote else 0), (job, effects.get(job["id"]))

    # Each lane in its order: handler runs one after another in job order, outcomes in job order.
    lanes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for job in sorted(jobs.values(), key=lambda j: j["id"]):
        if job["handler"] not in ("soak.tick", "soak.ping"):  # plain jobs have no lane order
            lanes[job["lane"]].append(job)
    assert len(lanes) == 6, sorted(lanes)
    for lane, members in lanes.items():
        finished = [datetime.fromisoformat(j["finished_at"]) for j in members]
        assert finished == sorted(finished), (lane, members)
        ran = [j["id"] for j in members if j["id"] in starts]
        for earlier, later in itertools.pairwise(ran):
            assert ends[earlier][0] <= starts[later][0], (lane, earlier, later)

    # The records' counters: each live lane's writes counted 1, 2, ... in job order.
    records = {r["key"]: r for r in report["records"]}
    by_key: dict[str, list[int]] = defaultdict(list)
    for q in queued:
        if jobs[q["id"]]["handler"] in INTERNAL and q["key"]:
            by_key[q["key"]].append(q["id"])
    for key in ("live-1", "live-2", "live-3", "edited"):
        counters = [effects[i][0]["counter"] for i in by_key[key]]
        assert counters == list(range(1, len(counters) + 1)), (key, counters)
        assert records[key]["counter"] == len(counters), records[key]
    assert records["deleted"]["deleted_at"] is not None
    assert records["deleted"]["counter"] == 0, records["deleted"]
    assert records["recreated"]["generation"] == 2, records["recreated"]
    assert records["recreated"]["counter"] == 1, records["recreated"]
    # The stale jobs were queued at version 1 and wrote on the edited record (version 2 on).
    for q in queued:
        if q["role"] == "stale":
            job = jobs[q["id"]]
            assert job["version"] == 1, job
            assert effects[job["id"]][0]["version"] > 2, (job, effects[job["id"]])

    print(
        f"upgrade from {PREVIOUS_TAG} on {database.vendor}: venv {installed - began:.1f}s, "
        f"old migrate+fill and new migrate+drain {drained - installed:.1f}s; "
        f"new migrations applied: {migrated.count('Applying')}"
    )
