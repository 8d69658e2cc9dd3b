"""The demo's environment and reset, in a copy of this checkout (tracked and new files, as a fresh
clone would have them): ``make demo-venv`` installs the app, django-q2 and the ``[demo]`` extra
and none of the dev tools; ``make demo-reset`` starts the demo's data over, and refuses while the
demo runs on any address; the demo's CRM jobs post to the demo's own address; the demo's
walk-through (docs/demo.md), followed with a real ``make demo``, shows the four race cases it
says; ``make demo | tee`` stops every process it started on Ctrl-C and when its tee goes, and
shows each password once."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.acceptance.processes import session
from tests.readme import block, readme_blocks

pytestmark = [pytest.mark.slow, pytest.mark.walkthrough]

ROOT = Path(settings.BASE_DIR)
DEMO_PACKAGES = {"django", "django-q2", "django-environ", "tqdm", "django-tombstone-guard"}
DEV_TOOLS = {"pytest", "playwright", "mypy", "ruff", "django-stubs", "hypothesis", "psycopg"}
# The test run's own variables: the demo must not see them (it would post to another CRM, or use
# another database).
PRIVATE_ENV = ("DATABASE_URL", "REDIS_URL", "DEMO_ADDR", "CRM_URL", "TEST_DB_SUFFIX", "Q_NAME")
CUSTOMER = """
from project.customers.models import Customer
c = Customer.all_objects.get(reference="C-1001")
print("C-1001", c.generation, c.deleted_at is not None, c.name)
"""


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if connection.vendor != "sqlite":
        pytest.skip("the demo runs on SQLite: the SQLite suites run this test")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    copy = tmp_path_factory.mktemp("checkout")
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


def run(
    checkout: Path, *args: str, check: bool = True, **env: str
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
    done = subprocess.run(
        list(args),
        cwd=checkout,
        env={**base, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def test_demo__own_venv_without_dev_tools_and_a_reset_that_starts_over(checkout: Path) -> None:
    python = getattr(sys, "_base_executable", sys.executable)
    run(checkout, "make", "demo-venv", f"PYTHON={python}")
    venv_python = str(checkout / ".venv-demo" / "bin" / "python")
    listed = run(checkout, venv_python, "-m", "pip", "list", "--format=freeze").stdout
    installed = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert installed >= DEMO_PACKAGES
    assert installed & DEV_TOOLS == set()

    addr = free_address()
    reset = run(checkout, "make", "demo-reset", DEMO_ADDR=addr)
    assert "demo reset" in reset.stdout
    manage = [venv_python, "manage.py"]

    # Delete a customer, leave a mail behind, then re-create it with the demo page's command.
    run(
        checkout,
        *manage,
        "shell",
        "-c",
        "from project.customers.models import Customer; "
        'Customer.objects.get(reference="C-1001").delete()',
    )
    (checkout / ".mail").mkdir(exist_ok=True)
    (checkout / ".mail" / "sent.log").write_text("a mail")
    recreate = block(readme_blocks(), "demo-recreate", "sh")
    assert recreate.startswith(".venv-demo/bin/python manage.py shell -c "), recreate
    run(checkout, "bash", "-c", recreate)
    assert "C-1001 2 False Ada Lovelace" in run(checkout, *manage, "shell", "-c", CUSTOMER).stdout

    # The reset refuses a database that is not the demo's, and leaves it alone.
    other = checkout / "other.sqlite3"
    refused = run(
        checkout,
        "make",
        "demo-reset",
        check=False,
        DEMO_ADDR=addr,
        DATABASE_URL=f"sqlite:///{other}",
    )
    assert refused.returncode != 0
    assert "not resetting it" in refused.stderr
    assert not other.exists()

    # The reset starts over: generation 1 again, no mail.
    run(checkout, "make", "demo-reset", DEMO_ADDR=addr)
    assert "C-1001 1 False Ada Lovelace" in run(checkout, *manage, "shell", "-c", CUSTOMER).stdout
    assert not (checkout / ".mail").exists()


def test_demo__reset_refuses_while_the_demo_listens(checkout: Path) -> None:
    if not (checkout / ".venv-demo" / "bin" / "python").exists():
        python = getattr(sys, "_base_executable", sys.executable)
        run(checkout, "make", "demo-venv", f"PYTHON={python}")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        addr = f"127.0.0.1:{server.getsockname()[1]}"
        refused = run(checkout, "make", "demo-reset", check=False, DEMO_ADDR=addr)
    assert refused.returncode != 0
    assert "stop the demo (Ctrl-C) before resetting it" in refused.stderr


def demo_venv(checkout: Path) -> str:
    venv_python = checkout / ".venv-demo" / "bin" / "python"
    if not venv_python.exists():
        python = getattr(sys, "_base_executable", sys.executable)
        run(checkout, "make", "demo-venv", f"PYTHON={python}")
    return str(venv_python)


@contextlib.contextmanager
def running_demo(checkout: Path, addr: str, log: Path) -> Iterator[None]:
    """``make demo DEMO_ADDR=addr`` until its admin answers; stopped with Ctrl-C (SIGINT)."""
    env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
    env.update(DEMO_ADMIN_PASSWORD="x-Test-only-1", DEMO_AUDITOR_PASSWORD="x-Test-only-2")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["make", "demo", f"DEMO_ADDR={addr}"],
            cwd=checkout,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 180
            while True:
                assert proc.poll() is None, f"make demo exited:\n{log.read_text()}"
                try:
                    # Closed at once: an open response is a ResourceWarning in a later test.
                    urllib.request.urlopen(f"http://{addr}/admin/login/", timeout=2).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"no demo on {addr}:\n{log.read_text()}"
                    time.sleep(0.5)
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(40)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def shell(checkout: Path, code: str) -> str:
    python = str(checkout / ".venv-demo" / "bin" / "python")
    return run(checkout, python, "manage.py", "shell", "-c", code).stdout


def wait_until(checkout: Path, code: str, expected: str, log: Path, timeout: float = 90) -> str:
    """Run ``code`` in the demo's shell until its output holds ``expected``; bounded."""
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = shell(checkout, code)
        if expected in seen:
            return seen
        time.sleep(0.5)
    pytest.fail(f"never saw {expected!r}; last output:\n{seen}\ndemo:\n{log.read_text()}")


