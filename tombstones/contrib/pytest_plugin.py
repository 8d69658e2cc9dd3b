"""pytest plugin (entry point ``pytest11``): the ``tombstone_race`` fixture for users' suites.

def test_sync_invoice_is_fenced(tombstone_race):
    report = tombstone_race(model=Invoice, handler="billing.sync_invoice")
    assert report.ok, report.table()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def tombstone_race(db: None) -> Callable[..., Any]:
    """Run the race fixture against your model and handler (needs pytest-django's ``db``)."""
    from .racefixture import run_race_fixture

    return run_race_fixture
