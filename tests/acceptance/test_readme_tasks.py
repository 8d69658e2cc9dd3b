"""The guide to Django's tasks framework (docs/howto/django-tasks.md), followed word for word,
in its order, with the tutorial's cluster running.

As tests/acceptance/test_readme.py (whose virtualenv and shell it reuses), through the tutorial's
other install line: the wheel built from this checkout (and watchfiles), in a fresh virtualenv;
``startproject``, the tutorial's blocks up to its step 9 with the cluster started as its step 7
says (``qcluster`` under ``watchfiles``), then, with that cluster still running as a reader's
would be, the guide's blocks: ``TASKS`` added to the settings, the task module written, and its
shell commands. The cluster must restart by itself on each change (the log shows it) and the
jobs must then succeed; a cluster that kept its old code would leave them ``retry_wait`` /
``handler_unknown``. Their printed output must be what the guide shows.

The virtualenv gets the Django pip picks for the suite's Python: Django 6 on Python 3.12+ (CI's
Django 6 suite), where the guide runs as written; Django 5.2 on Python 3.11 (CI's Django 5.2
suite), where the guide's own Django 5.2 steps are followed too: the ``tasks`` extra, the
``django_tasks`` app, and ``from django_tasks import task`` in place of ``django.tasks``.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.acceptance.test_readme import (  # the same virtualenv and shell
    CHECKOUT,
    INSTALL,
    PACKAGE,
    ROOT,
    Site,
    wait_for_line,
)
from tests.readme import block, readme_blocks

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.walkthrough, pytest.mark.tasks]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tutorial's other install: the wheel built from this checkout (``make wheel``)."""
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("the tutorial's project runs on SQLite: the SQLite suites run this test")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = out.glob("django_tombstone_guard-*.whl")
    return found


TASKS_EXTRA = f'pip install "../{CHECKOUT}[tasks]"'
DJANGO_TASK_IMPORT = "from django.tasks import task"
# Outside the guide's text: what the test checks beyond its printed output (manage.py shell).
DJANGO_MAJOR = "python -c 'import django; print(django.VERSION[0])'"
# Django 6's shell first says what it imported by itself, then a blank line: not the guide's.
AUTO_IMPORTS = re.compile(r"\A\d+ objects? imported automatically \(.*\)\.\n\n")
AFTER_SUCCESS = """
from customers.models import Customer, SheetRow
from customers.tasks import refresh_sheet_row
from tombstones.models import Job

result = refresh_sheet_row.get_result("3")
print("return", result.return_value, result.started_at <= result.finished_at, result.worker_ids)
job = Job.objects.get(pk=3)
print("job", job.handler, job.lane, job.status, job.attempts)
row = SheetRow.objects.get(customer__reference="C-2")
print("row", row.name_hash)
"""
TOMBSTONE_STATE = """
from customers.models import Customer
c = Customer.all_objects.get(reference="C-2")
print("tombstone", c.deleted_at is not None, repr(c.name), repr(c.email), c.generation, c.version)
"""
# Step 5's fenced task, run: the duplicate's row moves to the customer, in the customer's lane.
ADOPT = """
from customers.models import Customer, SheetRow
from customers.tasks import adopt_rows

customer = Customer.objects.create(reference="C-5", name="Alan Turing", email="alan@example.com")
duplicate = Customer.objects.create(reference="C-6", name="A. Turing", email="at@example.com")
row = SheetRow.objects.create(customer=duplicate)
result = adopt_rows.enqueue(customer, duplicate)
print(result.id, [arg["pk"] for arg in result.args], row.pk)
"""
ADOPTED = """
from customers.models import SheetRow
from customers.tasks import adopt_rows
from tombstones.models import Job

print(adopt_rows.get_result("5").status, Job.objects.get(pk=5).lane,
      list(SheetRow.objects.filter(customer__reference="C-5").values_list("id", flat=True)))
"""
# Step 5: "a call with two records and no fence is refused".
UNFENCED = """
from customers.models import Customer
from customers.tasks import refresh_sheet_row

first, second = Customer.objects.filter(reference__in=["C-5", "C-6"])
try:
    refresh_sheet_row.enqueue(first, second)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


# Step 6: a fenced task called with a pk is refused, never a plain job.
BY_PK = """
from customers.models import Customer
from customers.tasks import refresh_sheet_row