JOBS = """
from tombstones.models import Job
for job in Job.objects.order_by("id"):
    print(job.pk, job.handler, job.status, job.reason or "-", job.attempts)
"""


def test_demo__on_another_address_a_reset_refuses_and_crm_jobs_post_to_the_demo(
    checkout: Path, tmp_path: Path
) -> None:
    demo_venv(checkout)
    addr, elsewhere = free_address(), free_address()
    log = tmp_path / "demo.log"
    with running_demo(checkout, addr, log):
        # A reset given another address (the default, say) finds nothing listening there: the
        # running demo's pid file stops it.
        refused = run(checkout, "make", "demo-reset", check=False, DEMO_ADDR=elsewhere)
        assert refused.returncode != 0, refused.stdout
        assert f"on {addr}): stop the demo (Ctrl-C) before resetting it" in refused.stderr
        count = "from project.customers.models import Customer; print(Customer.objects.count())"
        assert shell(checkout, count).splitlines()[-1] == "5"  # its data is there

        # The CRM job posts to this demo's fake CRM, not to port 8000.
        shell(
            checkout,
            "import tombstones; from project.customers.models import Customer; "
            'tombstones.enqueue("customers.sync_crm", Customer.objects.get(reference="C-1002"))',
        )
        wait_until(checkout, JOBS, "customers.sync_crm succeeded - 1", log)
        received = "from project.customers.models import CrmContact; "
        received += "print(list(CrmContact.objects.values_list('reference', 'deliveries')))"
        assert shell(checkout, received).splitlines()[-1] == "[('C-1002', 1)]"
    assert not (checkout / ".demo.pid").exists()
    assert "demo reset" in run(checkout, "make", "demo-reset", DEMO_ADDR=elsewhere).stdout


ADMIN_DELETE = """
from django.contrib.auth import get_user_model
from django.test import Client
from django.test.utils import setup_test_environment
from project.customers.models import Customer

setup_test_environment()  # the test client's host, "testserver", is allowed
client = Client()
client.force_login(get_user_model().objects.get(username="admin"))
customer = Customer.objects.get(reference="C-1001")
done = client.post(f"/admin/customers/customer/{customer.pk}/delete/", {"post": "yes"})
print("deleted", done.status_code, Customer.all_objects.get(pk=customer.pk).is_tombstone)
"""

METRICS = """
from django.contrib.auth import get_user_model
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()
client = Client()
client.force_login(get_user_model().objects.get(username="admin"))
page = client.get("/tombstones/metrics")
dashboard = client.get("/admin/tombstones/job/dashboard/").content.decode()
live = [l for l in page.content.decode().splitlines() if l.startswith("tombstones_workers{")]
workers = sum(int(float(l.rsplit(" ", 1)[1])) for l in live)
print("metrics", page.status_code, "linked", 'id="metrics-link"' in dashboard, "workers", workers)
"""


