"""What the soak verifies, on plain data (no database here: :mod:`.evidence` loads it).

Times are whole microseconds since the epoch: the journals' clock (the workers') and the
ledger's (the private PostgreSQL's) are this machine's one clock.

Lane order, as DESIGN.md defines it: a job of a lane never starts before every earlier job of
that lane (by lane place, ``(queued_at, id)`` as finally stored) has reached a terminal state.
A *start* is a handler start from the journals; an earlier job reached its terminal state at
its ``finished_at`` (the statement time of the UPDATE that recorded it, which commits later
still). Two starts are not compared that way, because a group of internal jobs runs in one
transaction whose outcome UPDATE comes after all its handlers:

- an earlier job whose outcome the same claim recorded, and which did not start after the later
  job in that claim, ran before it in its group: in order;
- a later job's start that its claim never committed (the claim was killed, or given back on a
  database error: the job's outcome came from a later claim and the start left no effect),
  after the earlier job started in that same claim: the group rolled back as a whole, in order.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tombstones.jobs.states import TERMINAL, UNFINISHED, Status

from .journal import Call, Claimed, End, Enqueued, Start

NEVER = math.inf  # the finish of a job that never reached a terminal state
# Statuses that must carry a reason code.
NEEDS_REASON = frozenset(TERMINAL) - {Status.SUCCEEDED}
INTERNAL_HANDLERS = frozenset({"soak.increment", "soak.rmw", "soak.transient", "soak.tick"})
# The record of a plain job's effects (soak.tick): none; they count as jobs', not records'.
PLAIN = 0


@dataclass(frozen=True)
class JobRow:
    """A job as the ledger finally stores it."""

    id: int
    lane: str
    place: int  # queued_at
    handler: str
    external: bool
    status: str
    reason: str
    attempts: int
    started: int | None  # the last claim's time
    finished: int | None
    owner: str  # the last claim's worker
    claim: str  # the last claim (journal.claim_key)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def done_at(self) -> float:
        return self.finished if self.terminal and self.finished is not None else NEVER


@dataclass(frozen=True)
class RecordRow:
    id: int
    generation: int
    version: int
    counter: int
    deleted: bool


@dataclass(frozen=True)
class Effect:
    job: int
    entity: int
    generation: int
    version: int
    counter: int
    claim: str


@dataclass(frozen=True)
class Edit:
    entity: int
    generation: int
    version: int
    kind: str  # edit, delete, recreate


def by_lane(jobs: Iterable[JobRow]) -> dict[str, list[JobRow]]:
    lanes: dict[str, list[JobRow]] = defaultdict(list)
    for job in jobs:
        lanes[job.lane].append(job)
    for lane_jobs in lanes.values():
        lane_jobs.sort(key=lambda j: (j.place, j.id))
    return lanes


@dataclass
class Trace:
    """What the journals say beyond handler starts, for the violations' details."""

    kills: Sequence[int] = ()
    claims: Sequence[Claimed] = ()
    enqueued: Sequence[Enqueued] = ()


def order_violations(
    jobs: Sequence[JobRow],
    starts: Sequence[Start],
    effects: Sequence[Effect] = (),
    trace: Trace | None = None,
) -> list[dict[str, Any]]:
    """Every (job, earlier job of its lane) where the job's handler started before the earlier
    job reached a terminal state (see the module docstring for the two in-claim cases)."""
    runs: dict[int, list[Start]] = defaultdict(list)
    for start in sorted(starts, key=lambda s: s.at):
        runs[start.job].append(start)
    committed = {(e.job, e.claim) for e in effects}
    context = _Context(trace or Trace(), {j.id: j.lane for j in jobs})
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for lane, lane_jobs in by_lane(jobs).items():
        latest = -NEVER  # the latest terminal time among the jobs placed before this one
        for index, job in enumerate(lane_jobs):
            for start in runs.get(job.id, []):
                if start.at >= latest:
                    continue  # every earlier job had ended: the common case, one comparison
                for earlier in lane_jobs[:index]:
                    if earlier.done_at <= start.at or (earlier.id, job.id) in found:
                        continue
                    if _in_claim_order(earlier, job, start, runs, committed):
                        continue
                    found[(earlier.id, job.id)] = context.details(lane, earlier, job, start, runs)
            latest = max(latest, job.done_at)
    return sorted(found.values(), key=lambda v: v["start_at"])


