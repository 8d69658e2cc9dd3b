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

# Sent by the records layer inside the transaction that made tombstones, after the UPDATE.
# sender: the model class. Arguments: pks (list of the records just tombstoned), using (alias).
# A receiver's writes commit or roll back with the deletion.
record_tombstoned = Signal()

# Sent inside the purge's transaction, after the tombstones were hard-deleted.
# sender: the model class. Arguments: pks (list), using (alias).
records_purged = Signal()

# Sent after a job is escalated (a stop condition). Arguments: job (the Job row), reason.
job_escalated = Signal()

# Sent after any job reaches a terminal outcome. Arguments: job, status, reason.
job_finished = Signal()

# Hook points of the worker (tracing, and crash tests that stop a worker at an exact phase),
# sent in the worker process through send_hook(): a receiver that raises an Exception is logged
# and ignored, never a failure of the engine. Receivers must not write to the job.
# Sent right after the worker took the lease, outside any transaction. Arguments: job.
job_claimed = Signal()
# Sent after the check let the job through, right before the handler runs: for an internal job
# inside the job's savepoint of the act transaction. Arguments: job.
job_checked = Signal()


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
