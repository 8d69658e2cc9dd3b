"""The demo's environment and reset, in a copy of this checkout (tracked and new files, as a fresh
clone would have them): ``make demo-venv`` installs the app, django-q2 and the ``[demo]`` extra
and none of the dev tools; ``make demo-reset`` starts the demo's data over; the README's literal
re-create command stores the values it shows."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.readme import block, readme_blocks

pytestmark = pytest.mark.slow

ROOT = Path(settings.BASE_DIR)
DEMO_PACKAGES = {"django", "django-q2", "django-environ", "tqdm", "django-tombstone-guard"}
DEV_TOOLS = {"pytest", "playwright", "mypy", "ruff", "django-stubs", "hypothesis", "psycopg"}
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
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
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

    # Delete a customer, leave a mail behind, then re-create it with the README's command.
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