def test_demo__the_readme_walk_through_shows_the_four_race_cases(
    checkout: Path, tmp_path: Path
) -> None:
    """docs/demo.md's "The four race cases" step by step, on a running demo; delays shortened."""
    demo_venv(checkout)
    run(checkout, "make", "demo-reset", DEMO_ADDR=free_address())
    blocks = readme_blocks()
    enqueue = block(blocks, "demo-enqueue", "sh")
    delays = re.findall(r"timedelta\(seconds=(\d+)\)", enqueue)
    assert delays == ["30", "90"], enqueue
    # Time enough for the admin delete before the first, and for the re-create before the second.
    enqueue = enqueue.replace("seconds=30", "seconds=12").replace("seconds=90", "seconds=35")
    log = tmp_path / "demo.log"
    addr = free_address()
    with running_demo(checkout, addr, log):
        run(checkout, "bash", "-c", enqueue)
        # 2. The admin's delete (as staff would click it), then 3. the job after the delete.
        assert "deleted 302 True" in shell(checkout, ADMIN_DELETE)
        wait_until(checkout, JOBS, "2 customers.update_sheet_row rejected source_deleted", log)
        # 4. The re-create before the old job: generation_changed.
        assert "generation_changed" not in shell(checkout, JOBS)
        run(checkout, "bash", "-c", block(blocks, "demo-recreate", "sh"))
        wait_until(checkout, JOBS, "generation_changed", log)
        listed = run(checkout, "bash", "-c", block(blocks, "demo-jobs", "sh")).stdout
        # The listing as the demo page shows it (after Django's "N objects imported" line).
        assert listed.endswith(block(blocks, "demo-jobs-done", "text") + "\n"), listed
        # Step 2's claim: the erasure (job 4) ran before the job delayed past the delete (job 2).
        order = "from tombstones.models import Job; e, d = Job.objects.get(pk=4), "
        order += "Job.objects.get(pk=2); print('erased first', e.finished_at < d.started_at)"
        assert shell(checkout, order).splitlines()[-1] == "erased first True"
        # 5. The two cases inside a running job, played by the race fixture.
        fixture = run(checkout, "bash", "-c", block(blocks, "demo-racefixture", "sh")).stdout
        lines = [line.rstrip() for line in fixture.splitlines()]
        for line in block(blocks, "demo-racefixture-cases", "text").splitlines():
            assert line in lines, fixture
        # The metrics page the demo page names: refused to anonymous requests,
        # linked from the dashboard for the admin, and counting the demo's live workers.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{addr}/tombstones/metrics", timeout=10)
        refused.value.close()  # the error holds the response's socket
        assert refused.value.code == 401
        shown = shell(checkout, METRICS).splitlines()[-1]
        assert re.fullmatch(r"metrics 200 linked True workers [1-9]\d*", shown), shown


@pytest.mark.parametrize("stop", ["ctrl-c", "tee-gone"])
def test_demo__piped_to_tee_leaves_no_process_behind_and_shows_each_password_once(
    checkout: Path, tmp_path: Path, stop: str
) -> None:
    """``make demo | tee demo.log`` as issue 38 ran it: Ctrl-C (SIGINT to the whole foreground
    group, the tee included), or the tee killed alone, leaves nothing of the demo running."""
    demo_venv(checkout)
    env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
    env.update(DEMO_ADMIN_PASSWORD="x-Test-only-1", DEMO_AUDITOR_PASSWORD="x-Test-only-2")
    log = tmp_path / "demo.log"
    log.touch()
    errors = (tmp_path / "stderr.log").open("wb")
    # A shell of its own session and process group, as a terminal's would be.
    proc = subprocess.Popen(
        ["bash", "-c", f"make demo DEMO_ADDR={free_address()} | tee {log}"],
        cwd=checkout,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=errors,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while "Ctrl-C stops the server" not in log.read_text():
            assert proc.poll() is None, f"the demo exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no banner:\n{log.read_text()}"
            time.sleep(0.2)
        shown = log.read_text()
        for password in ("x-Test-only-1", "x-Test-only-2"):
            assert shown.count(password) == 1, shown
        started = session(proc.pid)
        assert any(b"qcluster" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in started)

        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            tee = [p for p in started if Path(f"/proc/{p}/comm").read_text().strip() == "tee"]
            assert len(tee) == 1, started
            os.kill(tee[0], signal.SIGKILL)
        proc.wait(60)
        deadline = time.monotonic() + 30
        while left := session(proc.pid):
            assert time.monotonic() < deadline, f"still running after {stop}: {left}"
            time.sleep(0.2)
    finally:
        for pid in session(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        errors.close()
    assert not (checkout / ".demo.pid").exists()
