"""Everything django-q2 calls by dotted path: ``run`` (a wake-up runs the pump,
:mod:`tombstones.jobs.engine.runner`), ``run_sweep`` and ``run_purge`` (the schedules) and
``mark_q_task``.

These paths are stored in django-q2's queue and schedule rows, so they stay here. Thin on purpose.

django-q2's task table is kept honest: the ledger (``Job``) is the one record of every outcome.
A wake-up that carried only successes is stored as a success; one that carried anything else,
or nothing, is not stored at all, and the library's own log line (with the job's status and
reason) is the record of it. A rejection is then neither a worker error nor a success there.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from .jobs import retention
from .jobs.cluster import task_seconds
from .jobs.engine import runner, sweep
from .jobs.models import Job
from .jobs.wakeups import TASK


def run(job_id: int | None = None) -> dict[str, Any]:
    """Entry point called by django-q2; ``job_id`` only names the job that sent the message."""
    _close_old_connections()
    try:
        return runner.result(job_id, runner.pump(seconds=task_seconds()))
    finally:
        _close_old_connections()


def run_sweep() -> dict[str, Any]:
    """The sweep's schedule entry point (:func:`tombstones.jobs.engine.sweep.run_sweep`)."""
    return sweep.run_sweep()


def run_purge() -> dict[str, Any]:
    """The purge's daily schedule entry point (:func:`tombstones.jobs.retention.run_purge`)."""
    _close_old_connections()
    try:
        return retention.run_purge()
    finally:
        _close_old_connections()


def _close_old_connections() -> None:
    # As Django does around a request; never inside an open transaction (sync mode, tests).
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def carried(result: Any) -> list[tuple[Any, str]]:
    """(job id, status) of every job a wake-up ran, from its stored result."""
    if not isinstance(result, dict):
        return []
    return [(row[0], str(row[1])) for row in result.get("carried", ()) if len(row) >= 2]


def mark_q_task(sender: Any, task: dict[str, Any], **kwargs: Any) -> None:
    """django-q2 ``post_execute_in_worker`` receiver: store only wake-ups that all succeeded."""
    func = task.get("func")
    if func != TASK and func is not run:
        return
    if not task.get("success"):
        return  # a worker error (a timeout, an exception outside the jobs): django-q2's to show
    statuses = carried(task.get("result"))
    if not statuses or any(status != Job.Status.SUCCEEDED for _, status in statuses):
        task["save"] = False