def _in_claim_order(
    earlier: JobRow,
    job: JobRow,
    start: Start,
    runs: dict[int, list[Start]],
    committed: set[tuple[int, str]],
) -> bool:
    mine = [r for r in runs.get(earlier.id, []) if r.claim == start.claim]
    if earlier.claim == start.claim and not any(r.at > start.at for r in mine):
        return True  # its outcome was recorded by this claim, and it ran first
    kept = job.claim == start.claim or (job.id, start.claim) in committed
    return not kept and any(r.at < start.at for r in mine)


def _claim_time(claim: str) -> int | None:
    _, _, at = claim.rpartition("@")
    return int(at) if at.isdigit() else None


class _Context:
    """The journals' claims, enqueue commits and the kills, indexed for the details."""

    def __init__(self, trace: Trace, lane_of: dict[int, str]) -> None:
        self.kills = sorted(trace.kills)
        self.claims: dict[int, list[Claimed]] = defaultdict(list)
        self.led: dict[str, set[str]] = defaultdict(set)  # claim -> lanes it took a head of
        for claimed in sorted(trace.claims, key=lambda c: c.at):
            self.claims[claimed.job].append(claimed)
            if claimed.status == Status.RUNNING:
                self.led[claimed.claim].add(lane_of.get(claimed.job, ""))
        self.enqueued = {e.job: e.at for e in trace.enqueued}

    def details(
        self,
        lane: str,
        earlier: JobRow,
        job: JobRow,
        start: Start,
        runs: dict[int, list[Start]],
    ) -> dict[str, Any]:
        before = [k for k in self.kills if k <= start.at]
        claimed_at = _claim_time(start.claim)
        committed = self.enqueued.get(earlier.id)
        return {
            "lane": lane,
            "job": self._job(job, runs),
            "earlier": self._job(earlier, runs),
            "start_at": start.at,
            "start_claim": start.claim,
            "start_attempts": start.attempts,
            "first_start": runs[job.id][0].at,
            # How long after this start the earlier job ended (None: it never did).
            "overtaken_by_ms": (
                round((earlier.done_at - start.at) / 1000, 1) if earlier.done_at != NEVER else None
            ),
            "earlier_started_before": any(r.at < start.at for r in runs.get(earlier.id, [])),
            "same_claim": any(r.claim == start.claim for r in runs.get(earlier.id, [])),
            # The earlier job was taken in the very claim that started this one, and did not run.
            "earlier_in_same_claim": any(
                c.claim == start.claim for c in self.claims.get(earlier.id, [])
            ),
            # This job was a lane follower of a claim that took no head of its lane.
            "headless_follower": any(
                c.claim == start.claim and c.status != Status.RUNNING
                for c in self.claims.get(job.id, [])
            )
            and lane not in self.led.get(start.claim, set()),
            # The earlier job's enqueue committed after the claim that started this one looked:
            # two enqueues of one lane, committed out of their places' order.
            "earlier_committed_after_claim": (
                committed is not None and claimed_at is not None and committed > claimed_at
            ),
            "last_kill_before_ms": round((start.at - before[-1]) / 1000, 1) if before else None,
        }

    def _job(self, job: JobRow, runs: dict[int, list[Start]]) -> dict[str, Any]:
        return {
            "id": job.id,
            "handler": job.handler,
            "status": job.status,
            "reason": job.reason,
            "attempts": job.attempts,
            "place": job.place,
            "enqueue_committed": self.enqueued.get(job.id),
            "finished": job.finished,
            "last_claim": job.claim,
            "claims": [
                {
                    "claim": c.claim,
                    "as": "head" if c.status == Status.RUNNING else "follower",
                    "attempts": c.attempts,
                }
                for c in self.claims.get(job.id, [])
            ],
            "starts": [
                {"at": r.at, "claim": r.claim, "attempts": r.attempts} for r in runs.get(job.id, [])
            ],
            "events": [],  # filled from the JobEvent table by evidence.add_events
        }


