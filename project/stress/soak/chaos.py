"""The faults: SIGKILLs of workers holding claims, Redis restarts, PostgreSQL restarts.

Each fault is planned at a random point of the feed (a fraction of the jobs enqueued) and
carried out when the feeder gets there (:meth:`Chaos.tick`, between its bursts), so that faults
land while there is work in flight, whatever the run's speed.

A kill picks its victim from the ledger: the worker (``owner`` is ``host:pid``) of a running
claim, aiming in turn at

- ``external``: a claim in the middle of an external call (``sending_at`` set, ``sent_at`` not);
- ``followers``: a claim with 5 or more lane followers reserved (large claims);
- ``claim``: any running claim.

It polls for such a claim for a moment, then falls back to any running claim. The victim is
stopped (SIGSTOP) first and killed only if its claim still runs, never while it waits for a
task (see :meth:`Chaos._kill_holding`). Only a process of the soak's own cluster (its process
group) is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db.models import Count
from django.utils import timezone

from tombstones.models import Job

from ..cluster import Cluster
from . import journal
from .outages import retrying
from .servers import PrivatePostgres, PrivateRedis

AIMS = ("external", "followers", "claim")
AIM_SECONDS = 2.0  # how long a kill looks for its kind of claim before it takes any
FALLBACK_SECONDS = 5.0  # then how long it looks for any running claim
POLL = 0.005
# A claim counts as large from this many reserved followers on.
LARGE = 5
# Faults are planned between these fractions of the feed: work is in flight on both sides.
WINDOW = (0.03, 0.95)


@dataclass
class Kill:
    aim: str  # what was looked for
    found: str  # what the victim held: external, followers, claim
    pid: int
    at: int  # microseconds since the epoch
    running: int  # jobs the claim ran (heads)
    followers: int  # lane followers it had reserved
    sending: list[int]  # external calls it was making
    held_after: int  # jobs its claim still held right after the kill (0: it had just ended)


@dataclass
class Restart:
    server: str
    at: int
    seconds: float


@dataclass
class ChaosLog:
    kills: list[Kill] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    missed_kills: int = 0  # no running claim found in time

    def as_dict(self) -> dict[str, Any]:
        return {
            "kills": [asdict(k) for k in self.kills],
            "restarts": [asdict(r) for r in self.restarts],
            "missed_kills": self.missed_kills,
        }


@dataclass(order=True)
class Fault:
    at: float  # fraction of the feed
    kind: str  # kill, redis, postgres
    aim: str = "claim"


def plan(kills: int, redis: int, postgres: int, rng: random.Random) -> list[Fault]:
    """Random points for each fault; restarts spread over the window, one per equal slice."""
    low, high = WINDOW
    faults = [Fault(rng.uniform(low, high), "kill", AIMS[i % len(AIMS)]) for i in range(kills)]
    for kind, count in (("redis", redis), ("postgres", postgres)):
        width = (high - low) / max(count, 1)
        faults += [Fault(low + width * (i + rng.uniform(0.2, 0.8)), kind) for i in range(count)]
    return sorted(faults)


class Chaos:
    def __init__(
        self,
        faults: list[Fault],
        cluster: Cluster,
        postgres: PrivatePostgres,
        redis: PrivateRedis,
    ) -> None:
        self.faults = list(faults)
        self.cluster = cluster
        self.postgres = postgres
        self.redis = redis
        self.log = ChaosLog()
        self.killed: set[int] = set()
        self.claims_since: datetime | None = None

    def tick(self, progress: float) -> None:
        while self.faults and self.faults[0].at <= progress:
            self.apply(self.faults.pop(0))

    def finish(self) -> None:
        """Whatever the feed did not reach (it ended early): now, before the drain."""
        self.tick(1.0)

    def apply(self, fault: Fault) -> None:
        if fault.kind == "kill":
            self.kill(fault.aim)
        elif fault.kind == "redis":
            at = journal.now()
            self.log.restarts.append(Restart("redis", at, round(self.redis.restart(), 2)))
        else:
            at = journal.now()
            self.log.restarts.append(Restart("postgres", at, round(self.postgres.restart(), 2)))
            # A claim the restart cut may be left running by a worker that went on (its give-back
            # failed; the lease will lapse): only claims made after it are surely in progress.
            self.claims_since = timezone.now()

    # --- kills --------------------------------------------------------------------------------

    def kill(self, aim: str) -> None:
        """SIGKILL a worker while it holds a running claim (``aim``: which kind, see above)."""
        began = time.monotonic()
        while time.monotonic() - began < AIM_SECONDS + FALLBACK_SECONDS:
            looking = aim if time.monotonic() - began < AIM_SECONDS else "claim"
            victims = retrying(lambda looking=looking: _victims(looking, self.claims_since))
            for token, owner in victims:
                pid = _pid(owner)
                # A worker killed a moment ago still owns its claim's rows until the take-back.
                if (
                    pid is not None
                    and pid not in self.killed
                    and self._ours(pid)
                    and self._kill_holding(pid, token, aim, looking)
                ):
                    return
            time.sleep(POLL)
        self.log.missed_kills += 1

    def _kill_holding(self, pid: int, token: str, aim: str, found: str) -> bool:
        """Stop the worker, make sure its claim still runs, then kill it (else let it go on).

        Never kill an idle worker: django-q2's workers wait for their next task inside the task
        queue's lock, reading its pipe, and a worker killed there takes the lock with it: no
        worker of the cluster gets a task again (it hangs, whatever the engine does). So not a
        worker reading a pipe, and not one whose claim's jobs stopped running meanwhile.
        """
        if _waits_for_a_task(pid):
            return False
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        held = retrying(lambda: _held(token))
        if not held[0]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            return False
        os.kill(pid, signal.SIGKILL)
        at = journal.now()
        self.killed.add(pid)
        after = retrying(lambda: sum(_held(token)[:2]))
        self.log.kills.append(Kill(aim, found, pid, at, held[0], held[1], held[2], after))
        return True

    def _ours(self, pid: int) -> bool:
        """A worker of the soak's own cluster: in its process group, not its main process."""
        proc = self.cluster.process
        if proc is None or pid == proc.pid:
            return False
        try:
            return os.getpgid(pid) == proc.pid
        except ProcessLookupError:
            return False