try:
    refresh_sheet_row.enqueue(Customer.objects.get(reference="C-5").pk)
except TypeError as exc:
    print(type(exc).__name__, exc)
"""


# A cluster's line once it has started (django-q2: "Q Cluster NAME [mysite] running.").
CLUSTER_RUNNING = re.compile(r"Q Cluster .* running\.$", re.MULTILINE)


def clusters_started(log: Path) -> int:
    return len(CLUSTER_RUNNING.findall(log.read_text()))


def wait_for_restart(log: Path, started: int, timeout: float = 60) -> int:
    """Wait, bounded, until the cluster has started again since ``started`` starts were logged."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = clusters_started(log)
        if now > started:
            return now
        time.sleep(0.2)
    pytest.fail(f"the cluster did not restart after the change; qcluster:\n{log.read_text()}")


def printed(out: str) -> str:
    """What a command of the text printed itself."""
    return AUTO_IMPORTS.sub("", out, count=1)


def wait_for_output(site: Site, script: str, expected: str, log: Path, timeout: float = 60) -> None:
    """Run ``script`` until its whole output is ``expected``; bounded."""
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = printed(site.sh(script).stdout)
        if seen == expected + "\n":
            return
        time.sleep(0.5)
    pytest.fail(f"never printed:\n{expected}\nlast output:\n{seen}\nqcluster:\n{log.read_text()}")


