"""Signals sent by the job layer. Receivers get ids and reason codes, never field values."""

from django.dispatch import Signal

# Sent after a job is escalated (a stop condition). Arguments: job (the Job row), reason.
job_escalated = Signal()

# Sent after any job reaches a terminal outcome. Arguments: job, status, reason.
job_finished = Signal()
