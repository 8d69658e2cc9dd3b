"""The chaos soak's checks (project/stress/soak/checks.py) on hand-made evidence: each finds the
fault it exists for, and lets the engine's legitimate interleavings through."""

from __future__ import annotations

from typing import Any

from project.stress.soak import checks
from project.stress.soak.checks import Edit, Effect, JobRow, RecordRow
from project.stress.soak.journal import Call, Claimed, Enqueued, Start

MS = 1000  # microseconds


def job(pk: int, place: int, **fields: Any) -> JobRow:
    values: dict[str, Any] = {
        "id": pk,
        "lane": "stress.stressentity:1",
        "place": place,
        "handler": "soak.increment",
        "external": False,
        "status": "succeeded",
        "reason": "",
        "attempts": 1,
        "started": None,
        "finished": None,
        "owner": "host:1",
        "claim": "",
    }
    values.update(fields)
    return JobRow(**values)


def test_order__a_job_started_after_its_earlier_job_ended_is_in_order() -> None:
    jobs = [job(1, 0, claim="A", finished=10 * MS), job(2, 1, claim="B", finished=30 * MS)]
    starts = [Start(1, "A", 1, 0, 5 * MS), Start(2, "B", 1, 0, 20 * MS)]
    assert checks.order_violations(jobs, starts) == []


def test_order__a_job_started_before_its_earlier_job_ended_by_another_claim_is_found() -> None:
    jobs = [job(1, 0, claim="A", finished=25 * MS), job(2, 1, claim="B", finished=30 * MS)]
    starts = [Start(1, "A", 1, 0, 5 * MS), Start(2, "B", 1, 0, 20 * MS)]
    claims = [Claimed(1, "A", "running", 1, 4 * MS), Claimed(2, "B", "queued", 1, 19 * MS)]
    trace = checks.Trace(kills=[15 * MS], claims=claims, enqueued=[Enqueued(1, 1 * MS)])
    [found] = checks.order_violations(jobs, starts, trace=trace)
    assert (found["earlier"]["id"], found["job"]["id"]) == (1, 2)
    assert found["overtaken_by_ms"] == 5.0
    assert found["last_kill_before_ms"] == 5.0
    assert not found["same_claim"]
    assert not found["earlier_in_same_claim"]
    assert found["job"]["claims"] == [{"claim": "B", "as": "follower", "attempts": 1}]
    assert found["earlier"]["enqueue_committed"] == 1 * MS


def test_order__lane_place_is_queued_at_then_id_not_the_id_alone() -> None:
    # Job 2 was placed first (a delayed job joins its lane at its due time): 3 after it is fine.
    jobs = [job(3, 0, claim="A", finished=10 * MS), job(2, 5, claim="B", finished=30 * MS)]
    starts = [Start(3, "A", 1, 0, 5 * MS), Start(2, "B", 1, 0, 20 * MS)]
    assert checks.order_violations(jobs, starts) == []


def test_order__an_earlier_job_left_behind_by_the_claim_that_took_it_is_told() -> None:
    # Claim B took 1 as head and 2 as follower; 1 never started there, 2 did; C ran 1 later.
    jobs = [job(1, 0, claim="B@900", finished=50 * MS), job(2, 1, claim="C@200", finished=30 * MS)]
    starts = [Start(2, "C@200", 1, 0, 20 * MS), Start(1, "B@900", 1, 0, 40 * MS)]
    claims = [Claimed(1, "C@200", "running", 1, 1), Claimed(2, "C@200", "queued", 1, 1)]
    trace = checks.Trace(claims=claims, enqueued=[Enqueued(1, 100), Enqueued(2, 300)])
    [found] = checks.order_violations(jobs, starts, trace=trace)
    assert found["earlier_in_same_claim"]
    assert not found["earlier_committed_after_claim"]


def test_order__an_earlier_enqueue_committed_after_the_claim_is_told() -> None:
    jobs = [job(1, 0, claim="B@900", finished=50 * MS), job(2, 1, claim="C@200", finished=30 * MS)]
    starts = [Start(2, "C@200", 1, 0, 20 * MS), Start(1, "B@900", 1, 0, 40 * MS)]
    trace = checks.Trace(enqueued=[Enqueued(1, 250), Enqueued(2, 150)])
    [found] = checks.order_violations(jobs, starts, trace=trace)
    assert found["earlier_committed_after_claim"]


