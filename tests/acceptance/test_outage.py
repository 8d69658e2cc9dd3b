"""Timers across a database outage (issue 19): a delayed job that becomes due while PostgreSQL is
down runs within 2 s of the database coming back (it waited 34 s, for the sweep).

The test starts a PostgreSQL server of its own (initdb in a temporary directory, another port),
migrates it, and runs a real qcluster against it and the suite's Redis, with no sweep schedule:
only the workers' timers can run the job. It stops that server while the job becomes due and
starts it again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.jobkit import redis_client, redis_url

from .helpers_cluster import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(settings.BASE_DIR)


def _pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        pytest.skip("needs PostgreSQL's server binaries (/usr/lib/postgresql/*/bin)")
    return found[-1].parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """A PostgreSQL server of the test's own: initdb, start, stop, start again."""

    def __init__(self) -> None:
        self.bin = _pg_bin()
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tombstones-outage-"))
        self.data = self.dir / "data"
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/outage"

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_postgres, *args], check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        if self.as_postgres:
            shutil.chown(self.dir, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust")
        self.start()
        self._run(
            str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
            "outage",
        )  # fmt: skip

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir}"
        # -l: the server's output goes to a file, not to the pipes this test reads to their end.
        log = str(self.dir / "server.log")
        pg_ctl = str(self.bin / "pg_ctl")
        self._run(pg_ctl, "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def query(self, sql: str) -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
            cursor = conn.execute(sql)
            return list(cursor.fetchall()) if cursor.description else []


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    if shutil.which("runuser") is None and os.geteuid() == 0:
        pytest.skip("needs runuser to run initdb as the postgres user")
    server = PrivatePostgres()
    try:
        server.init()
        yield server
    finally:
        server.remove()


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return done.stdout


ENQUEUE = """
import uuid
from datetime import timedelta
from django.utils import timezone
import tombstones
from project.stress.models import StressEntity
record = StressEntity.all_objects.recreate(key=uuid.uuid4().hex[:12], payload="before")
due = timezone.now() + timedelta(seconds={delay})
job = tombstones.enqueue("stress.apply", record, run_after=due if {delay} else None)
print(job.pk)
"""


def _enqueue(env: dict[str, str], delay: float) -> int:
    return int(_manage(env, "shell", "-c", ENQUEUE.format(delay=delay)).strip().splitlines()[-1])


def _status(server: PrivatePostgres, job_id: int) -> object:
    return server.query(f"SELECT status FROM tombstones_job WHERE id = {job_id}")[0][0]


def test_outage__a_job_due_while_the_database_was_down_runs_within_2s_of_its_return(
    private_postgres: PrivatePostgres, tmp_path: Path
) -> None:
    redis_client()  # skipped without Redis (failed in CI)
    queue = f"outage-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.acceptance.cluster_settings",
        "DATABASE_URL": private_postgres.url,
        "REDIS_URL": redis_url(),
        "Q_NAME": queue,
        "Q_SYNC": "false",
        "Q_WORKERS": "2",
        "PYTHONUNBUFFERED": "1",
    }
    _manage(env, "migrate", "--noinput")
    private_postgres.query("DELETE FROM django_q_schedule")  # no sweep: timers only
    log = (tmp_path / "qcluster.log").open("wb")
    cluster = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        first = _enqueue(env, 0)  # the cluster is up once a job of its runs
        wait_for(lambda: _status(private_postgres, first) == "succeeded", timeout=60, every=0.1)
        job_id = _enqueue(env, 4)
        time.sleep(1.0)  # the wake-up's pump found nothing due and armed a timer for the job
        private_postgres.stop()
        time.sleep(5.0)  # the job becomes due 3 s into the outage; its timer's tick fails
        private_postgres.start()
        back = private_postgres.query("SELECT now()")[0][0]
        wait_for(lambda: _status(private_postgres, job_id) == "succeeded", timeout=60, every=0.1)
        finished = private_postgres.query(
            f"SELECT finished_at FROM tombstones_job WHERE id = {job_id}"
        )[0][0]
    finally:
        os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait(10)
        log.close()
        print((tmp_path / "qcluster.log").read_text(errors="replace")[-6000:])  # shown on failure
    took = (finished - back).total_seconds()
    assert took <= 2.0, f"the job ran {took:.1f}s after the database came back"
