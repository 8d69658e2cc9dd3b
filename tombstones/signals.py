"""The app's signals. Receivers get ids and reason codes, never field values.

The records layer sends ``record_tombstoned`` and ``records_purged`` (it imports nothing of the
job layer; the job layer listens); the job layer sends the ``job_*`` signals.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from .logfields import job_fields

logger = logging.getLogger("tombstones")

record_tombstoned = Signal()
"""Records just became tombstones. Sent by the records layer inside the deleting transaction,
after the UPDATE: a receiver's writes commit or roll back with the deletion. ``sender``: the
model class; ``pks``: the records tombstoned; ``using``: the database alias."""

records_purged = Signal()
"""Tombstones were hard-deleted. Sent inside the purge's transaction, after the DELETE.
``sender``: the model class; ``pks``; ``using``."""

job_escalated = Signal()
"""A job was escalated: a stop condition an operator must act on. ``job`` (the Job row),
``reason``."""

job_finished = Signal()
"""A job reached a terminal outcome. ``job``, ``status``, ``reason``."""

# Hook points of the worker (tracing, and crash tests that stop a worker at an exact phase),
# sent in the worker process through send_hook(): a receiver that raises an Exception is logged
# and ignored, never a failure of the engine. Receivers must not write to the job.
job_claimed = Signal()
"""The worker just took the job's lease; sent outside any transaction. ``job``. For tracing: a
receiver that raises is logged and ignored."""

job_checked = Signal()
"""The check let the job through and its handler runs next; for an internal job sent inside the
job's savepoint of the act transaction. ``job``. For tracing: a receiver must not write to the
job."""


def send_hook(signal: Signal, job: Any) -> None:
    """Send a worker hook; a receiver that raises an Exception is logged (its class, never its
    message) and the engine goes on. (Not ``send_robust()``: Django logs the message.)"""
    try:
        # The sender is the job's class (Job): this module sits below the jobs and names none.
        signal.send(sender=type(job), job=job)
    except Exception as exc:  # noqa: BLE001 - a tracing hook must not stop or spin the worker
        logger.error(
            "a receiver of a tombstones hook signal raised %s; ignored (job %s)",
            type(exc).__name__,
            job.pk,
            extra=job_fields(job, error_class=type(exc).__name__),
        )
