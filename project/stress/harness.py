"""The race harness behind ``manage.py racestress``: feed, wait, compare, count anomalies.

The feeder changes the source of truth (:class:`StressEntity`) and enqueues one delivery job per
change in the same transaction; real django-q2 workers deliver to :class:`DownstreamRecord` with
blind writes. Ordered runs use the default ordering key (the entity's row, which a re-create
keeps); ``ordering=False`` gives every job its own lane, the seed's bug.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import connection, models, transaction
from django.db.models import Q
from django_q.models import OrmQ

from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job, JobEvent

from .models import AppliedWrite, Delivery, DownstreamRecord, StressEntity

# Longest a re-create waits for its delete to be sent by a worker (seconds).
MAX_WAIT = 2.0
# The feeder gives up when no job finished for this long (seconds).
STALL = 60.0
# Signals that stop a run; the cluster is stopped before the command exits.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stalled(RuntimeError):
    """No job finished for STALL seconds: the workers are gone or stuck."""


class Stopped(BaseException):
    """A signal asked the run to stop.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way (a
    broker call, a handler) swallows it and leaves the run going.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def stopped_by(exc: BaseException) -> Stopped | None:
    """The :class:`Stopped` behind ``exc``, if any.

    The signal may land anywhere, for example inside a commit: the ``atomic`` block's exit then
    fails on the broken transaction and raises a database error whose context is the Stopped.
    """
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, Stopped):
            return found
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return None


