"""Signals sent by the job layer. Receivers get ids and reason codes, never field values."""

from django.dispatch import Signal

# Sent after a job is escalated (a stop condition). Arguments: job (the Job row), reason.
job_escalated = Signal()

# Sent after any job reaches a terminal outcome. Arguments: job, status, reason.
job_finished = Signal()

# Hook points of the worker (tracing, and crash tests that stop a worker at an exact phase).
# Sent in the worker process, outside any transaction; receivers must not write to the job.
# Sent right after the worker took the lease. Arguments: job.
job_claimed = Signal()
# Sent after the check let the job through, right before the handler runs. Arguments: job.
job_checked = Signal()
