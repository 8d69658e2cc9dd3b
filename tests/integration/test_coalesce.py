"""Coalesced wake-ups with the Redis broker: the gate, its last look, helpers (a real Redis server).

The messages go to a Redis list no cluster reads, so each test can count them; the pump runs in
this process, as a worker would run it after taking a message.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tombstones
from tests.factories import CustomerFactory
from tests.jobkit import redis_broker, redis_client
from tombstones import batch, coalesce
from tombstones.models import Job

pytestmark = pytest.mark.django_db

HANDLER = "customers.update_sheet_row"


class Queue:
    def __init__(self, client: Any, name: str) -> None:
        self.client, self.name = client, name
        self.broker = redis_broker(client, name)
        self.key = self.broker.list_key

    @property
    def messages(self) -> int:
        return int(self.client.llen(self.key))

    @property
    def gate_armed(self) -> bool:
        return bool(self.client.exists(f"{self.key}:tombstones:gate"))


@pytest.fixture
def queue(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Queue]:
    client = redis_client()
    name = f"test-coalesce-{uuid.uuid4().hex[:10]}"
    settings.TOMBSTONES_COALESCE_WAKES = True
    settings.TOMBSTONES_Q_OPTIONS = {"cluster": name, "sync": False}
    found = Queue(client, name)
    monkeypatch.setitem(coalesce._brokers, (os.getpid(), name), found.broker)
    monkeypatch.setattr(batch, "_pace", None)
    monkeypatch.setattr(batch, "_cluster_workers", lambda: 1)  # tests that need more say so
    try:
        yield found
    finally:
        key = found.key
        client.delete(key, f"{key}:tombstones:gate", f"{key}:tombstones:helper")


@pytest.fixture
def enqueue(django_capture_on_commit_callbacks: Any) -> Callable[[int], list[Job]]:
    """Enqueue internal jobs for new customers, each committed (its on_commit wake-up run)."""

    def make(n: int) -> list[Job]:
        jobs = []
        for _ in range(n):
            with django_capture_on_commit_callbacks(execute=True):
                jobs.append(tombstones.enqueue(HANDLER, CustomerFactory()))
        return jobs

    return make


def _statuses(jobs: list[Job]) -> set[str]:
    return set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True))


def test_gate__the_first_enqueue_sends_a_message_the_others_none(queue: Queue, enqueue: Any):
    enqueue(5)
    assert queue.messages == 1
    assert queue.gate_armed
    assert 0 < queue.client.pttl(f"{queue.key}:tombstones:gate") <= coalesce.GATE_TTL


def test_pump__runs_the_jobs_behind_the_gate_then_opens_it(queue: Queue, enqueue: Any):
    jobs = enqueue(5)
    outcomes = batch.pump()
    assert sorted(o.job_id for o in outcomes) == sorted(j.pk for j in jobs)
    assert _statuses(jobs) == {Job.Status.SUCCEEDED}
    assert not queue.gate_armed
    enqueue(1)
    assert queue.messages == 2  # the gate was open: this enqueue sent its own


def test_pump__looks_again_after_opening_the_gate(
    queue: Queue, enqueue: Any, monkeypatch: pytest.MonkeyPatch
):
    enqueue(2)
    late: list[Job] = []
    real_open = coalesce.open_gate

    def open_after_a_late_enqueue() -> bool:
        # The race: a job commits while the pump is between "nothing due" and opening the gate.
        # Its enqueue finds the gate armed and sends nothing; only the last look can see it.
        if not late:
            late.extend(enqueue(1))
        return real_open()

    monkeypatch.setattr(coalesce, "open_gate", open_after_a_late_enqueue)
    outcomes = batch.pump()
    assert queue.messages == 1
    assert late[0].pk in {o.job_id for o in outcomes}
    assert _statuses(late) == {Job.Status.SUCCEEDED}


def test_pump__calls_one_helper_while_it_leaves_heads_to_others(
    queue: Queue, enqueue: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
):
    settings.TOMBSTONES_BATCH_SIZE = 2
    monkeypatch.setattr(batch, "_cluster_workers", lambda: 2)
    monkeypatch.setattr(batch, "FAST_JOB_SECONDS", 0.0)  # every handler counts as slow: spread
    jobs = enqueue(8)
    assert queue.messages == 1
    batch.pump()
    assert _statuses(jobs) == {Job.Status.SUCCEEDED}
    # Heads were left to another worker in several batches, but one helper message was pending.
    assert queue.messages == 2
    assert queue.client.exists(f"{queue.key}:tombstones:helper")
    coalesce.helper_arrived()
    assert not queue.client.exists(f"{queue.key}:tombstones:helper")


def test_pump__fast_handlers_take_every_due_head_in_one_batch(
    queue: Queue, enqueue: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
):
    settings.TOMBSTONES_BATCH_SIZE = 20
    monkeypatch.setattr(batch, "_cluster_workers", lambda: 4)
    monkeypatch.setattr(batch, "_pace", 0.001)
    jobs = enqueue(12)
    batch.pump()
    tokens = set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("owner", "attempts"))
    assert _statuses(jobs) == {Job.Status.SUCCEEDED}
    assert len(tokens) == 1
    assert queue.messages == 1  # nothing left to others: no helper


def test_gate__a_failed_send_leaves_the_gate_open(
    queue: Queue, enqueue: Any, monkeypatch: pytest.MonkeyPatch
):
    import django_q.tasks

    real = django_q.tasks.async_task

    def broker_down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("broker down")

    monkeypatch.setattr(django_q.tasks, "async_task", broker_down)
    enqueue(1)  # its wake-up is lost (the sweep re-dispatches the job) ...
    assert queue.messages == 0
    assert not queue.gate_armed
    monkeypatch.setattr(django_q.tasks, "async_task", real)
    enqueue(1)  # ... and the next enqueue is not silenced by a gate nobody will open
    assert queue.messages == 1


def test_gate__a_broker_error_means_send(settings: Any, monkeypatch: pytest.MonkeyPatch):
    import redis

    name = f"test-coalesce-down-{uuid.uuid4().hex[:6]}"
    settings.TOMBSTONES_Q_OPTIONS = {"cluster": name}
    down = redis_broker(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2), name)
    monkeypatch.setitem(coalesce._brokers, (os.getpid(), name), down)
    assert coalesce.arm() is True
    assert coalesce.call_helper() is True
    assert coalesce.open_gate() is True  # and it still looks once more


def test_orm_broker__a_waiting_message_serves_the_next_enqueues(
    settings: Any, enqueue: Any, monkeypatch: pytest.MonkeyPatch
):
    from django_q.conf import Conf
    from django_q.models import OrmQ

    if not Conf.ORM:
        pytest.skip("the suite runs on the Redis broker (REDIS_URL)")
    name = f"test-coalesce-orm-{uuid.uuid4().hex[:6]}"
    settings.TOMBSTONES_COALESCE_WAKES = True
    settings.TOMBSTONES_Q_OPTIONS = {"cluster": name, "sync": False}
    monkeypatch.setattr(batch, "_cluster_workers", lambda: 1)
    jobs = enqueue(3)
    assert OrmQ.objects.filter(key=name).count() == 1  # no gate: the waiting message is the test
    outcomes = batch.pump()  # what the cluster does when it takes that message
    assert sorted(o.job_id for o in outcomes) == sorted(j.pk for j in jobs)
    OrmQ.objects.filter(key=name).delete()  # acknowledged
    enqueue(1)
    assert OrmQ.objects.filter(key=name).count() == 1  # nothing waiting: a message again
