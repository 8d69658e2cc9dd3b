"""The app's signals. Receivers get ids and reason codes, never field values.

The records layer sends ``record_tombstoned`` and ``records_purged`` (it imports nothing of the
job layer; the job layer listens); the job layer sends the ``job_*`` signals.
"""

from django.dispatch import Signal

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

# Hook points of the worker (tracing, and crash tests that stop a worker at an exact phase).
# Sent in the worker process, outside any transaction; receivers must not write to the job.
# Sent right after the worker took the lease. Arguments: job.
job_claimed = Signal()
# Sent after the check let the job through, right before the handler runs. Arguments: job.
job_checked = Signal()
