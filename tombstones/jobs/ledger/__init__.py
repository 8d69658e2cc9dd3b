"""The ledger: every statement that writes the job table, by role (claims, outcomes, take-back,
external calls, enqueue's insert, params). A face: callers write ``ledger.claim(...)``.
"""

from . import coalesce, rollup
from .claims import Claim, claim, give_back, holds_any, renew, worker_id
from .insert import insert_job, insert_jobs
from .outcomes import (
    Found,
    Outcome,
    event_row,
    record_ref,
    release,
    transition,
    write_outcomes,
)
from .params import erase_params
from .rescue import take_back_lapsed
from .sending import clear_sending, mark_sending, mark_sent

__all__ = [
    "Claim",
    "Found",
    "Outcome",
    "claim",
    "clear_sending",
    "coalesce",
    "erase_params",
    "event_row",
    "give_back",
    "holds_any",
    "insert_job",
    "insert_jobs",
    "mark_sending",
    "mark_sent",
    "record_ref",
    "release",
    "renew",
    "rollup",
    "take_back_lapsed",
    "transition",
    "worker_id",
    "write_outcomes",
]
