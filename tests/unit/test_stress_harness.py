"""The race harness's lane-order count (project/stress/harness.py) when a worker dies in a
delivery: its start has no end, and the lane's next delivery overlapped it only if it started
before the dead worker's job was taken back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from project.stress.harness import _order_violations

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_order__ended_deliveries_in_sequence_are_no_violation() -> None:
    rows = [("L", 1, "start", at(0), None), ("L", 1, "end", at(1), None)]
    rows += [("L", 2, "start", at(2), None), ("L", 2, "end", at(3), None)]
    assert _order_violations(rows) == 0


def test_order__a_delivery_cut_off_by_a_kill_stops_at_the_take_back() -> None:
    # Job 1's worker died in its delivery; its lease was taken back at 5 s.
    rows = [("L", 1, "start", at(0), at(5))]
    assert _order_violations([*rows, ("L", 2, "start", at(6), None)]) == 0
    # The lane's next job started before the take-back: the two overlapped.
    assert _order_violations([*rows, ("L", 2, "start", at(4), None)]) == 1


def test_order__a_start_never_ended_nor_taken_back_still_overlaps() -> None:
    rows = [("L", 1, "start", at(0), None), ("L", 2, "start", at(6), None)]
    assert _order_violations(rows) == 1


def test_order__the_same_job_again_after_its_take_back_is_no_violation() -> None:
    rows = [("L", 1, "start", at(0), at(5)), ("L", 1, "start", at(6), None)]
    rows += [("L", 1, "end", at(7), None), ("L", 2, "start", at(8), None)]
    assert _order_violations(rows) == 0


def test_order__a_lower_sequence_after_a_higher_one_is_a_violation() -> None:
    rows = [("L", 2, "start", at(0), None), ("L", 2, "end", at(1), None)]
    rows += [("L", 1, "start", at(2), None)]
    assert _order_violations(rows) == 1
