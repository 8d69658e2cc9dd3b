"""When the lease keeper renews and watches (tombstones.jobs.engine.keeper): a third of a lease
after the claim and every third after that; a claim that ends sooner costs no renewal; a claim
held past ``WATCH_SECONDS`` is watched once (its jobs not started given back, help called).

No thread and no sleep: the keeper's loop runs in the test on a clock the test moves. Its
condition's ``wait`` advances the clock by the timeout the loop asked for, applies the test's
script (claims that end), and stops the loop at the end of the story.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from tombstones.jobs.engine import keeper as keeper_module
from tombstones.jobs.engine.keeper import WATCH_SECONDS, LeaseKeeper

LEASE = 30.0  # seconds: a renewal every 10


class StoryOver(Exception):
    """The clock reached the end of the test's story."""


@dataclass
class FakeClaim:
    token: str
    using: str = "default"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Story:
    """The keeper's condition and clock: ``wait`` moves time on instead of sleeping."""

    def __init__(self, clock: Clock, until: float) -> None:
        self.clock = clock
        self.until = clock.now + until
        self.script: list[tuple[float, Callable[[], None]]] = []
        self.waits: list[float | None] = []

    def at(self, seconds: float, action: Callable[[], None]) -> None:
        self.script.append((self.clock.now + seconds, action))
        self.script.sort(key=lambda step: step[0])

    def __enter__(self) -> Story:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def notify(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        wake = self.until if timeout is None else min(self.clock.now + timeout, self.until)
        while self.script and self.script[0][0] <= wake:
            at, action = self.script.pop(0)
            self.clock.now = at
            action()  # a claim ends: the keeper's thread would be notified
            return True
        if self.clock.now >= self.until or (timeout is None and not self.script):
            raise StoryOver
        self.clock.now = wake
        return False


class Recorder:
    def __init__(self, clock: Clock, start: float) -> None:
        self.clock, self.start = clock, start
        self.renewed: list[tuple[float, list[str]]] = []
        self.given_back: list[tuple[float, str]] = []
        self.helped: list[tuple[float, str]] = []
        self.help_again: list[float | None] = []

    def _t(self) -> float:
        return round(self.clock.now - self.start, 6)

    def renew(self, held: dict[str, str]) -> None:
        self.renewed.append((self._t(), sorted(held)))

    def give_back(self, claim: Any) -> None:
        self.given_back.append((self._t(), claim.token))

    def call_help(self, db: str) -> float | None:
        self.helped.append((self._t(), db))
        return self.help_again.pop(0) if self.help_again else None


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Clock:
    settings.TOMBSTONES_LEASE = timedelta(seconds=LEASE)
    fake = Clock()
    monkeypatch.setattr(keeper_module, "time", fake)
    return fake


def _keeper(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, until: float
) -> tuple[LeaseKeeper, Story, Recorder]:
    keeper = LeaseKeeper()
    story, seen = Story(clock, until), Recorder(clock, clock.now)
    keeper._changed = story  # type: ignore[assignment]
    keeper._thread = threading.Thread(target=lambda: None)  # its loop runs in the test instead
    monkeypatch.setattr(keeper, "renew", seen.renew)
    monkeypatch.setattr(keeper, "give_back", seen.give_back)
    monkeypatch.setattr(keeper, "call_help", seen.call_help)
    return keeper, story, seen


def _run(keeper: LeaseKeeper) -> None:
    with pytest.raises(StoryOver):
        keeper._renew_forever()


class Held:
    """One claim's ``keeper.keeping()``, entered and left at moments of the story."""

    def __init__(self, keeper: LeaseKeeper, claim: FakeClaim) -> None:
        self.context = keeper.keeping(claim)  # type: ignore[arg-type]

    def take(self) -> None:
        self.context.__enter__()

    def end(self) -> None:
        self.context.__exit__(None, None, None)


def test_keeper__renews_every_third_of_a_lease_while_the_claim_is_held(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    keeper, _, seen = _keeper(monkeypatch, clock, until=35)
    with keeper.keeping(FakeClaim("a")):  # type: ignore[arg-type]
        assert keeper.kept() == 1
        _run(keeper)
    assert seen.renewed == [(10.0, ["a"]), (20.0, ["a"]), (30.0, ["a"])]
    assert keeper.kept() == 0


def test_keeper__a_claim_that_ends_within_a_third_costs_no_renewal_and_no_watch(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    keeper, story, seen = _keeper(monkeypatch, clock, until=60)
    held = Held(keeper, FakeClaim("a"))
    held.take()
    story.at(WATCH_SECONDS / 2, held.end)
    _run(keeper)
    assert keeper.kept() == 0
    assert seen.renewed == []
    assert seen.given_back == []
    assert seen.helped == []
    # Nothing held: the loop sleeps until a claim comes (no timeout), it does not poll.
    assert story.waits[-1] is None


def test_keeper__a_claim_held_past_the_watch_is_handed_over_once(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    keeper, _, seen = _keeper(monkeypatch, clock, until=25)
    with keeper.keeping(FakeClaim("a", using="other")):  # type: ignore[arg-type]
        _run(keeper)
    assert seen.given_back == [(WATCH_SECONDS, "a")]
    assert seen.helped == [(WATCH_SECONDS, "other")]
    assert [t for t, _ in seen.renewed] == [10.0, 20.0]  # the watch moves no renewal


def test_keeper__a_job_due_too_briefly_is_looked_at_again_when_it_is_not(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    keeper, _, seen = _keeper(monkeypatch, clock, until=5)
    seen.help_again = [0.3]  # call_help: a job has been due 0.2 s, look again in 0.3 s
    with keeper.keeping(FakeClaim("a")):  # type: ignore[arg-type]
        _run(keeper)
    assert [t for t, _ in seen.helped] == [WATCH_SECONDS, WATCH_SECONDS + 0.3]
    assert [t for t, _ in seen.given_back] == [WATCH_SECONDS, WATCH_SECONDS + 0.3]


def test_keeper__each_claim_keeps_its_own_schedule(
    monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    keeper, story, seen = _keeper(monkeypatch, clock, until=26)
    first, second = Held(keeper, FakeClaim("a")), Held(keeper, FakeClaim("b"))
    first.take()
    story.at(4, second.take)
    story.at(22, first.end)
    _run(keeper)
    assert keeper.kept() == 1
    assert seen.renewed == [(10.0, ["a"]), (14.0, ["b"]), (20.0, ["a"]), (24.0, ["b"])]
    assert seen.given_back == [(WATCH_SECONDS, "a"), (4 + WATCH_SECONDS, "b")]


def test_keeper__the_period_follows_the_lease_setting(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, settings: Any
) -> None:
    settings.TOMBSTONES_LEASE = timedelta(seconds=3)
    keeper, _, seen = _keeper(monkeypatch, clock, until=3.5)
    with keeper.keeping(FakeClaim("a")):  # type: ignore[arg-type]
        _run(keeper)
    assert [t for t, _ in seen.renewed] == [1.0, 2.0, 3.0]
