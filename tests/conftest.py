"""Shared fixtures. Layers: tests/unit (one module), tests/integration (the database, the admin),
tests/acceptance (real worker processes, real browser, the seed's acceptance tests)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import override_settings


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background (nohup, or `cmd &` in a script) has SIGINT ignored, and the
    # processes the tests start inherit that: Ctrl-C would never stop the demo or the README's
    # qcluster (a shell cannot trap a signal ignored at its start). A handler is reset at exec.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A serial test (it restarts the shared PostgreSQL server) would cut the connections of every
    # other xdist process: under xdist it is skipped, and make test runs it alone afterwards.
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    alone = pytest.mark.skip(reason="marked serial: make test runs it alone, after the others")
    for item in items:
        if item.get_closest_marker("serial"):
            item.add_marker(alone)


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hasher() -> Iterator[None]:
    # Django's default hasher spends 0.2-0.3 s on a password by design, and the admin tests make
    # hundreds of users: a fast one, as Django's docs advise for tests ("Speeding up the tests").
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def postgres_only(db: None) -> None:
    """Skip with a visible reason when the suite runs on SQLite."""
    if not is_postgres():
        pytest.skip("needs PostgreSQL: run with DATABASE_URL=postgres://... (see README)")


@pytest.fixture(autouse=True)
def _q_sync(settings: object) -> None:
    # Jobs run inline after commit unless a test starts a real cluster.
    settings.TOMBSTONES_Q_OPTIONS = {"sync": True}  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _fresh_worker_memory() -> None:
    # A worker remembers whether its last claim ran quickly (the next claim's size): each test
    # starts as a fresh worker.
    from tombstones.jobs.engine import runner

    # (and which handlers ran slowly: a slow one gets a group of its own).
    runner.current().reset_pace()
    # (and where its scans of the hints start: a floor left by another test's clock).
    from tombstones.jobs.ledger import hint_floor

    hint_floor.forget()
