"""Coalesced wake-ups (tombstones.wakeups) against a real Redis server and the ORM broker: one
message serves the jobs queued meanwhile, and no job is ever left without a pump to see it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from django_q.tasks import async_task

import tombstones
from tests.factories import CustomerFactory
from tests.jobkit import redis_broker, redis_client
from tombstones.jobs import wakeups
from tombstones.jobs.engine import runner
from tombstones.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def redis_queue(settings: Any) -> Iterator[Any]:
    """This process's wake-ups go to a Redis queue of their own that no cluster reads."""
    client = redis_client()
    settings.TOMBSTONES_Q_OPTIONS = {"cluster": f"wk-{uuid.uuid4().hex[:8]}"}
    name = settings.TOMBSTONES_Q_OPTIONS["cluster"]
    broker = redis_broker(client, name)
    wakeups._brokers[(os.getpid(), name)] = broker
    try:
        yield broker
    finally:
        for suffix in ("", ":tombstones:gate", ":tombstones:helper"):
            client.delete(f"{broker.list_key}{suffix}")
        wakeups._brokers.pop((os.getpid(), name), None)


def _messages(broker: Any) -> int:
    return int(broker.connection.llen(broker.list_key))


def test_gate__one_message_for_many_enqueues_until_a_pump_opens_it(redis_queue: Any) -> None:
    for _ in range(5):
        tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    assert _messages(redis_queue) == 1
    runner.pump()  # the message's pump: opens the gate, runs every due job
    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.SUCCEEDED}
    before = _messages(redis_queue)
    tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    assert _messages(redis_queue) == before + 1  # the gate was open again: a new message


def test_gate__a_job_enqueued_while_the_pump_runs_is_seen_by_its_last_look(
    redis_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An enqueue that finds the gate armed sends nothing: the pump opens the gate and looks
    once more before it stops, and that look sees the job."""
    tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    late: list[Job] = []
    real_claim = runner.ledger.claim

    def enqueue_during_the_look(*args: Any, **kwargs: Any) -> Any:
        found = real_claim(*args, **kwargs)
        if not late:
            late.append(tombstones.enqueue("customers.update_sheet_row", CustomerFactory()))
        return found

    monkeypatch.setattr(runner.ledger, "claim", enqueue_during_the_look)
    monkeypatch.setattr(runner, "cluster_workers", lambda: 1)  # no helper message
    ran = runner.pump()
    assert _messages(redis_queue) == 1  # the late enqueue found the gate armed
    assert late[0].pk in {o.job_id for o in ran}


def test_gate__a_failed_send_opens_it_again(
    redis_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_wake, calls = wakeups.wake, []

    def first_send_fails(reason: int | None = None, **options: Any) -> str | None:
        calls.append(reason)
        return None if len(calls) == 1 else real_wake(reason, **options)

    monkeypatch.setattr(wakeups, "wake", first_send_fails)
    tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    assert len(calls) == 2  # the second enqueue was not silenced by the first one's gate
    assert _messages(redis_queue) == 1


def test_gate__a_redis_error_means_send(redis_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("redis down")

    monkeypatch.setattr(redis_queue.connection, "set", refuse)
    for _ in range(3):
        tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    assert _messages(redis_queue) == 3


def test_helper__one_at_a_time(redis_queue: Any) -> None:
    wakeups.call_helper()
    wakeups.call_helper()
    assert _messages(redis_queue) == 1
    wakeups.helper_arrived()
    wakeups.call_helper()
    assert _messages(redis_queue) == 2


def test_orm__only_a_waiting_wake_up_of_ours_silences_an_enqueue(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}  # the ORM broker of the test settings; no cluster reads
    # Another task waits in the same queue: it will not run a pump.
    async_task("project.stress.cluster.ping")
    tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    funcs = [SignedPackage.loads(row.payload)["func"] for row in OrmQ.objects.order_by("id")]
    assert funcs == ["project.stress.cluster.ping", wakeups.TASK]


def test_gate__a_pump_that_spends_its_budget_hands_the_rest_to_a_new_message(
    redis_queue: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pump's own message armed the gate: its hand-off must send anyway (it used to find the
    gate armed and send nothing, and a backlog waited for the sweep)."""
    settings.TOMBSTONES_WAKE_BUDGET = 2
    monkeypatch.setattr(runner, "cluster_workers", lambda: 1)  # no helper message
    for _ in range(5):
        tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    assert _messages(redis_queue) == 1
    rounds = 0
    while Job.objects.filter(status=Job.Status.QUEUED).exists():
        assert redis_queue.connection.lpop(redis_queue.list_key)  # a worker takes the message
        ran = runner.pump()
        assert len(ran) <= 2
        rounds += 1
        assert rounds <= 3
    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.SUCCEEDED}
