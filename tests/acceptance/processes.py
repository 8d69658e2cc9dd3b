"""Processes by parent and by session, read from /proc (Linux): who is left after a stop."""

from __future__ import annotations

import os
from pathlib import Path


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, session id) of a process; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0], int(fields[1]), int(fields[3])


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def children(parent: int) -> list[int]:
    return [pid for pid in pids() if (st := stat(pid)) is not None and st[1] == parent]


def session(sid: int) -> list[int]:
    """Live processes of a session. Zombies run nothing, and PID 1 may not reap them here."""
    return [
        pid for pid in pids() if (st := stat(pid)) is not None and st[2] == sid and st[0] != "Z"
    ]
