"""Count every SQL statement a process sends through Django, per statement shape.

``install()`` wraps ``CursorWrapper.execute``/``executemany`` (every query Django runs, with or
without DEBUG), ``BaseDatabaseWrapper.commit`` (atomic blocks committed) and ``connect`` (new
connections), and counts the writes run outside any atomic block (each one a transaction, a
durable commit, of its own).
The cost is one dict increment per statement. Statements are keyed by their SQL text with the
placeholders still in (``%s``), so the key is the statement's shape, not its values.

In the cluster (``BENCH_SQL_DIR`` set, see benchapp.apps) each process, workers forked from the
sentinel included, writes its cumulative counts to ``<dir>/<pid>.json`` every 0.1 s and when it
exits; bench/run.py diffs the files between the start and the end of the clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

FLUSH_SECONDS = 0.1
CACHE_SIZE = 256

_PLACEHOLDERS = re.compile(r"%s(?:\s*,\s*%s)+")
_SPACES = re.compile(r"\s+")
_SAVEPOINT_ID = re.compile(r'"s\d+_x\d+"')
# Transaction control, reported apart from the data statements.
TX_CONTROL = ("BEGIN", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK", "COMMIT")


class _State:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.statements: Counter[str] = Counter()
        self.commits = 0
        self.connects = 0
        self.autocommit_writes = 0
        self.role = ""
        self.dirty = False
        self.directory: Path | None = None
        self.thread: threading.Thread | None = None
        self.keys: dict[str, str] = {}


_state = _State()
_installed = False


def normalise(sql: str) -> str:
    """The statement's shape: runs of placeholders collapsed, whitespace squeezed, capped."""
    key = _state.keys.get(sql)
    if key is None:
        key = _PLACEHOLDERS.sub("%s,…", _SAVEPOINT_ID.sub('"sN"', sql))
        key = _SPACES.sub(" ", key).strip()[:400]
        # A small, bounded cache (savepoint names are unique: never cached), so the counters
        # themselves cannot make a worker's memory grow over a soak.
        if len(_state.keys) >= CACHE_SIZE:
            _state.keys.clear()
        if not key.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK")):
            _state.keys[sql] = key
    return key


def is_tx_control(key: str) -> bool:
    return key.upper().startswith(TX_CONTROL)


def _here() -> _State:
    """This process's state: a forked child starts from zero with a flusher of its own."""
    state = _state
    pid = os.getpid()
    if state.pid != pid:
        state.pid = pid
        state.statements = Counter()
        state.commits = state.connects = state.autocommit_writes = 0
        state.role = ""
        state.thread = None
        if state.directory is not None:
            _start_flusher(state)
    return state


_WRITES = ("INSERT", "UPDATE", "DELETE")
# A statement with common table expressions writes when its main statement does (``WITH g AS
# (SELECT ... FOR UPDATE) INSERT ...``) or one of them does (``WITH x AS (UPDATE ...) SELECT``);
# a row lock (``FOR [NO KEY] UPDATE``) is no write.
_CTE_WRITE = re.compile(
    r"\)\s*(?:INSERT|UPDATE|DELETE)\b|\bAS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(\s*"
    r"(?:INSERT|UPDATE|DELETE)\b",
    re.IGNORECASE,
)


def is_write(text: str) -> bool:
    head = text.lstrip()[:6].upper()
    if head in _WRITES:
        return True
    return head[:4] == "WITH" and _CTE_WRITE.search(text) is not None


def _count(sql: Any, db: Any) -> None:
    state = _here()
    text = str(sql)
    state.statements[normalise(text)] += 1
    if not getattr(db, "in_atomic_block", True) and is_write(text):
        # A write outside any atomic block is a transaction (and a durable commit) of its own.
        state.autocommit_writes += 1
    state.dirty = True


