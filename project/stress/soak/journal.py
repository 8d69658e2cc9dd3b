"""Crash-proof logs of what handlers did, one append-only file per process.

A SIGKILL or a rollback erases nothing written here: each line is one ``os.write`` to a file
opened with ``O_APPEND`` (in the kernel once the call returns), not a buffered Python file and
not a database row. The soak reads every file back after the run (:func:`read`).

Lines, tab-separated, times in microseconds since the epoch (this machine's clock, which is
also the private PostgreSQL's):

- ``S job claim attempts rereads t``: a handler started (``claim`` is :func:`claim_key`);
- ``E job claim result t``: that handler returned or raised (``result``);
- ``C key job t``: the fake external system received a call with this idempotency key;
- ``K job claim status attempts t``: a worker took the job in a claim (``running``: as a lane
  head; ``queued``: as a lane follower reserved behind its head), whatever became of it;
- ``Q job t``: the feeder's or the editor's transaction that enqueued the job committed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# The directory of the journal files; unset (outside a soak) nothing is written.
ENV = "SOAK_JOURNAL"

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# One descriptor per process: the workers are forked, so it is keyed by pid.
_files: dict[int, int] = {}


def micros(at: datetime) -> int:
    """A database timestamp as whole microseconds since the epoch (exact, no float)."""
    return (at - EPOCH) // timedelta(microseconds=1)


def now() -> int:
    return time.time_ns() // 1000


def claim_key(owner: str, started_at: datetime | None) -> str:
    """Names one claim: its worker and its time, as the job row keeps them after it ends."""
    return f"{owner}@{micros(started_at)}" if started_at is not None else ""


def _write(*fields: Any) -> None:
    where = os.environ.get(ENV)
    if not where:
        return
    pid = os.getpid()
    fd = _files.get(pid)
    if fd is None:
        path = Path(where) / f"journal-{pid}.log"
        fd = _files[pid] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, ("\t".join(str(f) for f in fields) + "\n").encode())


def started(job: Any) -> None:
    """A handler of ``job`` (the claimed ``Job`` row) starts now."""
    _write("S", job.pk, claim_key(job.owner, job.started_at), job.attempts, job.rereads, now())


def ended(job: Any, result: str) -> None:
    _write("E", job.pk, claim_key(job.owner, job.started_at), result, now())


def called(key: str, job: Any) -> None:
    """The fake external system records a call (before it acts: a kill after this is a call)."""
    _write("C", key, job.pk, now())


def claimed(job: Any) -> None:
    """A worker took ``job`` in a claim (the worker's ``job_claimed`` hook)."""
    _write("K", job.pk, claim_key(job.owner, job.started_at), job.status, job.attempts, now())


def trace_claim(sender: Any, job: Any, **kwargs: Any) -> None:
    """Receiver of the worker's ``job_claimed`` hook (connected by the stress app's ready()):
    every job of every claim, heads and lane followers, so a report shows who held what."""
    claimed(job)


def enqueued(job_id: int) -> None:
    """The transaction that enqueued ``job_id`` committed (a moment before now)."""
    _write("Q", job_id, now())


@dataclass(frozen=True)
class Start:
    job: int
    claim: str
    attempts: int
    rereads: int
    at: int


@dataclass(frozen=True)
class End:
    job: int
    claim: str
    result: str
    at: int


@dataclass(frozen=True)
class Call:
    key: str
    job: int
    at: int


@dataclass(frozen=True)
class Claimed:
    job: int
    claim: str
    status: str  # running: a head; queued: a lane follower
    attempts: int
    at: int


@dataclass(frozen=True)
class Enqueued:
    job: int
    at: int


Entry = Start | End | Call | Claimed | Enqueued


def read(directory: Path) -> Iterator[Entry]:
    """Every complete line of every journal file (a torn last line is skipped)."""
    for path in sorted(directory.glob("journal-*.log")):
        text = path.read_bytes().decode(errors="replace")
        for line in text.split("\n")[:-1]:  # the part after the last newline is incomplete
            fields = line.split("\t")
            if fields[0] == "S" and len(fields) == 6:
                yield Start(
                    int(fields[1]), fields[2], int(fields[3]), int(fields[4]), int(fields[5])
                )
            elif fields[0] == "E" and len(fields) == 5:
                yield End(int(fields[1]), fields[2], fields[3], int(fields[4]))
            elif fields[0] == "C" and len(fields) == 4:
                yield Call(fields[1], int(fields[2]), int(fields[3]))
            elif fields[0] == "K" and len(fields) == 6:
                yield Claimed(int(fields[1]), fields[2], fields[3], int(fields[4]), int(fields[5]))
            elif fields[0] == "Q" and len(fields) == 3:
                yield Enqueued(int(fields[1]), int(fields[2]))
