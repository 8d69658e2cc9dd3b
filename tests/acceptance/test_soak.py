"""The chaos soak's short form (issue 32), as CI runs it: ``bench/soak.py --short`` starts its
own PostgreSQL and Redis, a real 4-worker ``qcluster``, the feeder, the editor, SIGKILLs of
workers holding claims, one Redis and one PostgreSQL restart; every check must be zero.

The run must also have pushed: jobs fed, handlers started, kills landed on claims, both
restarts made, and every check proved able to see the fault planted for it (``blind_checks``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from project.stress.soak import servers
from project.stress.soak.plans import SHORT

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.serial, pytest.mark.postgres]

ROOT = Path(settings.BASE_DIR)
# The short form takes under 4 minutes on 2 cores; this only bounds a hung run.
TIMEOUT = 600


def test_soak__short_form_under_kills_and_restarts_every_check_is_zero(tmp_path: Path) -> None:
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        # It starts its own servers whatever the suite runs on: once per CI run is enough.
        pytest.skip("the soak runs with the PostgreSQL cells: run with DATABASE_URL=postgres://...")
    why = servers.missing_binaries()
    if why:
        pytest.skip(f"the chaos soak starts PostgreSQL and Redis servers of its own: {why}")
    out = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run(
        [sys.executable, "bench/soak.py", "--short", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    shown = f"{done.stdout}\n{done.stderr[-4000:]}"
    assert out.exists(), f"no report (exit {done.returncode}):\n{shown}"
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["jobs"] >= SHORT.jobs, shown
    assert report["handler_runs"]["starts"] >= SHORT.jobs // 2, shown
    assert summary["kills_hit"] >= SHORT.kills // 2, shown
    assert (summary["redis_restarts"], summary["postgres_restarts"]) == (1, 1), shown
    assert summary["blind_checks"] == 0, shown
    assert done.returncode == 0, f"the soak found violations:\n{shown}"
