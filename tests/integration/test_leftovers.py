"""Issue 38's leftovers that a command's output shows: each line the user needs, printed once
(the race fixture's summary: tests/integration/test_race_fixture.py)."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


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
