"""The demo project's settings follow the demo's address: its CRM jobs post to the demo itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings


def _crm_url(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("CRM_URL", "DEMO_ADDR")}
    done = subprocess.run(
        [sys.executable, "-c", "import project.settings as s; print(s.CRM_URL)"],
        cwd=settings.BASE_DIR,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("demo_addr", "expected"),
    [
        ("127.0.0.1:8123", "http://127.0.0.1:8123/fake-crm/contacts/"),
        ("8124", "http://127.0.0.1:8124/fake-crm/contacts/"),  # a bare port, as runserver takes
    ],
)
def test_demo_settings__crm_url_follows_demo_addr(demo_addr: str, expected: str) -> None:
    assert _crm_url(DEMO_ADDR=demo_addr) == expected


def test_demo_settings__crm_url_defaults_to_port_8000_and_can_be_set() -> None:
    assert _crm_url() == "http://127.0.0.1:8000/fake-crm/contacts/"
    assert _crm_url(DEMO_ADDR="127.0.0.1:8123", CRM_URL="http://crm.test/") == "http://crm.test/"
