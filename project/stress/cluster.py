"""Start and stop a real django-q2 cluster (``manage.py qcluster``) as a subprocess.

Used by the ``racestress`` command and by the acceptance tests. The cluster gets its own queue
name, so two harnesses (or test runs) sharing one Redis never take each other's messages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from django.conf import settings
from django.db import connections

MANAGE = Path(settings.BASE_DIR) / "manage.py"


def ping() -> str:
    """A no-op task: its stored result proves the cluster consumes and records tasks."""
    return "pong"


def database_url(alias: str = "default") -> str:
    """A DATABASE_URL for the database this process actually uses (the test database in tests)."""
    conf = connections[alias].settings_dict
    engine = conf["ENGINE"]
    if "sqlite3" in engine:
        return f"sqlite:///{conf['NAME']}"
    if "postgresql" not in engine:
        raise ValueError(f"Unsupported database engine for a cluster subprocess: {engine}")
    user = quote(conf.get("USER") or "")
    password = conf.get("PASSWORD") or ""
    auth = f"{user}:{quote(password)}@" if password else (f"{user}@" if user else "")
    host = conf.get("HOST") or "127.0.0.1"
    port = f":{conf['PORT']}" if conf.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{conf['NAME']}"


def broker_name() -> str:
    return "redis" if getattr(settings, "REDIS_URL", "") else "orm"


@contextlib.contextmanager
def queue_namespace(name: str) -> Iterator[str]:
    """Sign and route this process's django-q2 messages under ``name`` (the cluster's Q_NAME).

    django-q2 reads its cluster name once, at import; a subprocess gets it through Q_NAME, and
    this process through the patched Conf for the duration of the block.
    """
    from django_q.conf import Conf

    saved = (Conf.PREFIX, Conf.CLUSTER_NAME)
    Conf.PREFIX = Conf.CLUSTER_NAME = name
    try:
        yield name
    finally:
        Conf.PREFIX, Conf.CLUSTER_NAME = saved


class Cluster:
    """One ``qcluster`` subprocess with ``workers`` worker processes."""

    def __init__(
        self,
        workers: int,
        *,
        name: str | None = None,
        env: dict[str, str] | None = None,
        settings_module: str | None = None,
        log_path: str | None = None,
        broker: Any = None,
    ) -> None:
        self.workers = workers
        self.broker = broker  # where the ready ping goes when the cluster's broker is not ours
        self.name = name or f"tg-{uuid.uuid4().hex[:10]}"
        self.extra_env = dict(env or {})
        self.settings_module = settings_module or os.environ.get(
            "DJANGO_SETTINGS_MODULE", "project.settings"
        )
        self.log_path = log_path or tempfile.mktemp(prefix=f"{self.name}-", suffix=".log")
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": self.settings_module,
                "DATABASE_URL": database_url(),
                "REDIS_URL": getattr(settings, "REDIS_URL", "") or "",
                "Q_WORKERS": str(self.workers),
                "Q_NAME": self.name,
                "Q_SYNC": "false",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    def launch(self) -> Cluster:
        """Start the process without waiting for it to be ready (a host joining a running job)."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, str(MANAGE), "qcluster"],
            cwd=str(MANAGE.parent),
            env=self.environment(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() can reap every child
        )
        return self

    def kill(self) -> None:
        """SIGKILL the whole process group at once: the host is gone, nothing is cleaned up."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)

    def start(self, *, ready_timeout: float = 60.0) -> Cluster:
        self.launch()
        try:
            self.wait_ready(ready_timeout)
        except BaseException:
            self.stop()  # never leave a cluster behind when the start fails
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        """Send a ping task and wait (bounded) until its result is stored."""
        from django_q.models import Task
        from django_q.tasks import async_task

        with queue_namespace(self.name):
            task_id = async_task(
                "project.stress.cluster.ping", sync=False, save=True, broker=self.broker
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"qcluster exited early:\n{self.log_tail()}")
            if Task.objects.filter(id=task_id).exists():
                return
            time.sleep(0.1)
        raise TimeoutError(f"qcluster not ready after {timeout}s:\n{self.log_tail()}")

    def messages(self) -> contextlib.AbstractContextManager[str]:
        """Route this process's messages to this cluster (see queue_namespace)."""
        return queue_namespace(self.name)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (django-q2 finishes the running tasks), then SIGKILL after ``timeout``."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
        # Whatever is left of its process group (workers of a killed sentinel), by group id.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
