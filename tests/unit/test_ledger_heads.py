"""The claim's choice (tombstones.jobs.ledger.heads.pick) on lanes as read, without a database:
a lane's head is its first unfinished job if a worker may take it now, and nothing passes it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tombstones.jobs.ledger.heads import Front, pick

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def front(pk: int, lane: str = "L", **kw: Any) -> Front:
    values: dict[str, Any] = {
        "id": pk,
        "lane": lane,
        "status": "queued",
        "claim_token": "",
        "external": False,
        "reason": "",
        "due": True,
        "queued_at": T0 + timedelta(seconds=pk),
        "ready_at": T0,
        "run_after": T0,
    }
    values.update(kw)
    return Front(**values)


def hints(*pks: int) -> list[tuple[int, datetime]]:
    return [(pk, T0) for pk in pks]


def test_pick__a_lane_held_by_a_running_paused_or_reserved_first_job_gives_nothing() -> None:
    for first in (
        front(1, status="running", claim_token="t"),
        front(1, status="paused"),
        front(1, claim_token="t"),  # a follower another claim reserved
    ):
        picked = pick(["L"], {"L": [first, front(2)]}, {"L": hints(1, 2)}, size=5, whole=True)
        assert picked.ids == []
        assert picked.clear == hints(1, 2)  # looked at: its holder's next change hints again


def test_pick__the_first_job_runs_and_its_followers_stop_at_the_first_that_may_not() -> None:
    queue = [front(1), front(2), front(3, external=True), front(4)]
    picked = pick(["L"], {"L": queue}, {"L": hints(1, 4)}, size=5, whole=True)
    assert [f.id for f in picked.heads] == [1]
    assert [f.id for f in picked.followers] == [2]  # not past the external job
    assert picked.clear == hints(4)  # the taken jobs' hints go with the statement taking them


def test_pick__no_follower_behind_an_external_or_suspect_head_and_none_when_not_whole() -> None:
    for head in (front(1, external=True), front(1, reason="lease_expired")):
        picked = pick(["L"], {"L": [head, front(2)]}, {"L": hints(1)}, size=5, whole=True)
        assert ([f.id for f in picked.heads], picked.followers) == ([1], [])
    picked = pick(["L"], {"L": [front(1), front(2)]}, {"L": hints(1)}, size=5, whole=False)
    assert ([f.id for f in picked.heads], picked.followers) == ([1], [])


def test_pick__a_first_job_not_due_yet_holds_its_lane_and_its_hint_moves_to_its_time() -> None:
    later = T0 + timedelta(minutes=5)
    for waiting in (
        front(1, status="retry_wait", due=False, run_after=later, ready_at=T0),
        front(1, due=False, run_after=later, ready_at=T0),  # delayed
    ):
        picked = pick(["L"], {"L": [waiting, front(2)]}, {"L": hints(1, 2)}, size=5, whole=True)
        assert picked.ids == []
        assert picked.clear == hints(2)
        assert picked.rearm == [1]
    on_time = front(1, status="retry_wait", due=False, run_after=later, ready_at=later)
    picked = pick(["L"], {"L": [on_time]}, {"L": []}, size=5, whole=True)
    assert picked.rearm == []


def test_pick__a_due_retry_is_its_lanes_head() -> None:
    queue = [front(1, status="retry_wait"), front(2)]
    picked = pick(["L"], {"L": queue}, {"L": hints(1)}, size=5, whole=True)
    assert ([f.id for f in picked.heads], [f.id for f in picked.followers]) == ([1], [2])


def test_pick__a_full_batch_leaves_the_other_lanes_hints_for_the_next_claim() -> None:
    lanes = ["A", "B", "C"]
    fronts = {lane: [front(n, lane)] for n, lane in enumerate(lanes, 1)}
    found = {lane: hints(n) for n, lane in enumerate(lanes, 1)}
    picked = pick(lanes, fronts, found, size=2, whole=False)
    assert [f.id for f in picked.heads] == [1, 2]
    assert picked.clear == []
    assert picked.unclaimed == 1


def test_pick__a_suspect_head_is_taken_alone_or_left_for_the_next_claim() -> None:
    fronts = {"A": [front(1, "A", reason="crashed")], "B": [front(2, "B")]}
    found = {"A": hints(1), "B": hints(2)}
    alone = pick(["A", "B"], fronts, found, size=5, whole=True)
    assert [f.id for f in alone.heads] == [1]
    assert alone.clear == []  # B's hint stays
    later = pick(["B", "A"], fronts, found, size=5, whole=True)
    assert [f.id for f in later.heads] == [2]
    assert later.unclaimed == 1  # A, for a claim of its own


def test_pick__a_head_the_claim_could_not_lock_keeps_its_hints_and_its_lane() -> None:
    fronts = {"A": [front(1, "A"), front(2, "A"), front(3, "A")], "B": [front(4, "B")]}
    found = {"A": hints(1), "B": hints(4)}
    picked = pick(["A", "B"], fronts, found, size=5, whole=True, held={4})
    assert [f.id for f in picked.heads] == [4]
    assert picked.followers == []
    assert picked.clear == []  # A's hint stays: its head is another transaction's now
    cut = pick(["A"], fronts, found, size=5, whole=True, held={1, 3})
    assert ([f.id for f in cut.heads], cut.followers) == ([1], [])  # 2 not locked: 3 waits too


def test_pick__followers_in_all_are_the_earliest_places_and_each_lane_a_prefix() -> None:
    fronts = {
        "A": [front(1, "A"), front(3, "A"), front(5, "A")],
        "B": [front(2, "B"), front(4, "B"), front(6, "B")],
    }
    picked = pick(["A", "B"], fronts, {"A": [], "B": []}, size=5, whole=True)
    assert [f.id for f in picked.heads] == [1, 2]
    assert [f.id for f in picked.followers] == [3, 4, 5]


def test_pick__heads_and_followers_together_are_at_most_the_claims_size() -> None:
    # As many as the group that runs them holds: a follower past it would go back unstarted.
    hot = [front(n) for n in range(1, 61)]
    picked = pick(["L"], {"L": hot}, {"L": hints(1)}, size=50, whole=True)
    assert [f.id for f in picked.heads] == [1]
    assert [f.id for f in picked.followers] == list(range(2, 51))
    fronts = {
        "A": [front(1, "A"), front(3, "A"), front(5, "A")],
        "B": [front(2, "B"), front(4, "B"), front(6, "B")],
    }
    picked = pick(["A", "B"], fronts, {"A": [], "B": []}, size=3, whole=True)
    assert ([f.id for f in picked.heads], [f.id for f in picked.followers]) == ([1, 2], [3])
    full = pick(["A", "B"], fronts, {"A": [], "B": []}, size=2, whole=True)
    assert ([f.id for f in full.heads], full.followers) == ([1, 2], [])


def test_pick__only_the_jobs_asked_for_are_heads() -> None:
    fronts = {"A": [front(1, "A")], "B": [front(2, "B")]}
    picked = pick(["A", "B"], fronts, {"A": hints(1), "B": hints(2)}, size=5, whole=False, ids=[2])
    assert [f.id for f in picked.heads] == [2]
    assert picked.clear == []