def test_order__an_earlier_job_never_finished_is_overtaken_by_any_start() -> None:
    jobs = [job(1, 0, status="queued"), job(2, 1, claim="B", finished=30 * MS)]
    [found] = checks.order_violations(jobs, [Start(2, "B", 1, 0, 20 * MS)])
    assert found["overtaken_by_ms"] is None


def test_order__jobs_of_one_group_recorded_together_are_in_order() -> None:
    # One claim ran 1 then 2 in one transaction; its outcome UPDATE came after both handlers.
    jobs = [job(1, 0, claim="A", finished=30 * MS), job(2, 1, claim="A", finished=30 * MS)]
    starts = [Start(1, "A", 1, 0, 5 * MS), Start(2, "A", 1, 0, 10 * MS)]
    assert checks.order_violations(jobs, starts) == []


def test_order__a_group_that_ran_them_backwards_is_found() -> None:
    jobs = [job(1, 0, claim="A", finished=30 * MS), job(2, 1, claim="A", finished=30 * MS)]
    starts = [Start(2, "A", 1, 0, 5 * MS), Start(1, "A", 1, 0, 10 * MS)]
    assert len(checks.order_violations(jobs, starts)) == 1


def test_order__a_killed_group_that_ran_in_order_is_no_violation() -> None:
    # Claim A ran 1 then 2 and died: both rolled back, taken back, run again by B then C.
    jobs = [job(1, 0, claim="B", finished=50 * MS), job(2, 1, claim="C", finished=70 * MS)]
    starts = [
        Start(1, "A", 1, 0, 5 * MS),
        Start(2, "A", 1, 0, 10 * MS),
        Start(1, "B", 1, 0, 40 * MS),
        Start(2, "C", 1, 0, 60 * MS),
    ]
    assert checks.order_violations(jobs, starts) == []


def test_order__a_follower_run_and_committed_behind_a_head_left_waiting_is_found() -> None:
    # Claim A: job 1 went to retry_wait (finished later by claim D), yet job 2 ran and committed
    # in A (its effect and outcome are A's).
    jobs = [job(1, 0, claim="D", finished=90 * MS), job(2, 1, claim="A", finished=30 * MS)]
    starts = [Start(1, "A", 1, 0, 5 * MS), Start(2, "A", 1, 0, 10 * MS), Start(1, "D", 2, 0, 80)]
    effects = [Effect(2, 1, 1, 2, 1, "A")]
    [found] = checks.order_violations(jobs, starts, effects)
    assert found["same_claim"]


def test_order__every_earlier_job_is_compared_not_only_the_one_before() -> None:
    jobs = [
        job(1, 0, claim="A", finished=50 * MS),
        job(2, 1, claim="B", finished=15 * MS),
        job(3, 2, claim="C", finished=60 * MS),
    ]
    starts = [
        Start(1, "A", 1, 0, 5 * MS),
        Start(2, "B", 1, 0, 10 * MS),
        Start(3, "C", 1, 0, 20 * MS),
    ]
    found = {(v["earlier"]["id"], v["job"]["id"]) for v in checks.order_violations(jobs, starts)}
    assert found == {(1, 2), (1, 3)}


def test_headless_followers__a_follower_without_its_lanes_head_in_the_claim_is_found() -> None:
    jobs = [job(1, 0), job(2, 1), job(3, 0, lane="other"), job(4, 1, lane="other")]
    claims = [
        Claimed(1, "A", "running", 1, 1),
        Claimed(2, "A", "queued", 1, 1),  # behind its head 1: fine
        Claimed(4, "A", "queued", 1, 1),  # lane "other" has no head in A
    ]
    [found] = checks.headless_followers(jobs, claims)
    assert found == {"claim": "A", "followers": [4], "lanes": ["other"], "heads": [1]}


def test_lost_updates__a_clean_history_has_none() -> None:
    records = [RecordRow(1, 2, 4, 2, deleted=False), RecordRow(2, 1, 3, 0, deleted=True)]
    effects = [Effect(10, 1, 2, 2, 1, "A"), Effect(11, 1, 2, 4, 2, "B"), Effect(9, 1, 1, 2, 1, "Z")]
    edits = [
        Edit(1, 1, 3, "delete"),
        Edit(1, 2, 1, "recreate"),
        Edit(1, 2, 3, "edit"),
        Edit(2, 1, 2, "edit"),
        Edit(2, 1, 3, "delete"),
    ]
    assert checks.lost_updates(records, effects, edits) == []