def _waits_for_a_task(pid: int) -> bool:
    """The worker's main thread is blocked reading a pipe: django-q2's task queue (Linux)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text().strip() == "anon_pipe_read"
    except OSError:
        return False


def _pid(owner: str) -> int | None:
    _, _, pid = owner.rpartition(":")
    return int(pid) if pid.isdigit() else None


def _victims(aim: str, since: datetime | None) -> list[tuple[str, str]]:
    """(claim token, owner) of running claims of the kind asked for, made ``since``, in random
    order."""
    running = Job.objects.filter(status=Job.Status.RUNNING)
    if since is not None:
        running = running.filter(started_at__gte=since)
    if aim == "external":
        running = running.filter(external=True, sending_at__isnull=False, sent_at__isnull=True)
    elif aim == "followers":
        large = (
            Job.objects.filter(status=Job.Status.QUEUED)
            .exclude(claim_token="")
            .values("claim_token")
            .annotate(n=Count("id"))
            .filter(n__gte=LARGE)
            .order_by("-n")
            .values_list("claim_token", flat=True)[:3]
        )
        running = running.filter(claim_token__in=list(large))
    return list(running.values_list("claim_token", "owner").order_by("?")[:10])


def _held(token: str) -> tuple[int, int, list[int]]:
    """(running heads, reserved followers, external calls in flight) of a claim."""
    rows = Job.objects.filter(claim_token=token, status__in=[Job.Status.RUNNING, Job.Status.QUEUED])
    running = followers = 0
    sending: list[int] = []
    for pk, status, external, sending_at, sent_at in rows.values_list(
        "pk", "status", "external", "sending_at", "sent_at"
    ):
        if status == Job.Status.RUNNING:
            running += 1
            if external and sending_at is not None and sent_at is None:
                sending.append(pk)
        else:
            followers += 1
    return running, followers, sending
