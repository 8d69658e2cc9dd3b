"""The retry alarms of a worker process (tombstones.alarms): due order, never early, bounded."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from tombstones import alarms


class Rung:
    """The wake-up an alarm sends, recorded with its time."""

    def __init__(self, expected: int) -> None:
        self.calls: list[tuple[int, float]] = []
        self.expected = expected
        self.all_rung = threading.Event()

    def __call__(self, job_id: int) -> None:
        self.calls.append((job_id, time.monotonic()))
        if len(self.calls) == self.expected:
            self.all_rung.set()


def test_alarms__ring_in_due_order_and_never_before_due() -> None:
    rung = Rung(expected=3)
    pending = alarms.Alarms(rung)
    start = time.monotonic()
    delays = {1: 0.4, 2: 0.2, 3: 0.0}
    for job_id, delay in delays.items():
        assert pending.add(job_id, timedelta(seconds=delay))
    assert rung.all_rung.wait(5)
    assert [job_id for job_id, _ in rung.calls] == [3, 2, 1]
    for job_id, at in rung.calls:
        assert at - start >= delays[job_id] + alarms.LATE
    assert pending.pending() == 0


def test_alarms__an_earlier_alarm_added_later_rings_first() -> None:
    rung = Rung(expected=2)
    pending = alarms.Alarms(rung)
    start = time.monotonic()
    pending.add(1, timedelta(seconds=1))
    time.sleep(0.05)  # the ringing thread is now asleep until the first alarm
    pending.add(2, timedelta(seconds=0))
    assert rung.all_rung.wait(5)
    assert [job_id for job_id, _ in rung.calls] == [2, 1]
    # Woken by the new alarm, not at the end of its sleep for the first one.
    assert rung.calls[0][1] - start < 1


def test_alarms__bounded_the_rest_is_the_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alarms, "MAX_PENDING", 2)
    pending = alarms.Alarms(Rung(expected=99))
    assert pending.add(1, timedelta(hours=1))
    assert pending.add(2, timedelta(hours=1))
    assert not pending.add(3, timedelta(hours=1))
    assert pending.pending() == 2


def test_alarms__a_wake_that_raises_does_not_stop_the_others() -> None:
    rung = Rung(expected=1)

    def wake(job_id: int) -> None:
        if job_id == 1:
            raise RuntimeError("broker down")
        rung(job_id)

    pending = alarms.Alarms(wake)
    pending.add(1, timedelta(0))
    pending.add(2, timedelta(seconds=0.1))
    assert rung.all_rung.wait(5)
    assert [job_id for job_id, _ in rung.calls] == [2]


def test_alarms__not_set_outside_a_cluster_worker(settings: Any) -> None:
    # The test process was not started by a django-q2 cluster: a late wake-up would land in
    # whatever test runs next.
    settings.TOMBSTONES_Q_OPTIONS = {}
    assert not alarms.wake_when_due(1, timedelta(0))
    assert alarms._alarms == {}