def install(directory: str | None = None) -> None:
    """Patch Django's cursor and connection wrappers (idempotent)."""
    global _installed
    if directory:
        _state.directory = Path(directory)
        _state.directory.mkdir(parents=True, exist_ok=True)
    if _installed:
        return
    _installed = True
    from django.db.backends import utils
    from django.db.backends.base.base import BaseDatabaseWrapper

    execute = utils.CursorWrapper.execute
    executemany = utils.CursorWrapper.executemany
    commit = BaseDatabaseWrapper.commit
    connect = BaseDatabaseWrapper.connect

    def counted_execute(self: Any, sql: Any, params: Any = None) -> Any:
        _count(sql, self.db)
        return execute(self, sql, params)

    def counted_executemany(self: Any, sql: Any, param_list: Any) -> Any:
        _count(sql, self.db)
        return executemany(self, sql, param_list)

    def counted_commit(self: Any) -> Any:
        state = _here()
        state.commits += 1
        state.dirty = True
        return commit(self)

    def counted_connect(self: Any) -> Any:
        state = _here()
        state.connects += 1
        state.dirty = True
        return connect(self)

    utils.CursorWrapper.execute = counted_execute  # type: ignore[method-assign]
    utils.CursorWrapper.executemany = counted_executemany  # type: ignore[method-assign]
    BaseDatabaseWrapper.commit = counted_commit  # type: ignore[method-assign]
    BaseDatabaseWrapper.connect = counted_connect  # type: ignore[method-assign]
    if _state.directory is not None:
        _start_flusher(_state)


def set_role(role: str) -> None:
    state = _here()
    if state.role != role:
        state.role = role
        state.dirty = True
        flush()


def connect_role_signals() -> None:
    """Name the cluster's processes: django-q2 signals a worker's start and the monitor's saves."""
    from django_q.signals import post_execute, post_spawn

    def spawned(sender: Any, proc_name: str = "", **kwargs: Any) -> None:
        set_role("worker")

    def saved(sender: Any, task: Any = None, **kwargs: Any) -> None:
        if _state.role != "monitor":
            set_role("monitor")

    post_spawn.connect(spawned, weak=False, dispatch_uid="bench.role.worker")
    post_execute.connect(saved, weak=False, dispatch_uid="bench.role.monitor")


def snapshot() -> dict[str, Any]:
    """This process's cumulative counts."""
    state = _here()
    return {
        "pid": state.pid,
        "role": state.role,
        "statements": dict(state.statements),
        "commits": state.commits,
        "connects": state.connects,
        "autocommit_writes": state.autocommit_writes,
    }


def flush() -> None:
    state = _state
    if state.directory is None or state.pid != os.getpid():
        return
    state.dirty = False
    data = snapshot()
    target = state.directory / f"{state.pid}.json"
    tmp = target.with_suffix(".tmp")
    with contextlib.suppress(OSError, RuntimeError):
        tmp.write_text(json.dumps(data))
        os.replace(tmp, target)


def _flusher() -> None:
    while True:
        time.sleep(FLUSH_SECONDS)
        if _state.dirty:
            flush()


def _start_flusher(state: _State) -> None:
    import multiprocessing.util

    state.thread = threading.Thread(target=_flusher, name="bench-sqlcount", daemon=True)
    state.thread.start()
    # A worker recycled by django-q2 returns from its target: multiprocessing runs this then.
    multiprocessing.util.Finalize(None, flush, exitpriority=100)


def read_dir(directory: str | Path) -> dict[int, dict[str, Any]]:
    """Every process's last flushed counts, by pid."""
    found: dict[int, dict[str, Any]] = {}
    for path in Path(directory).glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            found[int(data["pid"])] = data
    return found


def diff(
    before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]]
) -> dict[int, dict[str, Any]]:
    """Per-process counts accumulated between two read_dir() results."""
    out: dict[int, dict[str, Any]] = {}
    for pid, now in after.items():
        then = before.get(pid, {})
        statements = Counter(now["statements"])
        statements.subtract(then.get("statements", {}))
        out[pid] = {
            "role": now.get("role", ""),
            "statements": {k: v for k, v in statements.items() if v},
            "commits": now["commits"] - then.get("commits", 0),
            "connects": now["connects"] - then.get("connects", 0),
            "autocommit_writes": now.get("autocommit_writes", 0) - then.get("autocommit_writes", 0),
        }
    return out