def headless_followers(jobs: Sequence[JobRow], claims: Sequence[Claimed]) -> list[dict[str, Any]]:
    """Claims that reserved lane followers without taking a head of their lane (a follower runs
    behind its head, in its head's group: without one, nothing keeps it behind the lane's
    earlier jobs). A diagnostic: the order check finds what such a claim overtook."""
    lane_of = {j.id: j.lane for j in jobs}
    members: dict[str, list[Claimed]] = defaultdict(list)
    for claimed in claims:
        members[claimed.claim].append(claimed)
    found = []
    for claim, taken in members.items():
        led = {lane_of.get(c.job) for c in taken if c.status == Status.RUNNING}
        alone = sorted(
            c.job for c in taken if c.status != Status.RUNNING and lane_of.get(c.job) not in led
        )
        if alone:
            found.append(
                {
                    "claim": claim,
                    "followers": alone,
                    "lanes": sorted({lane_of.get(j, "") for j in alone}),
                    "heads": sorted(c.job for c in taken if c.status == Status.RUNNING),
                }
            )
    return sorted(found, key=lambda f: f["claim"].rpartition("@")[2])


def lost_updates(
    records: Sequence[RecordRow], effects: Sequence[Effect], edits: Sequence[Edit]
) -> list[dict[str, Any]]:
    """Every version of every (record, generation) accounted for exactly once, and the counter
    equal to the effects.

    A generation starts at version 1 (created or re-created); each committed internal write (an
    effect row) and each editor change (an edit or the delete) adds exactly one version, and each
    write sets the counter to one more than the write before it. So per (record, generation):
    the versions written are exactly 2..n+1, the counters written exactly 1..e, and the record,
    at its current generation, holds version n+1 and counter e. A write that overwrote another
    (a stale copy, a broken fence) repeats a version or a counter value.
    """
    versions: dict[tuple[int, int], list[int]] = defaultdict(list)
    counters: dict[tuple[int, int], list[int]] = defaultdict(list)
    for effect in effects:
        if effect.entity == PLAIN:
            continue
        versions[(effect.entity, effect.generation)].append(effect.version)
        counters[(effect.entity, effect.generation)].append(effect.counter)
    for edit in edits:
        if edit.kind != "recreate":
            versions[(edit.entity, edit.generation)].append(edit.version)
    problems = []
    for key in sorted(set(versions) | set(counters)):
        written = sorted(versions.get(key, []))
        counted = sorted(counters.get(key, []))
        if written != list(range(2, len(written) + 2)) or counted != list(
            range(1, len(counted) + 1)
        ):
            problems.append(
                {
                    "record": key[0],
                    "generation": key[1],
                    "repeated_versions": _repeated(written),
                    "repeated_counters": _repeated(counted),
                    "versions_written": len(written),
                    "effects": len(counted),
                }
            )
    for record in records:
        key = (record.id, record.generation)
        expected = (len(versions.get(key, [])) + 1, len(counters.get(key, [])))
        if (record.version, record.counter) != expected:
            problems.append(
                {
                    "record": record.id,
                    "generation": record.generation,
                    "version": record.version,
                    "expected_version": expected[0],
                    "counter": record.counter,
                    "expected_counter": expected[1],
                }
            )
    return problems


def _repeated(values: list[int]) -> list[int]:
    return sorted(v for v, n in Counter(values).items() if n > 1)


