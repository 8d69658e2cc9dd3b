"""The CI check of ``manage.py racestress``: a short ordered run sees 0 anomalies, a short
unordered run (the seed's bug: work partitioned by job, not by entity) sees some."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

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
    run = _run(tmp_path, "--no-ordering")
    assert run["mode"] == "unordered"
    assert run["completed"]
    assert run["anomalies"] > 0, run
    # The harness sees the bug itself, not a bookkeeping error.
    assert run["breakdown"]["lost_jobs"] == 0
    assert run["breakdown"]["duplicated_jobs"] == 0
