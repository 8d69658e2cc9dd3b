"""The load: bursts of mixed fenced jobs for random records, as requests would enqueue them.

Each job is enqueued in a transaction of its own (one request, one job), for the record as it
was just read. A burst of several jobs for one record makes a lane with a queue behind its head
(so that claims take lane followers); the backlog of unfinished jobs is capped so that the
workers, not the feeder, set the pace and the run ends in bounded time.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

import tombstones
from tombstones.exceptions import TombstoneError
from tombstones.jobs.enqueue import enqueue_plain
from tombstones.jobs.queues import DEFAULT
from tombstones.models import Job

from ..models import StressEntity
from . import journal
from .outages import retrying

# (handler, share of the jobs): ~50% internal increments, ~15% read-modify-write, ~6%
# transient failures, ~19% external calls, and ~10% plain jobs (no record: ~6% internal, ~4%
# external). Their params (_handler) are ids and timings only.
MIX: tuple[tuple[str, float], ...] = (
    ("soak.increment", 0.50),
    ("soak.rmw", 0.15),
    ("soak.transient", 0.06),
    ("soak.external", 0.19),
    ("soak.tick", 0.06),
    ("soak.ping", 0.04),
)
PLAIN_HANDLERS = frozenset({"soak.tick", "soak.ping"})
BULK_QUEUE = "bulk"  # TOMBSTONES_QUEUES in .settings
# (low, high, share): most jobs at priority 0, some above (their lanes looked at first), some
# below; a lane's order must hold whatever its jobs' priorities.
PRIORITIES: tuple[tuple[int, int, float], ...] = ((0, 0, 0.8), (1, 20, 0.1), (-20, -1, 0.1))
# A burst's length: mostly one job, sometimes a queue long enough to fill a claim's followers.
BURSTS: tuple[tuple[int, int, float], ...] = ((1, 1, 0.6), (2, 5, 0.3), (10, 30, 0.1))
# The backlog is counted every this many enqueues.
COUNT_EVERY = 50


@dataclass
class FeedStats:
    """What the feeder did (the jobs themselves are counted from the ledger)."""

    enqueued: int = 0
    skipped_tombstones: int = 0  # bursts for a record the editor had just deleted
    refused: int = 0  # enqueue raised (a stale instance the library refused)
    by_handler: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


class Feeder:
    """Enqueues ``total`` jobs over ``record_ids``, keeping at most ``backlog`` unfinished."""

    def __init__(self, total: int, record_ids: list[int], backlog: int, rng: random.Random) -> None:
        self.total = total
        self.record_ids = record_ids
        self.backlog = backlog
        self.rng = rng
        self.stats = FeedStats()

    def _handler(self) -> tuple[str, dict[str, Any]]:
        name = self.rng.choices([m[0] for m in MIX], weights=[m[1] for m in MIX])[0]
        if name == "soak.transient":
            return name, {"fail": self.rng.randint(1, 2)}
        if name in ("soak.external", "soak.ping"):
            return name, {"ms": 40}  # the call takes 0..40 ms: kills land in it
        if name == "soak.rmw":
            return name, {"ms": 2}
        return name, {}

    def _burst(self) -> int:
        low, high, _ = self.rng.choices(BURSTS, weights=[b[2] for b in BURSTS])[0]
        return self.rng.randint(low, high)

    def unfinished(self) -> int:
        return retrying(lambda: Job.objects.filter(status__in=Job.UNFINISHED).count())

    def _priority(self) -> int:
        low, high, _ = self.rng.choices(PRIORITIES, weights=[p[2] for p in PRIORITIES])[0]
        return self.rng.randint(low, high)

    def _enqueue(self, record: StressEntity, name: str, params: dict[str, Any]) -> None:
        priority = self._priority()
        # Every fifth record's jobs, and half the plain ones, in the second queue (BULK_QUEUE):
        # a record's jobs stay in one queue, so its lane is one lane.
        plain = name in PLAIN_HANDLERS
        bulk = self.rng.random() < 0.5 if plain else record.pk % 5 == 0
        options: dict[str, Any] = {
            "params": params,
            "priority": priority,
            "queue": BULK_QUEUE if bulk else DEFAULT,
        }

        def step() -> int:
            with transaction.atomic():
                if plain:  # for no record: a lane of its own
                    return int(enqueue_plain(name, **options).pk)
                return int(tombstones.enqueue(name, record, **options).pk)

        try:
            job_id = retrying(step)
        except TombstoneError:
            self.stats.refused += 1
            return
        journal.enqueued(job_id)
        self.stats.enqueued += 1
        self.stats.by_handler[name] += 1

    def run(self, tick: Callable[[float], None]) -> FeedStats:
        """Enqueue ``total`` jobs; ``tick(progress)`` runs between bursts (the chaos)."""
        began = time.monotonic()
        count_at = 0
        while self.stats.enqueued < self.total:
            tick(self.stats.enqueued / self.total)
            if self.stats.enqueued >= count_at:
                count_at = self.stats.enqueued + COUNT_EVERY
                while self.unfinished() > self.backlog:
                    tick(self.stats.enqueued / self.total)
                    time.sleep(0.02)
            pk = self.rng.choice(self.record_ids)
            record = retrying(lambda pk=pk: StressEntity.objects.filter(pk=pk).first())
            if record is None:
                self.stats.skipped_tombstones += 1
                continue
            for _ in range(min(self._burst(), self.total - self.stats.enqueued)):
                self._enqueue(record, *self._handler())
        self.stats.seconds = time.monotonic() - began
        return self.stats
