"""The one road every job takes: claim due lane heads, act on them, record their outcomes.

Each worker process has one :class:`WorkerProcess` (made once per forked worker): its lease
keeper, its alarms, its pace (whether its last claim ran quickly) and its handlers' times. A
wake-up runs its :meth:`~WorkerProcess.pump`: it claims up to ``TOMBSTONES_BATCH_SIZE`` due lane
heads at a time (:func:`ledger.claim`), runs them (:meth:`~WorkerProcess.run_claim`: internal
jobs in groups of one transaction each, :mod:`.group`; external jobs one by one,
:mod:`.external`), and claims again until nothing is due. A claim's leases are kept alive for as
long as the worker holds it (:mod:`.keeper`). Nothing else runs a job: a batch of one is the same
road with n = 1.

How much one worker takes: all it sees (up to the batch size, and its lanes' next jobs) while its
handlers are quick (its last claim's jobs took under ``QUICK_JOB_SECONDS`` each: one worker
running them back to back in one transaction beats several splitting them); otherwise, and at
first, its share of the due heads (1/workers), and a helper message wakes another worker for the
rest. A claim still running after ``group.GROUP_SECONDS`` gives the jobs it has not started back
to the queue for the others, and while one handler runs long the lease keeper gives them back at
once (:mod:`.keeper`).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, router

from ...conf import tombstone_settings
from ...logfields import jobs_fields
from ...signals import job_claimed, send_hook
from .. import beats, ledger, queues, wakeups
from ..cluster import cluster_workers, in_cluster_worker
from ..ledger import Claim, Outcome
from ..models import Job
from . import group
from .alarms import Alarms
from .attempt import Attempt, Step, error_class, give_back
from .external import act_external
from .group import HandlerTimes, act_group
from .keeper import LeaseKeeper

logger = logging.getLogger("tombstones")

QUICK_JOB_SECONDS = 0.03


class WorkerProcess:
    """The engine's state in one worker process, and the pump that runs its jobs.

    Made once per process (:func:`current`): a forked worker gets its own, as it does not
    inherit its parent's threads. What it owns is handed down to what needs it.
    """

    def __init__(self) -> None:
        self.keeper = LeaseKeeper()
        self.alarms = Alarms()
        self.handler_times = HandlerTimes()
        # Whether this process's last claim ran quickly. Only the size of the next claim
        # depends on it, never the road its jobs take.
        self.quick: bool | None = None
        # Its heartbeat thread, in a cluster's worker (started by start()).
        self.heart: beats.Heart | None = None

    def reset_pace(self) -> None:
        """Forget how its claims and handlers ran (tests start from a fresh process's pace)."""
        self.quick = None
        self.handler_times.clear()

    def pump(self, using: str | None = None, *, seconds: float | None = None) -> list[Outcome]:
        """Run due lane heads until none is left, or the wake budget (jobs, ``seconds``) is
        spent."""
        db = using or router.db_for_write(Job)
        size, budget = tombstone_settings.BATCH_SIZE, tombstone_settings.WAKE_BUDGET
        deadline = time.monotonic() + seconds if seconds is not None else None
        outcomes: list[Outcome] = []
        wakeups.helper_arrived()
        opened = False
        while len(outcomes) < budget and (deadline is None or time.monotonic() < deadline):
            workers = cluster_workers()
            claim = ledger.claim(
                min(size, budget - len(outcomes)),
                workers=workers,
                whole=bool(self.quick),
                using=db,
                queues=queues.served(),
            )
            if claim is None:
                if not opened and wakeups.open_gate():
                    # Nothing due: open the gate, then look once more, so that a job whose
                    # enqueue found the gate armed (it committed before this open) is seen.
                    opened = True
                    continue
                self.alarms.arm_next(db)
                return outcomes
            opened = False
            # A full batch: more may be due, for the other workers (one helper message at a
            # time; none when this worker is the only one).
            if claim.unclaimed and workers > 1:
                wakeups.call_helper()
            ran, self.quick = self.run_claim(claim, workers=workers, deadline=deadline)
            outcomes += ran
        # Budget or time spent, perhaps with work left: hand it to another message rather than
        # hog this worker (a message that finds nothing opens the gate).
        wakeups.hand_off()
        return outcomes

    def run_claim(
        self, claim: Claim, *, workers: int = 1, deadline: float | None = None
    ) -> tuple[list[Outcome], bool]:
        """Run a claim's jobs; returns their recorded outcomes and whether they ran quickly.

        Any exception outside the handlers' own (which become outcomes) gives the claim's
        unfinished jobs back: the job whose check or handler was running keeps its attempt (it
        may have killed the worker), the others get theirs back. A BaseException (SystemExit,
        KeyboardInterrupt, django-q2's timeout) is re-raised after that; any other is logged
        and the pump goes on.
        """
        attempts = [Attempt(claim, job) for job in claim.jobs]
        started = time.monotonic()
        with self.keeper.keeping(claim):
            try:
                for attempt in attempts:
                    send_hook(job_claimed, attempt.job)
                self._run_queue(claim, attempts, workers, started, deadline)
            except BaseException as exc:
                _interrupted(claim, attempts, exc, self.alarms)
                if not isinstance(exc, Exception):
                    raise
            if claim.expired:
                _give_back_expired(claim, attempts)
        done = [a.outcome for a in attempts if a.step == Step.DONE and a.outcome is not None]
        quick = time.monotonic() - started < QUICK_JOB_SECONDS * max(len(done), 1)
        return done, quick

    def _run_queue(
        self,
        claim: Claim,
        attempts: list[Attempt],
        workers: int,
        started: float,
        deadline: float | None,
    ) -> None:
        queue = sorted(attempts, key=lambda a: a.job.external)  # internal ones first
        while queue:
            if queue[0].job.external:
                act_external(queue[0], alarms=self.alarms)
                rest = queue[1:]
            else:
                internal = [a for a in queue if not a.job.external]
                rest = act_group(internal, times=self.handler_times, alarms=self.alarms)
                rest += [a for a in queue if a.job.external]
            # Lane followers run in their head's group or not at all: what is left of them
            # goes back, uncharged, to be claimed as the heads they now are.
            followers = [a for a in rest if a.follower]
            if followers:
                give_back(claim, followers)
                rest = [a for a in rest if not a.follower]
            now = time.monotonic()
            slow = workers > 1 and now - started > group.GROUP_SECONDS
            if rest and (slow or (deadline is not None and now > deadline)):
                # Slow handlers, or this wake-up's time is up: the jobs not started go back
                # to the queue, for another worker or another message.
                give_back(claim, rest)
                wakeups.call_helper()
                rest = []
            queue = rest

    def start(self) -> None:
        """A new cluster worker (perhaps replacing a dead one): it opens the wake-up gate its
        predecessor may have held, and ticks at once."""
        if not in_cluster_worker():
            return
        self.heart = beats.Heart(queues.own_cluster())
        self.heart.start()
        try:
            wakeups.open_gate()
        except Exception as exc:  # noqa: BLE001 - the gate expires by itself
            logger.warning("could not open the wake-up gate at start (%s)", type(exc).__name__)
        self.alarms.add(timedelta(0))


def _interrupted(claim: Claim, attempts: list[Attempt], exc: BaseException, alarms: Alarms) -> None:
    """The claim's run was interrupted: its unfinished jobs go back, the busy one charged."""
    unfinished = [a for a in attempts if not a.done]
    busy = [a for a in unfinished if a.busy]
    culprit = busy[0].job if len(busy) == 1 else None
    error = error_class(exc)
    logger.error(
        "worker interrupted by %s with %s job(s) in hand; they are given back",
        error,
        len(unfinished),
        extra=jobs_fields(
            [a.job.pk for a in unfinished],
            error_class=error,
            culprit=culprit.pk if culprit else None,
        ),
    )
    if not unfinished:
        return
    try:
        give_back(claim, unfinished, culprit=culprit, suspects=culprit is None, error_class=error)
    except (DatabaseError, LookupError):
        # Left running: their leases run out and the next tick takes them back.
        logger.warning(
            "could not give back %s job(s); their leases will lapse",
            len(unfinished),
            extra=jobs_fields([a.job.pk for a in unfinished]),
        )
        return
    wakeups.hand_off()
    alarms.arm_next(claim.using)  # the culprit's retry


def _give_back_expired(claim: Claim, attempts: list[Attempt]) -> None:
    """This worker stalled past its lease (renewals failed or came late): the jobs whose turn
    it refused go back, if they are still its own (another worker may have taken them back)."""
    refused = [a for a in attempts if a.outcome is None and a.job.pk not in claim.started]
    logger.warning(
        "claim past its lease: %s job(s) not started are given back",
        len(refused),
        extra=jobs_fields([a.job.pk for a in refused]),
    )
    try:
        give_back(claim, refused)
    except DatabaseError:
        logger.warning(
            "could not give back %s job(s); their leases will lapse",
            len(refused),
            extra=jobs_fields([a.job.pk for a in refused]),
        )


# The one piece of engine state at module level: this process's WorkerProcess, with the pid it
# was made in (a forked child makes its own).
_current: tuple[int, WorkerProcess] | None = None


def current() -> WorkerProcess:
    """This process's :class:`WorkerProcess`, made at its first use."""
    global _current
    pid = os.getpid()
    if _current is None or _current[0] != pid:
        _current = (pid, WorkerProcess())
    return _current[1]


def pump(using: str | None = None, *, seconds: float | None = None) -> list[Outcome]:
    """This process's :meth:`WorkerProcess.pump` (what a wake-up runs)."""
    return current().pump(using, seconds=seconds)


def run_claim(
    claim: Claim, *, workers: int = 1, deadline: float | None = None
) -> tuple[list[Outcome], bool]:
    """This process's :meth:`WorkerProcess.run_claim`."""
    return current().run_claim(claim, workers=workers, deadline=deadline)


def on_worker_start(sender: Any = None, **kwargs: Any) -> None:
    """django-q2 ``post_spawn`` receiver: :meth:`WorkerProcess.start`."""
    current().start()


def result(job_id: Any, outcomes: list[Outcome]) -> dict[str, Any]:
    """What the django-q2 task returns (and may store): ids, statuses and reasons only."""
    return {"job": job_id, "carried": [o.as_list() for o in outcomes]}
