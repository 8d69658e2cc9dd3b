"""The engine's phases one step at a time, for the race fixture (:mod:`tombstones.testing`):
its "start" is :func:`claim` and :func:`check`, its "write" :func:`act`. The same functions the
pump runs, on this process's :class:`~.runner.WorkerProcess`.
"""

from __future__ import annotations

from .. import ledger
from ..ledger import Outcome
from .attempt import Attempt, record_alone
from .check import check_all
from .external import act_external
from .group import act_group
from .runner import current


def claim(job_id: int, *, using: str | None = None) -> Attempt | None:
    """Take one given job's lease, if it is claimable now."""
    taken = ledger.claim(1, ids=[job_id], using=using)
    if taken is None or not taken.jobs:
        return None
    return Attempt(taken, taken.jobs[0])


def check(attempt: Attempt) -> Outcome | None:
    """The check on its own: a stop is recorded at once."""
    check_all([attempt])
    if attempt.stop is not None:
        return record_alone(attempt, attempt.stop, current().alarms)
    return None


def act(attempt: Attempt) -> Outcome | None:
    """Act and record, as a group of one (or an external call) does."""
    process = current()
    if attempt.job.external:
        return act_external(attempt, alarms=process.alarms)
    act_group([attempt], times=process.handler_times, alarms=process.alarms)
    return attempt.outcome
