"""The timers of a worker process (tombstones.alarms): due order, never early, one per moment,
bounded, robust; not set outside a cluster worker."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from tombstones.jobs.engine import alarms, runner


class Rung:
    """The ticks an alarm rings, recorded with their time."""

    def __init__(self, expected: int, fail_first: bool = False) -> None:
        self.calls: list[float] = []
        self.after_failure: list[bool] = []
        self.expected = expected
        self.fail_first = fail_first
        self.all_rung = threading.Event()

    def __call__(self, after_failure: bool = False) -> None:
        self.calls.append(time.monotonic())
        self.after_failure.append(after_failure)
        if self.fail_first and len(self.calls) == 1:
            raise RuntimeError("broker down")
        if len(self.calls) == self.expected:
            self.all_rung.set()


def test_alarms__ring_at_their_moment_and_never_before() -> None:
    rung = Rung(expected=1)
    pending = alarms.Alarms(rung)
    start = time.monotonic()
    assert pending.add(timedelta(seconds=0.3))
    assert rung.all_rung.wait(5)
    assert rung.calls[0] - start >= 0.3 + alarms.LATE
    assert pending.pending() == 0


def test_alarms__a_later_moment_waits_for_the_earlier_tick_to_arm_it() -> None:
    """One alarm per moment: a tick arms the next moment the ledger knows of, so a later alarm
    is not needed while an earlier one is pending."""
    pending = alarms.Alarms(Rung(expected=99))
    assert pending.add(timedelta(seconds=5))
    assert not pending.add(timedelta(seconds=9))
    assert pending.pending() == 1


class WatchedCondition(threading.Condition):
    """A condition that says when a thread starts waiting on it, and for how long at most."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        self.waiting.set()
        return super().wait(timeout)


def test_alarms__an_earlier_alarm_added_later_rings_first() -> None:
    rung = Rung(expected=1)
    pending = alarms.Alarms(rung)
    watched = pending._changed = WatchedCondition()
    start = time.monotonic()
    pending.add(timedelta(seconds=2))
    # The ringing thread is asleep until the first alarm (not guessed: it said so).
    assert watched.waiting.wait(5)
    with watched:
        assert watched.timeouts[-1] is not None
        assert watched.timeouts[-1] > 1.5
    assert pending.add(timedelta(seconds=0))
    assert rung.all_rung.wait(5)
    # Woken by the new alarm, not at the end of its sleep for the first one.
    assert rung.calls[0] - start < 1


def test_alarms__bounded_the_rest_is_the_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alarms, "MAX_PENDING", 2)
    pending = alarms.Alarms(Rung(expected=99))
    assert pending.add(timedelta(hours=2))
    assert pending.add(timedelta(hours=1))
    assert not pending.add(timedelta(minutes=1))
    assert pending.pending() == 2


def test_alarms__a_tick_that_raises_rings_again_a_second_later_and_says_so() -> None:
    """A tick lost to an outage is not the sweep's to repair: the alarm rings again by itself
    (AGAIN later), and that tick knows the one before failed (it wakes regardless of the gate)."""
    rung = Rung(expected=2, fail_first=True)
    pending = alarms.Alarms(rung)
    pending.add(timedelta(0))
    assert rung.all_rung.wait(5)
    assert len(rung.calls) == 2
    again = rung.calls[1] - rung.calls[0]
    assert alarms.AGAIN.total_seconds() <= again < alarms.AGAIN.total_seconds() + 0.5
    assert rung.after_failure == [False, True]


def test_alarms__not_set_outside_a_cluster_worker(settings: Any) -> None:
    # The test process was not started by a django-q2 cluster: a late wake-up would land in
    # whatever test runs next.
    settings.TOMBSTONES_Q_OPTIONS = {}
    process = runner.WorkerProcess()
    assert not process.alarms.ring_in(timedelta(0))
    assert not process.alarms.arm_next()
    process.start()
    assert process.alarms.pending() == 0
    runner.on_worker_start()
    assert runner.current().alarms.pending() == 0
