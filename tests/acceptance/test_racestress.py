"""The CI check of ``manage.py racestress``: a short ordered run sees 0 anomalies, a short
unordered run (the seed's bug: work partitioned by job, not by entity) sees some. A signal stops
the command and its cluster; a run that times out exits non-zero."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command

from project.stress.cluster import database_url
from project.stress.models import StressEntity
from tests.acceptance.helpers_cluster import wait_for
from tests.acceptance.processes import children, session
from tombstones.models import Job

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

SHORT = ["--workers", "2", "--entities", "40", "--messages", "200", "--seed", "7"]


def _run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "racestress.json"
    call_command("racestress", *SHORT, *extra, "--json", str(out), verbosity=0)
    (run,) = json.loads(out.read_text())["runs"]
    return run


@pytest.fixture(autouse=True)
def _cluster_mode(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}


def test_racestress__ordered_run_has_no_anomalies(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert run["mode"] == "ordered"
    assert run["completed"]
    assert run["messages"] == 200
    assert run["anomalies"] == 0, run["breakdown"]
    assert sum(run["outcomes"].values()) == 200


def test_racestress__unordered_run_reproduces_the_seed_race(tmp_path: Path) -> None:
    # A race, not a certainty: two workers on a loaded machine may take turns through a whole
    # run (CI saw one such run). Up to three runs, other seeds, until one shows it.
    runs = []
    for seed in ("7", "11", "13"):
        run = _run(tmp_path, "--no-ordering", "--seed", seed)
        assert run["mode"] == "unordered"
        assert run["completed"]
        # The harness sees the bug itself, not a bookkeeping error.
        assert run["breakdown"]["lost_jobs"] == 0
        assert run["breakdown"]["duplicated_jobs"] == 0
        runs.append(run)
        if run["anomalies"] > 0:
            break
    assert runs[-1]["anomalies"] > 0, runs


# --- signals and time-outs -------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=str)
def test_racestress__a_signal_stops_its_cluster_and_exits_cleanly(signum: signal.Signals) -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
    long_run = ["--workers", "2", "--entities", "20", "--messages", "100000", "--seed", "3"]
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "racestress", *long_run],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sid = 0
    try:
        # The cluster is racestress's child, the leader of a session of its own.
        sid = wait_for(lambda: children(proc.pid), timeout=60)[0]
        entities = ContentType.objects.get_for_model(StressEntity)
        # Running: its sentinel, workers, monitor and pusher are up, and jobs are flowing.
        wait_for(
            lambda: (
                len(session(sid)) >= 4
                and Job.objects.filter(content_type=entities, status=Job.Status.SUCCEEDED).exists()
            ),
            timeout=90,
        )
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        left = session(sid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if sid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sid, signal.SIGKILL)  # never leave a cluster behind a failed test

    assert left == [], f"processes of the cluster still running: {left}"
    assert proc.returncode == 128 + signum, err
    assert f"CommandError: Stopped by {signum.name}: the worker cluster is stopped." in err
    assert "Traceback" not in err


def test_racestress__a_run_that_times_out_exits_non_zero_after_its_table(tmp_path: Path) -> None:
    # One worker, deliveries of up to a second each: 30 jobs cannot end within a second.
    slow = ["--workers", "1", "--entities", "5", "--messages", "30", "--in-flight", "30"]
    out = tmp_path / "racestress.json"
    stdout = StringIO()

    with pytest.raises(CommandError, match=r"1 run\(s\) timed out after 1s"):
        call_command(
            "racestress",
            *slow,
            "--delay-ms",
            "1000",
            "--timeout",
            "1",
            "--json",
            str(out),
            stdout=stdout,
            verbosity=0,
        )

    assert "TIMED OUT before every job ended" in stdout.getvalue()
    (run,) = json.loads(out.read_text())["runs"]
    assert run["completed"] is False