def test_readme_tasks__with_the_cluster_running_a_task_runs_then_is_rejected_for_a_deleted_one(
    wheel: Path,
    tmp_path: Path,
) -> None:
    blocks = readme_blocks()
    site = Site(tmp_path)

    # The tutorial's step 1, by its other install line: the wheel of this checkout, watchfiles.
    install = block(blocks, "install", "sh")
    assert install.startswith(f"{INSTALL}\n"), install
    site.sh(install.replace(PACKAGE, f"pip install {wheel}", 1))
    major = int(site.sh(DJANGO_MAJOR).stdout)

    # The tutorial's steps 2-6.
    settings_py = site.dir / "mysite" / "settings.py"
    settings_py.write_text(
        settings_py.read_text() + "\n" + block(blocks, "settings", "python") + "\n"
    )
    app = site.dir / "customers"
    (app / "models.py").write_text(block(blocks, "models", "python") + "\n")
    (app / "handlers.py").write_text(block(blocks, "handlers", "python") + "\n")
    (app / "admin.py").write_text(block(blocks, "admin", "python") + "\n")
    migrated = site.sh(block(blocks, "migrate", "sh"))
    assert "System check identified no issues (0 silenced)." in migrated.stdout

    jobs = block(blocks, "jobs", "sh")
    log = tmp_path / "qcluster.log"
    # The tutorial's step 7: the cluster starts here and runs to the end of the guide.
    with site.background(block(blocks, "qcluster", "sh"), log):
        # The tutorial's steps 8-9, where the guide starts.
        site.sh(block(blocks, "enqueue", "sh"))
        wait_for_line(site, jobs, block(blocks, "jobs-succeeded", "text"), log)
        site.sh(block(blocks, "delete", "sh"))
        wait_for_line(site, jobs, block(blocks, "jobs-rejected", "text"), log)
        started = clusters_started(log)
        assert started == 1, log.read_text()  # no restart so far: nothing changed

        # 1. TASKS in the settings (on Django 5.2 first the backport: its extra and its app).
        added = [block(blocks, "tasks-settings", "python")]
        if major < 6:
            extra = block(blocks, "tasks-backport-install", "sh")
            assert extra == TASKS_EXTRA, extra
            site.sh(f'pip install "{wheel}[tasks]"')
            added.append(block(blocks, "tasks-backport-settings", "python"))
        settings_py.write_text(settings_py.read_text() + "\n" + "\n".join(added) + "\n")
        started = wait_for_restart(log, started)

        # 2. The task module (on Django 5.2 with the backport's import).
        module = block(blocks, "tasks-module", "python")
        assert DJANGO_TASK_IMPORT in module.splitlines()
        if major < 6:
            backport = block(blocks, "tasks-backport-import", "python")
            module = module.replace(DJANGO_TASK_IMPORT, backport, 1)
        tasks_py = app / "tasks.py"
        tasks_py.write_text(module + "\n")

        # 3. The workers restart by themselves; then enqueue: the job's id, READY, the record as
        # its snapshot; then SUCCESSFUL at its first attempt.
        started = wait_for_restart(log, started)
        enqueued = printed(site.sh(block(blocks, "tasks-enqueue", "sh")).stdout)
        assert enqueued == block(blocks, "tasks-enqueued", "text") + "\n", enqueued
        wait_for_output(
            site, block(blocks, "tasks-result", "sh"), block(blocks, "tasks-succeeded", "text"), log
        )
        done = printed(site.shell(AFTER_SUCCESS)).splitlines()
        assert done[0].startswith("return None True ['"), done  # a worker's id: host:pid
        assert "job task:customers.tasks.refresh_sheet_row customers.customer:2 succeeded 1" in done
        digest = hashlib.sha256(b"Grace Hopper").hexdigest()
        assert f"row {digest}" in done, done

        # 4. The stale customer's task: FAILED, RecordDeleted, the reason code and the ids.
        deleted = printed(site.sh(block(blocks, "tasks-delete", "sh")).stdout)
        assert deleted == "4\n", deleted
        wait_for_output(
            site,
            block(blocks, "tasks-rejected", "sh"),
            block(blocks, "tasks-rejected-output", "text"),
            log,
        )
        # The task's update moved the customer to version 2, the delete to 3; nothing else.
        assert "tombstone True '' '' 1 3" in site.shell(TOMBSTONE_STATE).splitlines()

        # 5. Added to the module, the workers restart: the fenced task of two records runs in
        # its fence's lane; without a fence, refused.
        tasks_py.write_text(
            tasks_py.read_text() + "\n\n" + block(blocks, "tasks-more", "python") + "\n"
        )
        started = wait_for_restart(log, started)
        adopt = printed(site.shell(ADOPT)).split()
        assert adopt[:3] == ["5", "['3',", "'4']"], adopt
        row = adopt[3]
        deadline = time.monotonic() + 60
        adopted = ""
        while time.monotonic() < deadline:
            adopted = printed(site.shell(ADOPTED)).strip()
            if adopted.startswith("SUCCESSFUL"):
                break
            time.sleep(0.5)
        assert adopted == f"SUCCESSFUL customers.customer:3 [{row}]", (adopted, log.read_text())
        refused = printed(site.shell(UNFENCED)).strip()
        assert refused.startswith("UnfencedTask Task customers.tasks.refresh_sheet_row was ")
        assert "several records" in refused, refused

        # 6. A plain task, added; once the workers have restarted: no record, a lane of its own;
        # its pk mistake refused.
        tasks_py.write_text(
            tasks_py.read_text() + "\n\n" + block(blocks, "tasks-plain", "python") + "\n"
        )
        started = wait_for_restart(log, started)
        plain = printed(site.sh(block(blocks, "tasks-plain-run", "sh")).stdout)
        assert plain == block(blocks, "tasks-plain-enqueued", "text") + "\n", plain
        wait_for_output(
            site,
            block(blocks, "tasks-plain-result", "sh"),
            block(blocks, "tasks-plain-succeeded", "text"),
            log,
        )
        mistaken = printed(site.shell(BY_PK)).strip()
        assert mistaken.startswith("UnfencedTask Task customers.tasks.refresh_sheet_row is fenced")