@contextlib.contextmanager
def stop_on_signals(signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Turn SIGTERM, SIGINT and SIGHUP into :class:`Stopped` for the duration of the block.

    Without this, SIGTERM (e.g. from ``timeout``) ends the process without unwinding, and its
    cluster, in a session of its own, keeps running against the database.
    """

    def stop(signum: int, frame: Any) -> None:
        # The first signal stops the run; later ones are ignored so the cleanup can finish
        # (Cluster.stop is bounded: SIGTERM, then SIGKILL of its process group).
        for other in signals:
            signal.signal(other, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


ANOMALY_KINDS = (
    "disappeared_after_recreate",  # live at the source (re-created), missing downstream
    "missing",  # live at the source (never deleted), missing downstream
    "resurrected_after_delete",  # a tombstone at the source, present downstream
    "stale_content",  # present on both sides, downstream content is not the latest
    "phantom",  # downstream holds a key the source never had
    "lane_order_violations",  # a lane's deliveries overlapped or ran out of enqueue order
    "lost_jobs",  # a change without a job, or a job that never reached a terminal outcome
    "duplicated_jobs",  # a job delivered more than once
    "lost_deliveries",  # a job recorded as succeeded that never delivered
)


@dataclass
class Plan:
    entities: int = 200
    messages: int = 1000
    ordering: bool = True
    delay_ms: float = 30.0  # every delivery waits 0..delay_ms before its downstream write
    slow_delete_ms: float = 600.0  # the delete of a delete+recreate burst: a quarter..all of this
    recreate_gap_ms: float = 5.0  # the re-create follows its delete's send by 0..gap ms
    in_flight: int = 0  # unfinished jobs the feeder allows (0: workers + 2)
    seed: int = 0


@dataclass
class Report:
    mode: str
    database: str
    broker: str
    workers: int
    entities: int
    messages: int
    seconds: float = 0.0
    messages_per_s: float = 0.0
    anomalies: int = 0
    breakdown: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    uncertain: int = 0  # external calls overtaken by a change: they still need a staff decision
    superseded: int = 0  # ... those a later job of their lane sends anew: nothing to decide
    entity_reorderings: int = 0
    completed: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def mode_name(ordering: bool, workers: int) -> str:
    if not ordering:
        return "unordered"
    return "sequential" if workers == 1 else "ordered"


def reset() -> None:
    """Wipe the harness's tables and its jobs (the harness owns them; nothing else is touched)."""
    ct = ContentType.objects.get_for_model(StressEntity)
    JobEvent.objects.filter(content_type=ct).delete()
    Job.objects.filter(content_type=ct).delete()
    for model in (Delivery, DownstreamRecord, AppliedWrite):
        model.objects.all().delete()
    models.QuerySet(model=StressEntity).delete()  # hard delete, bypassing the tombstone queryset
    OrmQ.objects.filter(key__startswith="racestress-").delete()


class Feeder:
    """Bursty create / update / delete / delete-then-recreate changes, one job per change.

    Closed loop: a burst tops the unfinished jobs up to ``in_flight`` whenever half of them are
    done, so the broker queue stays short and a re-create's job is picked up while its delete is
    still being delivered (an open-loop flood would queue it behind everything, and the fence
    would then reject the delete: no race left to see).
    """

    def __init__(self, plan: Plan, first_id: int, workers: int) -> None:
        self.plan = plan
        self.first_id = first_id
        self.in_flight = plan.in_flight or workers + 2
        self.rng = random.Random(plan.seed)
        self.keys = [f"E{i:05d}" for i in range(plan.entities)]
        self.state: dict[str, str] = {}  # key -> "live" | "dead"; absent: never created
        self.pending: list[tuple[float, str, int]] = []  # (due, key, delete job) of re-creates
        self.waiting: set[str] = set()
        self.sent = 0
        self.changes = 0

    def _lane(self) -> str | None:
        return None if self.plan.ordering else f"job-{uuid.uuid4().hex}"

    def _params(self, *, slow: bool = False) -> dict[str, Any]:
        if slow:
            slow = self.plan.slow_delete_ms
            return {"delay_ms": slow, "delay_min_ms": slow / 4}
        return {"delay_ms": self.plan.delay_ms} if self.plan.delay_ms else {}

    def _payload(self, key: str) -> str:
        self.changes += 1
        return f"{key}:c{self.changes}"

    def create(self, key: str) -> None:
        with transaction.atomic():
            record = StressEntity.all_objects.recreate(key=key, payload=self._payload(key))
            enqueue("stress.upsert", record, params=self._params(), ordering_key=self._lane())
        self.state[key] = "live"
        self.sent += 1

    def update(self, key: str) -> None:
        with transaction.atomic():
            record = StressEntity.objects.get(key=key)
            record.payload = self._payload(key)
            record.save()
            enqueue("stress.upsert", record, params=self._params(), ordering_key=self._lane())
        self.sent += 1

    def delete(self, key: str, *, slow: bool = False) -> int:
        with transaction.atomic():
            record = StressEntity.objects.get(key=key)
            record.delete()
            job = enqueue(
                "stress.delete", record, params=self._params(slow=slow), ordering_key=self._lane()
            )
        self.state[key] = "dead"
        self.sent += 1
        return int(job.pk)

    def _due_recreates(self, *, wait: bool = False) -> None:
        """Re-create the entities whose delete is being delivered and whose gap elapsed.

        Waiting for the delete's send widens the race window on purpose: the re-create lands
        while the delete is in flight, which is when the seed's bug bites. Bounded by MAX_WAIT.
        """
        deadline = time.monotonic() + (MAX_WAIT + 1 if wait else 0)
        while self.pending:
            now = time.monotonic()
            due = [p for p in self.pending if p[0] <= now]
            if due:
                picked = set(
                    Job.objects.filter(id__in=[p[2] for p in due])
                    .filter(Q(sending_at__isnull=False) | Q(status__in=Job.TERMINAL))
                    .values_list("id", flat=True)
                )
                for entry in due:
                    if entry[2] in picked or now - entry[0] > MAX_WAIT:
                        self.pending.remove(entry)
                        self.waiting.discard(entry[1])
                        self.create(entry[1])
            if not wait or not self.pending or time.monotonic() > deadline:
                return
            time.sleep(0.005)

    def step(self) -> None:
        """One change to a random entity."""
        plan = self.plan
        key = self.rng.choice(self.keys)
        if key in self.waiting:
            return
        state = self.state.get(key)
        if state is None or state == "dead":
            self.create(key)
            return
        roll = self.rng.random()
        room = plan.messages - self.sent - len(self.pending)
        if roll < 0.55:
            self.update(key)
        elif roll < 0.85 and room >= 2:
            # The seed's business flow: remove, then recreate within milliseconds.
            job_id = self.delete(key, slow=True)
            gap = self.rng.uniform(0, plan.recreate_gap_ms) / 1000
            self.pending.append((time.monotonic() + gap, key, job_id))
            self.waiting.add(key)
        else:
            self.delete(key)

    def unfinished(self) -> int:
        return Job.objects.filter(id__gte=self.first_id, status__in=Job.UNFINISHED).count()

    def run(self, on_progress: Callable[[], None] | None = None) -> int:
        plan = self.plan
        low = max(1, self.in_flight // 2)
        stalled_since = time.monotonic()
        last_busy = -1
        while self.sent + len(self.pending) < plan.messages:
            self._due_recreates()
            busy = self.unfinished()
            if busy != last_busy:
                stalled_since, last_busy = time.monotonic(), busy
            elif time.monotonic() - stalled_since > STALL:
                raise Stalled(f"No job finished for {STALL:.0f}s: are the workers running?")
            if busy > low:
                time.sleep(0.01)
                continue
            for _ in range(self.in_flight - busy):
                if self.sent + len(self.pending) >= plan.messages:
                    break
                self.step()
            if on_progress:
                on_progress()
        self._due_recreates(wait=True)
        return self.sent


def job_counts(first_id: int) -> tuple[int, int]:
    """(jobs enqueued by this run, of which finished)."""
    ct = ContentType.objects.get_for_model(StressEntity)
    jobs = Job.objects.filter(content_type=ct, id__gte=first_id)
    total = jobs.count()
    unfinished = jobs.filter(status__in=Job.UNFINISHED).count()
    return total, total - unfinished


def analyse(report: Report, first_id: int, expected: int) -> Report:
    """Compare downstream with the source of truth; count anomalies of every kind."""
    breakdown = dict.fromkeys(ANOMALY_KINDS, 0)
    source = {
        key: (payload, generation, deleted_at is not None)
        for key, payload, generation, deleted_at in StressEntity.all_objects.values_list(
            "key", "payload", "generation", "deleted_at"
        )
    }
    downstream = dict(
        (key, (payload, generation))
        for key, payload, generation in DownstreamRecord.objects.values_list(
            "key", "payload", "generation"
        )
    )
    for key, (payload, generation, dead) in source.items():
        there = downstream.get(key)
        if dead:
            if there is not None:
                breakdown["resurrected_after_delete"] += 1
        elif there is None:
            kind = "disappeared_after_recreate" if generation > 1 else "missing"
            breakdown[kind] += 1
        elif there != (payload, generation):
            breakdown["stale_content"] += 1
    breakdown["phantom"] = len(set(downstream) - set(source))

    ct = ContentType.objects.get_for_model(StressEntity)
    jobs = Job.objects.filter(content_type=ct, id__gte=first_id)
    statuses = Counter(str(s) for s in jobs.values_list("status", flat=True))
    report.outcomes = dict(sorted(statuses.items()))
    report.uncertain = statuses.get(Job.Status.UNCERTAIN, 0)
    report.superseded = statuses.get(Job.Status.SUPERSEDED, 0)
    total = sum(statuses.values())
    unfinished = sum(statuses.get(s, 0) for s in Job.UNFINISHED)
    breakdown["lost_jobs"] = max(expected - total, 0) + unfinished

    deliveries = list(
        Delivery.objects.filter(job_id__gte=first_id)
        .order_by("id")
        .values_list("job_id", "lane", "sequence", "key", "phase", "worker", "created_at")
    )
    ends = Counter(row[0] for row in deliveries if row[4] == "end")
    breakdown["duplicated_jobs"] = sum(1 for n in ends.values() if n > 1)
    succeeded = jobs.filter(status=Job.Status.SUCCEEDED).values_list("id", flat=True)
    breakdown["lost_deliveries"] = sum(1 for job_id in succeeded if job_id not in ends)
    cut = _cut_off(deliveries)
    breakdown["lane_order_violations"] = _order_violations(
        [
            (lane, seq, phase, at, cut.get(i))
            for i, (_, lane, seq, _, phase, _, at) in enumerate(deliveries)
        ]
    )
    report.entity_reorderings = _order_violations(
        [
            (key, seq, phase, at, cut.get(i))
            for i, (_, _, seq, key, phase, _, at) in enumerate(deliveries)
        ]
    )
    report.breakdown = breakdown
    report.anomalies = sum(breakdown.values())
    return report


def _cut_off(deliveries: list[tuple[Any, ...]]) -> dict[int, Any]:
    """Deliveries whose worker died in them (a killed host): row index -> when it was dead.

    A start that its worker never ended, on a job whose lease was then taken back: the worker
    wrote nothing after its death, and the take-back (the database's clock) came after it. The
    lane's next delivery must start after that moment, or it overlapped.
    """
    ended = {(row[0], row[5]) for row in deliveries if row[4] == "end"}
    open_starts = {
        i: row
        for i, row in enumerate(deliveries)
        if row[4] == "start" and (row[0], row[5]) not in ended
    }
    if not open_starts:
        return {}
    taken_back: dict[int, list[Any]] = defaultdict(list)
    for job_id, at in JobEvent.objects.filter(
        job_id__in={row[0] for row in open_starts.values()},
        reason__in=[Job.Reason.LEASE_EXPIRED, Job.Reason.OUTCOME_UNKNOWN],
    ).values_list("job_id", "created_at"):
        taken_back[job_id].append(at)
    found = {}
    for i, (job_id, *_, at) in open_starts.items():
        later = [t for t in taken_back.get(job_id, []) if t >= at]
        if later:
            found[i] = min(later)
    return found


def _order_violations(rows: list[tuple[str, int, str, Any, Any]]) -> int:
    """Deliveries of one group (in log order) that overlapped or went backwards in sequence.

    Each row: (group, sequence, phase, logged at, dead at). A delivery whose worker died in it
    (``dead at``, see :func:`_cut_off`) stops running at that moment.
    """
    last_seq: dict[str, int] = {}
    running: dict[str, dict[int, Any]] = defaultdict(dict)
    violations = 0
    for group, seq, phase, at, dead_at in rows:
        if phase == "start":
            now = running[group]
            for gone in [s for s, end in now.items() if end is not None and end <= at]:
                del now[gone]
            if now or seq < last_seq.get(group, -1):
                violations += 1
            now[seq] = dead_at
            last_seq[group] = max(seq, last_seq.get(group, -1))
        else:
            running[group].pop(seq, None)
    return violations


def database_label() -> str:
    return connection.vendor