def effect_problems(jobs: Sequence[JobRow], effects: Sequence[Effect]) -> dict[str, list[int]]:
    """Internal effects against the ledger: each succeeded internal job has exactly one."""
    per_job = Counter(e.job for e in effects)
    status = {j.id: j.status for j in jobs}
    internal = [j for j in jobs if j.handler in INTERNAL_HANDLERS]
    return {
        "doubled": sorted(job for job, n in per_job.items() if n > 1),
        "without_success": sorted(job for job in per_job if status.get(job) != Status.SUCCEEDED),
        "success_without_effect": sorted(
            j.id for j in internal if j.status == Status.SUCCEEDED and j.id not in per_job
        ),
    }


def call_problems(jobs: Sequence[JobRow], calls: Sequence[Call]) -> dict[str, Any]:
    """External calls: never two with one idempotency key; every sent success made its call."""
    per_key = Counter(c.key for c in calls)
    called = {c.job for c in calls}
    return {
        "repeated": {key: n for key, n in sorted(per_key.items()) if n > 1},
        "success_without_call": sorted(
            j.id for j in jobs if j.external and j.status == Status.SUCCEEDED and j.id not in called
        ),
    }


def stuck(jobs: Sequence[JobRow]) -> list[int]:
    return sorted(j.id for j in jobs if j.status in UNFINISHED)


def without_reason(jobs: Sequence[JobRow]) -> list[int]:
    return sorted(j.id for j in jobs if j.status in NEEDS_REASON and not j.reason)


def handler_runs(starts: Sequence[Start], ends: Sequence[End]) -> dict[str, int]:
    """Starts that never ended (their worker died in them), and results of the others."""
    ended = {(e.job, e.claim) for e in ends}
    results = Counter(e.result for e in ends)
    return {
        "starts": len(starts),
        "unended": sum(1 for s in starts if (s.job, s.claim) not in ended),
        **{f"ended_{name}": n for name, n in sorted(results.items())},
    }


def blind_checks(
    jobs: Sequence[JobRow],
    records: Sequence[RecordRow],
    effects: Sequence[Effect],
    edits: Sequence[Edit],
    starts: Sequence[Start],
    calls: Sequence[Call],
) -> list[str]:
    """The checks, checked: each is run again on a copy of this run's evidence with one fault
    planted, and must find it. Returns the names of those that did not (a soak that cannot see
    a fault must not pass).
    """
    blind = []
    # An earlier job of a lane made to end 1 ms after a later job's last start, by another claim.
    lanes = by_lane(jobs)
    last_start = {s.job: s for s in sorted(starts, key=lambda s: s.at)}
    pair = next(
        (
            (lane_jobs[i - 1], lane_jobs[i])
            for lane_jobs in lanes.values()
            for i in range(1, len(lane_jobs))
            if lane_jobs[i].id in last_start
            and lane_jobs[i].claim == last_start[lane_jobs[i].id].claim
        ),
        None,
    )
    if pair is not None:
        earlier, later = pair
        late = replace(
            earlier,
            status=Status.SUCCEEDED,
            finished=last_start[later.id].at + 1000,
            claim="planted",
        )
        planted = [late if j.id == earlier.id else j for j in jobs]
        if not order_violations(planted, starts, effects):
            blind.append("lane_order_violations")
    if records:
        first = records[0]
        moved = [replace(first, counter=first.counter + 1), *records[1:]]
        if not lost_updates(moved, effects, edits):
            blind.append("lost_updates")
    if effects and not effect_problems(jobs, [*effects, effects[0]])["doubled"]:
        blind.append("doubled_effects")
    if calls and not call_problems(jobs, [*calls, calls[0]])["repeated"]:
        blind.append("repeated_external_calls")
    if jobs:
        queued = replace(jobs[0], status=Status.QUEUED)
        if not stuck([queued, *jobs[1:]]):
            blind.append("stuck_jobs")
        silent = replace(jobs[0], status=Status.REJECTED, reason="")
        if not without_reason([silent, *jobs[1:]]):
            blind.append("rejections_without_reason")
    return blind
