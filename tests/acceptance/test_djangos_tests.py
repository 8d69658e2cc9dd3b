"""Django's own ``tests/tasks`` against TombstoneBackend, from the Django this suite runs.

The test modules are taken from Django's source distribution on PyPI (the version installed
here), adapted by :data:`REWRITES` only, and run by pytest in a process of their own. Every
test that fails must be in :data:`KNOWN_FAILURES` with its reason (docs/tasks.md lists the same),
and every test there must fail: a regression, or a fix that leaves the list stale, fails this
test. The list is Django 6.1's; other versions skip it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import django
import pytest

pytestmark = [pytest.mark.tasks, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DJANGO_SDIST_CACHE", Path.home() / ".cache" / "tombstones-sdist"))
PACKAGE = "tasks"
# Django's test modules of the tasks framework, and whether jobs run at their enqueue's commit
# (django-q2's sync mode: the immediate backend's tests) or stay queued (the dummy backend's).
MODULES = {
    "test_tasks.py": False,
    "test_dummy_backend.py": False,
    "test_immediate_backend.py": True,
}
# The adaptation, all of it: Django's two backends become ours, and its test cases reach the
# database (TombstoneBackend keeps its jobs there; a job runs once its enqueue commits).
REWRITES = [
    ('"django.tasks.backends.dummy.DummyBackend"', '"tests.djangos_tasks.Stored"'),
    (
        "from django.tasks.backends.dummy import DummyBackend",
        "from tests.djangos_tasks import Stored as DummyBackend",
    ),
    ('"django.tasks.backends.immediate.ImmediateBackend"', '"tombstones.tasks.TombstoneBackend"'),
    (
        "from django.tasks.backends.immediate import ImmediateBackend",
        "from tombstones.tasks import TombstoneBackend as ImmediateBackend",
    ),
    ("SimpleTestCase", "TransactionTestCase"),
    ("    available_apps = []\n", ""),
]

# Why each of Django's tests that fails here fails (docs/tasks.md, "Django's own tests").
SYNC_IN_ASYNC = (
    "it calls get_result() or refresh() from async code: our results are read from the "
    "database, which Django refuses there (aget_result() and arefresh() work)"
)
IN_MEMORY = "it edits the dummy backend's in-memory result and expects refresh() to read it back"
CAN_DO_MORE = "the immediate backend cannot read a result or defer a task; ours can"
AFTER_COMMIT = "ours writes the job in the caller's transaction and runs it after the commit"
NO_MESSAGE = "it expects the exception's message in the log: ours keep class and frames only"
EXACT_CLASS = "an unserialisable return value raises InvalidResult, a TypeError subclass"
ONE_MODE = "the module's 'immediate' alias runs without sync mode here: its task has not run"
KNOWN_FAILURES: dict[str, str] = {
    "test_tasks.py::TaskTestCase::test_get_missing_result": SYNC_IN_ASYNC,
    "test_tasks.py::TaskTestCase::test_refresh_result": SYNC_IN_ASYNC,
    "test_dummy_backend.py::DummyBackendTestCase::test_get_missing_result": SYNC_IN_ASYNC,
    "test_dummy_backend.py::DummyBackendTestCase::test_refresh_result_async": SYNC_IN_ASYNC,
    "test_dummy_backend.py::DummyBackendTestCase::test_refresh_result": IN_MEMORY,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_get_result": CAN_DO_MORE,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_refresh_result": CAN_DO_MORE,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_pass_run_after": CAN_DO_MORE,
    "test_immediate_backend.py::ImmediateBackendTransactionTestCase::"
    "test_doesnt_wait_until_transaction_commit_by_default": AFTER_COMMIT,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_catches_exception": NO_MESSAGE,
    "test_immediate_backend.py::ImmediateBackendTestCase::test_complex_return_value": EXACT_CLASS,
    "test_tasks.py::TaskTestCase::test_task_error_invalid_exception": ONE_MODE,
    "test_tasks.py::TaskTestCase::test_task_error_unknown_module": ONE_MODE,
}


def _source(version: str) -> Path:
    """Django's sdist of ``version`` (downloaded once into CACHE)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob(f"[dD]jango-{version}.tar.gz"))
    if not found:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *("--no-binary", ":all:", f"django=={version}", "--dest", str(CACHE)),
            ],
            check=True,
            timeout=300,
        )
        found = sorted(CACHE.glob(f"[dD]jango-{version}.tar.gz"))
    assert found, f"pip downloaded no sdist of Django {version} into {CACHE}"
    return found[0]


def _extract(sdist: Path, into: Path) -> Path:
    package = into / PACKAGE
    package.mkdir()
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            parts = Path(member.name).parts
            if parts[1:3] == ("tests", "tasks") and member.isfile() and len(parts) == 4:
                data = archive.extractfile(member)
                assert data is not None
                text = data.read().decode()
                if parts[3] in MODULES:
                    for old, new in REWRITES:
                        text = text.replace(old, new)
                (package / parts[3]).write_text(text)
    assert (package / "tasks.py").exists(), f"no tests/tasks in {sdist.name}"
    return package


def _failures(report: Path) -> tuple[set[str], int]:
    """The ids (``module::Class::test``) that failed or errored, and the number run."""
    failed, run = set(), 0
    for case in ET.parse(report).iter("testcase"):
        run += 1
        module = case.get("classname", "").split(".")
        name = f"{module[-2]}.py::{module[-1]}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(name)
    return failed, run


@pytest.mark.skipif(
    django.VERSION[:2] != (6, 1), reason="the known failures are Django 6.1's (CI's Django 6)"
)
def test_djangos_own_tasks_tests__fail_only_as_listed(tmp_path: Path) -> None:
    package = _extract(_source(django.__version__), tmp_path)
    failed: set[str] = set()
    ran = 0
    for module, sync in MODULES.items():
        report = tmp_path / f"{module}.xml"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "TEST_DB_SUFFIX": f"_djangos_{os.getpid()}",
        }
        env.pop("Q_SYNC", None)
        if sync:
            env["Q_SYNC"] = "1"
        subprocess.run(
            [
                *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"),
                *("--rootdir", str(tmp_path), f"--junitxml={report}", str(package / module)),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            timeout=600,
            check=False,
        )
        assert report.exists(), f"{module}: pytest wrote no report"
        got, count = _failures(report)
        failed |= got
        ran += count
    assert ran >= 70, f"only {ran} of Django's tests ran"
    unexpected = sorted(failed - KNOWN_FAILURES.keys())
    fixed = sorted(KNOWN_FAILURES.keys() - failed)
    assert not unexpected, f"Django's tests that fail and are not listed: {unexpected}"
    assert not fixed, f"listed as failing, but they pass (update the list and docs): {fixed}"
