"""README.md's "With Django's tasks framework", followed word for word.

As tests/acceptance/test_readme.py (whose virtualenv and shell it reuses), through the README's
other install line: the wheel built from this checkout, in a fresh virtualenv; ``startproject``,
the step-by-step section's blocks up to step 9 (the section starts from there), then this
section's blocks: ``TASKS`` in the settings, the task module, and its shell commands with a real
``qcluster``. Their printed output must be what the README shows.

The virtualenv gets the Django pip picks for the suite's Python: Django 6 on Python 3.12+ (CI's
Django 6 suite), where the section runs as written; Django 5.2 on Python 3.11 (CI's Django 5.2
suite), where the section's own Django 5.2 steps are followed too: the ``tasks`` extra, the
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
    PACKAGE,
    ROOT,
    Site,
    wait_for_line,
)
from tests.readme import block, readme_blocks

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.walkthrough, pytest.mark.tasks]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's other install: the wheel built from this checkout (``make wheel``)."""
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("the README's project runs on SQLite: the SQLite suites run this test")
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
# Outside the README's text: what the test checks beyond its printed output (manage.py shell).
DJANGO_MAJOR = "python -c 'import django; print(django.VERSION[0])'"
# Django 6's shell first says what it imported by itself, then a blank line: not the README's.
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


def printed(out: str) -> str:
    """What a README command printed itself."""
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


def test_readme_tasks__a_django_task_runs_then_is_rejected_for_a_deleted_customer(
    wheel: Path,
    tmp_path: Path,
) -> None:
    blocks = readme_blocks()
    site = Site(tmp_path)

    # Step 1 of the walk-through, by its other install line: the wheel of this checkout.
    install = block(blocks, "install", "sh")
    assert install.startswith(f"{PACKAGE}\n"), install
    site.sh(install.replace(PACKAGE, f"pip install {wheel}", 1))
    major = int(site.sh(DJANGO_MAJOR).stdout)

    settings_py = site.dir / "mysite" / "settings.py"
    settings = [
        settings_py.read_text(),
        block(blocks, "settings", "python"),
        block(blocks, "tasks-settings", "python"),
    ]
    module = "\n\n\n".join(
        block(blocks, name, "python") for name in ("tasks-module", "tasks-more", "tasks-plain")
    )
    assert DJANGO_TASK_IMPORT in module.splitlines()
    if major < 6:
        # The section's Django 5.2 steps: the extra, the backport's app, its import.
        extra = block(blocks, "tasks-backport-install", "sh")
        assert extra == TASKS_EXTRA, extra
        site.sh(f'pip install "{wheel}[tasks]"')
        settings.append(block(blocks, "tasks-backport-settings", "python"))
        backport = block(blocks, "tasks-backport-import", "python")
        module = module.replace(DJANGO_TASK_IMPORT, backport, 1)
    settings_py.write_text("\n".join(settings) + "\n")
    app = site.dir / "customers"
    (app / "models.py").write_text(block(blocks, "models", "python") + "\n")
    (app / "handlers.py").write_text(block(blocks, "handlers", "python") + "\n")
    (app / "admin.py").write_text(block(blocks, "admin", "python") + "\n")
    (app / "tasks.py").write_text(module + "\n")

    migrated = site.sh(block(blocks, "migrate", "sh"))
    assert "System check identified no issues (0 silenced)." in migrated.stdout

    jobs = block(blocks, "jobs", "sh")
    log = tmp_path / "qcluster.log"
    with site.background(block(blocks, "qcluster", "sh"), log):
        # Steps 8-9, where the section starts.
        site.sh(block(blocks, "enqueue", "sh"))
        wait_for_line(site, jobs, block(blocks, "jobs-succeeded", "text"), log)
        site.sh(block(blocks, "delete", "sh"))
        wait_for_line(site, jobs, block(blocks, "jobs-rejected", "text"), log)

        # 3. Enqueue: the job's id, READY, the record as its snapshot; then SUCCESSFUL.
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

        # 5. The fenced task of two records runs in its fence's lane; without a fence, refused.
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

        # 6. A plain task: no record, a lane of its own; its pk mistake refused.
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
