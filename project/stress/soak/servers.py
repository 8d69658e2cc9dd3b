"""The soak's own PostgreSQL and Redis: started in a scratch directory on ports of their own,
restarted on purpose, removed at the end. Never the shared servers.

initdb refuses to run as root: as root, every PostgreSQL binary runs as the ``postgres`` OS user
(``runuser``), in a directory that user owns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

PG_ROOT = Path("/usr/lib/postgresql")


class ServerError(RuntimeError):
    """A private server did not start, stop or answer."""


def pg_binaries() -> Path | None:
    """The newest installed PostgreSQL server's bin directory, or None."""
    found = sorted(PG_ROOT.glob("*/bin/pg_ctl"), key=lambda p: _major(p.parent.parent.name))
    return found[-1].parent if found else None


def _major(name: str) -> int:
    return int(name) if name.isdigit() else 0


def missing_binaries() -> str | None:
    """Why the soak cannot start its servers here, or None."""
    if pg_binaries() is None:
        return f"no PostgreSQL server binaries under {PG_ROOT}/*/bin"
    if shutil.which("redis-server") is None:
        return "no redis-server on PATH"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser (initdb refuses root)"
    return None


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int) -> int:
    """``preferred`` if nothing listens there, else one the kernel hands out."""
    if preferred and port_free(preferred):
        return preferred
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """initdb + pg_ctl in ``directory``/pg on ``port``; the database ``soak``."""

    def __init__(self, directory: Path, port: int) -> None:
        binaries = pg_binaries()
        if binaries is None:
            raise ServerError(f"no PostgreSQL server binaries under {PG_ROOT}")
        self.bin = binaries
        self.port = port
        self.home = directory / "pg"
        self.data = self.home / "data"
        self.log = self.home / "server.log"
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/soak"

    def _run(self, *args: str, timeout: float = 120) -> None:
        # The server inherits pg_ctl's output: a file, never a pipe this process would wait on.
        with open(self.home / "pg_ctl.log", "ab") as out:
            done = subprocess.run(
                [*self.as_postgres, *args], stdout=out, stderr=subprocess.STDOUT, timeout=timeout
            )
        if done.returncode:
            raise ServerError(f"{Path(args[0]).name} {args[1:]} failed: {self.tail()}")

    def tail(self, lines: int = 20) -> str:
        texts = []
        for path in (self.home / "pg_ctl.log", self.log):
            with contextlib.suppress(OSError):
                texts.append("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(texts)

    def _options(self) -> str:
        return f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.home} -c max_connections=200"

    def init(self) -> PrivatePostgres:
        self.home.mkdir(parents=True)
        if self.as_postgres:
            shutil.chown(self.home, "postgres")
            # mkdtemp makes the scratch directory 0700: the postgres user must pass through it.
            self.home.parent.chmod(0o755)
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        self.start()
        self._run(
            str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
            "soak",
        )  # fmt: skip
        return self

    def start(self) -> None:
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", self._options(),
            "-l", str(self.log), "-w", "start",
        )  # fmt: skip

    def restart(self) -> float:
        """``pg_ctl restart -m fast``: every connection is cut. Returns the seconds it took."""
        began = time.monotonic()
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", self._options(), "-m", "fast",
            "-w", "restart",
        )  # fmt: skip
        return time.monotonic() - began

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")


class PrivateRedis:
    """A redis-server on ``port`` without persistence: a restart loses every message."""

    def __init__(self, directory: Path, port: int) -> None:
        self.port = port
        self.home = directory / "redis"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> PrivateRedis:
        self.home.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = open(self.home / "server.log", "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.home)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for the soak reaches it through stop() only
        )  # fmt: skip
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(f"redis-server exited with {self.process.returncode}")
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    client.close()
                    return
            time.sleep(0.05)
        raise ServerError(f"redis-server not ready after {timeout}s")

    def _terminate(self) -> None:
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.process = None

    def restart(self) -> float:
        """Stop the server (its messages are lost) and start it again; the seconds it took."""
        began = time.monotonic()
        self._terminate()
        self.start()
        return time.monotonic() - began

    def stop(self) -> None:
        self._terminate()
        if self._log is not None:
            self._log.close()
            self._log = None