def test_lost_updates__a_write_over_a_stale_copy_repeats_a_counter() -> None:
    # Two increments both read counter 0: the record says 1, two effects committed.
    records = [RecordRow(1, 1, 3, 1, deleted=False)]
    effects = [Effect(10, 1, 1, 2, 1, "A"), Effect(11, 1, 1, 3, 1, "B")]
    repeated, short = checks.lost_updates(records, effects, [])
    assert repeated["repeated_counters"] == [1]
    assert (short["counter"], short["expected_counter"]) == (1, 2)
    # A counter short of the effects is found even without a repeated value.
    records = [RecordRow(1, 1, 3, 1, deleted=False)]
    effects = [Effect(10, 1, 1, 2, 1, "A"), Effect(11, 1, 1, 3, 2, "B")]
    [found] = checks.lost_updates(records, effects, [])
    assert (found["counter"], found["expected_counter"]) == (1, 2)


def test_lost_updates__a_version_not_accounted_for_is_found() -> None:
    records = [RecordRow(1, 1, 3, 1, deleted=False)]  # version 3, but one write and no edit
    assert checks.lost_updates(records, [Effect(10, 1, 1, 2, 1, "A")], [])


def test_effects_and_calls__doubled_missing_and_repeated_are_found() -> None:
    jobs = [
        job(1, 0),
        job(2, 1),
        job(3, 2, status="rejected", reason="source_deleted"),
        job(4, 3, handler="soak.external", external=True),
        job(5, 4, handler="soak.external", external=True),
    ]
    effects = [Effect(1, 1, 1, 2, 1, "A"), Effect(1, 1, 1, 3, 2, "B"), Effect(3, 1, 1, 4, 3, "C")]
    found = checks.effect_problems(jobs, effects)
    assert found == {"doubled": [1], "without_success": [3], "success_without_effect": [2]}
    calls = [Call("tombstones-job-4-g1", 4, 1), Call("tombstones-job-4-g1", 4, 2)]
    assert checks.call_problems(jobs, calls) == {
        "repeated": {"tombstones-job-4-g1": 2},
        "success_without_call": [5],
    }


def test_effects__a_plain_jobs_effect_counts_for_its_job_never_for_a_record() -> None:
    """soak.tick's effect rows name record 0: no record's versions, but each job's one."""
    plain = checks.PLAIN
    records = [RecordRow(1, 1, 2, 1, deleted=False)]
    effects = [Effect(10, 1, 1, 2, 1, "A"), Effect(20, plain, 0, 0, 0, "B")]
    assert checks.lost_updates(records, effects, []) == []
    jobs = [
        job(10, 0),
        job(20, 1, lane="plain:a", handler="soak.tick"),
        job(21, 2, lane="plain:b", handler="soak.tick"),
    ]
    doubled = [*effects, Effect(20, plain, 0, 0, 0, "C")]
    assert checks.effect_problems(jobs, doubled) == {
        "doubled": [20],
        "without_success": [],
        "success_without_effect": [21],
    }


def test_stuck_and_reasons__unfinished_and_unexplained_jobs_are_found() -> None:
    jobs = [
        job(1, 0, status="retry_wait", reason="transient"),
        job(2, 1, status="rejected", reason=""),
        job(3, 2, status="uncertain", reason="outcome_unknown"),
    ]
    assert checks.stuck(jobs) == [1]
    assert checks.without_reason(jobs) == [2]


def test_blind_checks__every_check_finds_the_fault_planted_for_it() -> None:
    jobs = [job(1, 0, claim="A", finished=10 * MS), job(2, 1, claim="B", finished=30 * MS)]
    starts = [Start(1, "A", 1, 0, 5 * MS), Start(2, "B", 1, 0, 20 * MS)]
    records = [RecordRow(1, 1, 3, 2, deleted=False)]
    effects = [Effect(1, 1, 1, 2, 1, "A"), Effect(2, 1, 1, 3, 2, "B")]
    calls = [Call("tombstones-job-7-g1", 7, 1)]
    assert checks.blind_checks(jobs, records, effects, [], starts, calls) == []
