"""The tutorial, then the PostgreSQL and Redis guide, followed word for word.

The text lives in docs/tutorial.md and docs/howto/postgres-redis.md.

A copy of this checkout (its tracked and new files, as a fresh clone has them) sits next to the
new project as ``../django-tombstone-guard``, and the tutorial's own install line installs it and
watchfiles into a fresh virtualenv outside the repository; ``django-admin startproject`` and
``startapp`` make the project; the tutorial's settings, model, handler and admin blocks are pasted
where it says; its shell commands run as they are, with a real cluster started as its step 7 says
(``qcluster`` under ``watchfiles``). Then the guide moves the same project to PostgreSQL and the
Redis broker, and the tutorial's job succeeds there. The blocks are read from README.md and
docs/ by their ``<!-- readme-test: NAME -->`` markers (tests/readme.py), so a change to the text
that breaks the steps breaks this test.

The tutorial's project is SQLite whatever the suite's database, so it runs with the SQLite suites
(in CI: Django 5.2 on Python 3.11 and Django 6 on Python 3.12, as pip picks for the interpreter);
the guide's part needs the PostgreSQL and the Redis on 127.0.0.1 the suites use, and is skipped
without them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.readme import block, readme_blocks

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.walkthrough]

ROOT = Path(settings.BASE_DIR)
CHECKOUT = "django-tombstone-guard"  # the tutorial's name for the checkout, next to the project
PACKAGE = f"pip install ../{CHECKOUT}"
INSTALL = f"{PACKAGE} watchfiles"  # the tutorial's first line: the package and the reloader
REDIS_PACKAGE = f'pip install "../{CHECKOUT}[redis]"'
POSTGRES_PACKAGE = f'pip install "../{CHECKOUT}[postgres,redis]" django-environ'
# The guide's PostgreSQL: this server (the suites' own, or DATABASE_URL's when it is PostgreSQL);
# the test creates a database of its own there, as the guide's `createdb mysite` does.
POSTGRES_SERVER = "postgres://postgres@127.0.0.1:5432/postgres"
REDIS = ("127.0.0.1", 6379)  # the guide's redis://127.0.0.1:6379/0
# Variables of this test run that must not leak into the new project.
PRIVATE_ENV = (
    "DJANGO_SETTINGS_MODULE",
    "DATABASE_URL",
    "REDIS_URL",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "TEST_DB_SUFFIX",
    "Q_NAME",
    "Q_WORKERS",
    "Q_SYNC",
)
# Outside tests: what the test checks beyond the tutorial's own output (run with manage.py shell).
TOMBSTONE_STATE = """
from customers.models import Customer
c = Customer.all_objects.get(reference="C-1")
print("tombstone", c.deleted_at is not None, repr(c.name), repr(c.email), c.generation, c.version)
"""
ADMIN_DELETE = """
from django.contrib.auth import get_user_model
from django.test import Client
from django.test.utils import setup_test_environment
from customers.models import Customer, SheetRow

setup_test_environment()  # the test client's host, "testserver", is allowed
customer = Customer.objects.create(reference="C-2", name="Grace Hopper", email="grace@example.com")
SheetRow.objects.create(customer=customer)
staff = get_user_model().objects.create_superuser("staff", "staff@example.com", "x-Test-only-1")
client = Client()
client.force_login(staff)
url = f"/admin/customers/customer/{customer.pk}/delete/"
page = client.get(url)
print("confirm", page.status_code, "Cannot delete" in page.content.decode())
done = client.post(url, {"post": "yes"})
customer = Customer.all_objects.get(pk=customer.pk)
print("deleted", done.status_code, customer.deleted_at is not None, SheetRow.objects.count())
"""


# Outside the guide: create and drop the test's own database (psycopg, from the guide's extra).
CREATE_DB = """
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute(f"DROP DATABASE IF EXISTS {sys.argv[2]}")
    if sys.argv[3] == "create":
        conn.execute(f"CREATE DATABASE {sys.argv[2]}")
"""


WHERE = """
from django.db import connection
from django_q.brokers import get_broker
print(connection.vendor, type(get_broker()).__name__)
"""


def reachable(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=2):
        return True
    return False


def copy_checkout(to: Path) -> None:
    """This checkout's tracked and new (not ignored) files, as a fresh clone would have them."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)


class Site:
    """A directory with its own virtualenv; shell commands run there as a user would type them."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "site"
        self.dir.mkdir()
        self.venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True, timeout=120)
        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.env = env

    def sh(self, script: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check and done.returncode != 0:
            pytest.fail(f"failed ({done.returncode}): {script}\n{done.stdout}\n{done.stderr}")
        return done

    def shell(self, code: str) -> str:
        """The test's own checks: ``manage.py shell -c code``, no shell quoting involved."""
        python = str(self.venv / "bin" / "python")
        done = subprocess.run(
            [python, "manage.py", "shell", "-c", code],
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            pytest.fail(f"failed ({done.returncode}):\n{code}\n{done.stdout}\n{done.stderr}")
        return done.stdout

    @contextlib.contextmanager
    def background(self, script: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=self.dir,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group of its own: every worker is stopped with it
            )
            try:
                yield proc
            finally:
                # Ctrl-C, as the tutorial says: SIGINT to the whole foreground group. (SIGTERM to
                # the group, or to the sentinel and its parent, can leave qcluster hanging.)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(30)
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)


