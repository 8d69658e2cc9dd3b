"""Issue 38's leftovers that a command's output shows: each line the user needs, printed once."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db

FOUR_CASES = "4 cases: 3 rejected for source state, 1 re-read for stale version, 0 unaccounted"


def test_racefixture__prints_each_summary_once() -> None:
    out = StringIO()
    call_command(
        "racefixture",
        "--model",
        "customers.Customer",
        "--handler",
        "customers.update_sheet_row",
        stdout=out,
    )
    text = out.getvalue()
    assert text.count(FOUR_CASES) == 1, text
    # Every "N cases: ..." line (the four cases' and the worked example's) appears once.
    summaries = re.findall(r"^\d+ cases?: .*$", text, flags=re.MULTILINE)
    assert len(summaries) == 2, text
    assert len(set(summaries)) == len(summaries), text
    assert text.rstrip().endswith("all 5 cases as expected."), text


def test_seed_demo__prints_each_password_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEMO_ADMIN_PASSWORD", "x-Test-only-admin-1")
    monkeypatch.delenv("DEMO_AUDITOR_PASSWORD", raising=False)
    out = StringIO()
    call_command("seed_demo", "--credentials-file", str(tmp_path / "credentials"), stdout=out)
    text = out.getvalue()
    auditor = re.findall(r"^  auditor +password: (\S+)$", text, flags=re.MULTILINE)
    assert len(auditor) == 1, text  # generated, and kept in the credentials file
    for password in ("x-Test-only-admin-1", auditor[0]):
        assert text.count(password) == 1, text
    assert text.count("demo users:") == 1, text
