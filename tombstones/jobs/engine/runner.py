"""The one road every job takes: claim due lane heads, act on them, record their outcomes.

A wake-up runs :func:`pump`: it claims up to ``TOMBSTONES_BATCH_SIZE`` due lane heads at a time
(:func:`ledger.claim`), runs them (:func:`run_claim`: internal jobs in groups of one transaction
each, external jobs one by one), and claims again until nothing is due. A claim's leases are
kept alive for as long as the worker holds it (:mod:`tombstones.keeper`). Nothing else runs a
job: a batch of one is the same road with n = 1.

How much one worker takes: all it sees (up to the batch size, and its lanes' next jobs) while its
handlers are quick (its last claim's jobs took under ``QUICK_JOB_SECONDS`` each: one worker
running them back to back in one transaction beats several splitting them); otherwise, and at
first, its share of the due heads (1/workers), and a helper message wakes another worker for the
rest. A claim still running after
``phases.GROUP_SECONDS`` gives the jobs it has not started back to the queue for the others, and
while one handler runs long the lease keeper gives them back at once (:mod:`tombstones.keeper`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from django.db import DatabaseError, router

from ...conf import tombstone_settings
from ...signals import job_claimed, send_hook
from .. import ledger, wakeups
from ..ledger import Claim, Outcome
from ..models import Job
from . import alarms, phases
from .keeper import keeper

logger = logging.getLogger("tombstones")

QUICK_JOB_SECONDS = 0.03

# Whether this process's last claim ran quickly (keyed by pid: workers are forked). Only the
# size of the next claim depends on it, never the road its jobs take.
_quick: dict[int, bool] = {}


def cluster_workers() -> int:
    """Worker processes of the django-q2 cluster this runs in (a claim takes its share)."""
    from django_q.conf import Conf

    return max(1, int(Conf.WORKERS or 1))


def task_seconds() -> float | None:
    """How long this wake-up may run: half of django-q2's task timeout, if it has one.

    django-q2 kills a task that outlives its timeout, and the job then running would be charged
    with the crash; a wake-up stops starting jobs at half of it and hands the rest to another
    message. So a handler must finish within half of the timeout.
    """
    from django_q.conf import Conf

    timeout = tombstone_settings.Q_OPTIONS.get("timeout", Conf.TIMEOUT)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        return None
    return float(timeout) / 2


def pump(using: str | None = None, *, seconds: float | None = None) -> list[Outcome]:
    """Run due lane heads until none is left, or the wake budget (jobs, ``seconds``) is spent."""
    db = using or router.db_for_write(Job)
    size, budget = tombstone_settings.BATCH_SIZE, tombstone_settings.WAKE_BUDGET
    deadline = time.monotonic() + seconds if seconds is not None else None
    outcomes: list[Outcome] = []
    wakeups.helper_arrived()
    quick = _quick.get(os.getpid())  # how this process's last claim ran
    opened = False
    while len(outcomes) < budget and (deadline is None or time.monotonic() < deadline):
        workers = cluster_workers()
        claim = ledger.claim(
            min(size, budget - len(outcomes)), workers=workers, whole=bool(quick), using=db
        )
        if claim is None:
            if not opened and wakeups.open_gate():
                # Nothing due: open the gate, then look once more, so that a job whose enqueue
                # found the gate armed (it committed before this open) is seen.
                opened = True
                continue
            alarms.arm_next(db)
            return outcomes
        opened = False
        # A full batch: more may be due, for the other workers (one helper message at a time;
        # none when this worker is the only one).
        if claim.left and workers > 1:
            wakeups.call_helper()
        ran, quick = run_claim(claim, workers=workers, deadline=deadline)
        _quick[os.getpid()] = quick
        outcomes += ran
    # Budget or time spent, perhaps with work left: hand it to another message rather than hog
    # this worker (a message that finds nothing opens the gate).
    wakeups.hand_off()
    return outcomes


def run_claim(
    claim: Claim, *, workers: int = 1, deadline: float | None = None
) -> tuple[list[Outcome], bool]:
    """Run a claim's jobs; returns their recorded outcomes and whether they ran quickly.

    Any exception outside the handlers' own (which become outcomes) gives the claim's unfinished
    jobs back: the job whose check or handler was running keeps its attempt (it may have killed
    the worker), the others get theirs back. A BaseException (SystemExit, KeyboardInterrupt,
    django-q2's timeout) is re-raised after that; any other is logged and the pump goes on.
    """
    attempts = [phases.Attempt(claim, job) for job in claim.jobs]
    started = time.monotonic()
    with keeper().hold(claim):
        try:
            for attempt in attempts:
                send_hook(job_claimed, attempt.job)
            queue = sorted(attempts, key=lambda a: a.job.external)  # internal ones first
            while queue:
                if queue[0].job.external:
                    phases.act_external(queue[0])
                    rest = queue[1:]
                else:
                    group = [a for a in queue if not a.job.external]
                    rest = phases.act_group(group) + [a for a in queue if a.job.external]
                # Lane followers run in their head's group or not at all: what is left of them
                # goes back, uncharged, to be claimed as the heads they now are.
                followers = [a for a in rest if a.follower]
                if followers:
                    ledger.release(claim, [a.job for a in followers])
                    for attempt in followers:
                        attempt.lost = True
                    rest = [a for a in rest if not a.follower]
                now = time.monotonic()
                slow = workers > 1 and now - started > phases.GROUP_SECONDS
                if rest and (slow or (deadline is not None and now > deadline)):
                    # Slow handlers, or this wake-up's time is up: the jobs not started go back
                    # to the queue, for another worker or another message.
                    ledger.release(claim, [a.job for a in rest])
                    for attempt in rest:
                        attempt.lost = True
                    wakeups.call_helper()
                    rest = []
                queue = rest
        except BaseException as exc:
            _give_back(claim, attempts, exc)
            if not isinstance(exc, Exception):
                raise
        if claim.expired:
            _give_back_expired(claim, attempts)
    done = [a.outcome for a in attempts if a.outcome is not None and not a.lost]
    quick = time.monotonic() - started < QUICK_JOB_SECONDS * max(len(done), 1)
    return done, quick


def _give_back(claim: Claim, attempts: list[phases.Attempt], exc: BaseException) -> None:
    unfinished = [a for a in attempts if not a.done]
    busy = [a for a in unfinished if a.busy]
    culprit = busy[0].job if len(busy) == 1 else None
    error = f"{type(exc).__module__}.{type(exc).__qualname__}"
    logger.error(
        "worker interrupted by %s with %s job(s) in hand; they are given back",
        error,
        len(unfinished),
        extra={
            "tombstones": {
                "error_class": error,
                "job_ids": [a.job.pk for a in unfinished],
                "culprit": culprit.pk if culprit else None,
            }
        },
    )
    if not unfinished:
        return
    try:
        ledger.release(
            claim,
            [a.job for a in unfinished],
            culprit=culprit,
            suspects=culprit is None,
            error_class=error,
        )
    except (DatabaseError, LookupError):
        # Left running: their leases run out and the next tick takes them back.
        logger.warning("could not give back %s job(s); their leases will lapse", len(unfinished))
        return
    for attempt in unfinished:
        attempt.lost = True
    wakeups.hand_off()
    alarms.arm_next(claim.using)  # the culprit's retry


def _give_back_expired(claim: Claim, attempts: list[phases.Attempt]) -> None:
    """This worker stalled past its lease (renewals failed or came late): the jobs whose turn
    it refused go back, if they are still its own (another worker may have taken them back)."""
    refused = [a.job for a in attempts if a.outcome is None and a.job.pk not in claim.started]
    logger.warning(
        "claim past its lease: %s job(s) not started are given back",
        len(refused),
        extra={"tombstones": {"job_ids": [job.pk for job in refused]}},
    )
    try:
        ledger.release(claim, refused)
    except DatabaseError:
        logger.warning("could not give back %s job(s); their leases will lapse", len(refused))


def result(job_id: Any, outcomes: list[Outcome]) -> dict[str, Any]:
    """What the django-q2 task returns (and may store): ids, statuses and reasons only."""
    return {"job": job_id, "carried": [o.as_list() for o in outcomes]}