def wait_for_line(site: Site, script: str, expected: str, log: Path, timeout: float = 60) -> None:
    """Run ``script`` until a line of its output is ``expected``; bounded."""
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = site.sh(script).stdout
        if expected in seen.splitlines():
            return
        time.sleep(0.5)
    pytest.fail(f"never printed {expected!r}; last output:\n{seen}\nqcluster:\n{log.read_text()}")


def test_readme__a_new_project_runs_a_job_then_rejects_one_for_a_deleted_customer(
    tmp_path: Path,
) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the tutorial's project runs on SQLite: the SQLite suites run this test")
    blocks = readme_blocks()
    site = Site(tmp_path)
    copy_checkout(tmp_path / CHECKOUT)

    # 1. The tutorial's install line, as it is: the checkout next to the project, and watchfiles.
    install = block(blocks, "install", "sh")
    assert install.startswith(f"{INSTALL}\n"), install
    site.sh(install)
    assert "django-tombstone-guard" in site.sh("pip list --format=freeze").stdout

    # Before step 2, as the issue found it: no Q_CLUSTER and no redis package. Check E020 says so.
    settings_py = site.dir / "mysite" / "settings.py"
    pristine = settings_py.read_text()
    settings_py.write_text(pristine + '\nINSTALLED_APPS += ["django_q", "tombstones"]\n')
    unconfigured = site.sh("python manage.py check", check=False)
    assert unconfigured.returncode == 1
    assert "(tombstones.E020) Q_CLUSTER is not set" in unconfigured.stderr
    assert "'redis' cannot be imported" in unconfigured.stderr

    # 2-5. Settings at the end of settings.py; models, handlers and admin as the app's files.
    settings_py.write_text(pristine + "\n" + block(blocks, "settings", "python") + "\n")
    app = site.dir / "customers"
    (app / "models.py").write_text(block(blocks, "models", "python") + "\n")
    (app / "handlers.py").write_text(block(blocks, "handlers", "python") + "\n")
    (app / "admin.py").write_text(block(blocks, "admin", "python") + "\n")

    # 6. Migrations, tables, and a clean check.
    migrated = site.sh(block(blocks, "migrate", "sh"))
    assert "System check identified no issues (0 silenced)." in migrated.stdout

    # 7-9. A real cluster, under watchfiles: the job succeeds; after the delete, the stale
    # instance's job is rejected.
    jobs = block(blocks, "jobs", "sh")
    log = tmp_path / "qcluster.log"
    qcluster = block(blocks, "qcluster", "sh")
    assert qcluster.startswith("watchfiles "), qcluster
    with site.background(qcluster, log):
        site.sh(block(blocks, "enqueue", "sh"))
        wait_for_line(site, jobs, block(blocks, "jobs-succeeded", "text"), log)
        site.sh(block(blocks, "delete", "sh"))
        wait_for_line(site, jobs, block(blocks, "jobs-rejected", "text"), log)

        # What the tutorial says about the tombstone, and its admin claim.
        assert "tombstone True '' '' 1 3" in site.shell(TOMBSTONE_STATE).splitlines()
        admin = site.shell(ADMIN_DELETE).splitlines()
        assert "confirm 200 False" in admin
        assert "deleted 302 True 2" in admin

    # The guide, workers stopped (the block above ended them with Ctrl-C, as its step 1 says).
    # Its Redis-only variant first, on SQLite: check names the missing package, the extra brings it.
    settings_py.write_text(
        settings_py.read_text() + "\n" + block(blocks, "redis-settings", "python") + "\n"
    )
    no_redis = site.sh("python manage.py check", check=False)
    assert no_redis.returncode == 1
    assert "(tombstones.E020) Q_CLUSTER selects django-q2's Redis broker" in no_redis.stderr
    redis_install = block(blocks, "redis-install", "sh")
    assert redis_install == REDIS_PACKAGE, redis_install
    site.sh(redis_install)
    assert "System check identified no issues" in site.sh("python manage.py check").stdout

    # The guide's PostgreSQL: the extras and django-environ, a database, DATABASE_URL, its settings.
    if not (reachable("127.0.0.1", 5432) and reachable(*REDIS)):
        pytest.skip("the guide's part needs PostgreSQL and Redis on 127.0.0.1")
    postgres_install = block(blocks, "postgres-install", "sh")
    assert postgres_install == POSTGRES_PACKAGE, postgres_install
    site.sh(postgres_install)
    server = os.environ.get("DATABASE_URL", "")
    server = server if server.startswith("postgres") else POSTGRES_SERVER
    name = f"readme_test_{os.getpid()}"
    python = str(site.venv / "bin" / "python")
    subprocess.run([python, "-c", CREATE_DB, server, name, "create"], check=True, timeout=60)
    try:
        site.env["DATABASE_URL"] = f"{server.rsplit('/', 1)[0]}/{name}"
        settings_py.write_text(
            settings_py.read_text() + "\n" + block(blocks, "postgres-settings", "python") + "\n"
        )
        where = site.shell(WHERE).strip().splitlines()[-1]
        assert where == "postgresql Redis", where
        migrated = site.sh(block(blocks, "postgres-migrate", "sh"))
        assert "System check identified no issues (0 silenced)." in migrated.stdout

        # The tutorial's steps 7-8 again: the job succeeds, on PostgreSQL, woken through Redis.
        log = tmp_path / "qcluster-postgres.log"
        with site.background(qcluster, log):
            site.sh(block(blocks, "enqueue", "sh"))
            wait_for_line(site, jobs, block(blocks, "jobs-succeeded", "text"), log)
    finally:
        subprocess.run([python, "-c", CREATE_DB, server, name, "drop"], check=False, timeout=60)
