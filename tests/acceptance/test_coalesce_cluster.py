"""Coalesced wake-ups through a real qcluster on the Redis broker: few messages, no job left behind,
lanes in order. No sweep runs, so a job whose wake-up was wrongly skipped would stay queued."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django_q.models import Schedule

from tests.jobkit import redis_broker, redis_client, redis_url
from tombstones import coalesce, dispatch
from tombstones.models import Job

from .helpers_cluster import Cluster, assert_lane_order, entity, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


def test_coalesced_cluster__runs_every_job_in_lane_order_with_few_messages(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis_client()
    settings.TOMBSTONES_Q_OPTIONS = {}
    settings.TOMBSTONES_COALESCE_WAKES = True
    Schedule.objects.all().delete()  # no sweep: only wake-ups can run the jobs
    env = {"REDIS_URL": redis_url(), "TOMBSTONES_COALESCE_WAKES": "1"}
    sent: list[int] = []
    real_wake = dispatch.wake

    def counted(job_id: int) -> str | None:
        sent.append(job_id)
        return real_wake(job_id)

    monkeypatch.setattr(dispatch, "wake", counted)
    cluster = Cluster(2, settings_module="tests.acceptance.cluster_settings", env=env)
    broker = redis_broker(client, cluster.name)
    cluster.broker = broker
    monkeypatch.setitem(coalesce._brokers, (os.getpid(), cluster.name), broker)
    try:
        with cluster, cluster.messages():
            lanes = [entity(f"K{i}") for i in range(4)]
            jobs = []
            for burst in range(3):
                for record in lanes:  # bursts of one lane after another, as a busy site would
                    jobs += [dispatch.enqueue("stress.apply", record) for _ in range(5)]
                jobs += [
                    dispatch.enqueue("stress.apply", entity(f"S{burst}-{i}")) for i in range(20)
                ]
            wait_for(lambda: not Job.objects.filter(status__in=Job.UNFINISHED).exists(), timeout=60)
    finally:
        client.delete(broker.list_key, f"{broker.list_key}:tombstones:gate")
        client.delete(f"{broker.list_key}:tombstones:helper")
    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.SUCCEEDED}
    assert len(jobs) == 120
    assert_lane_order(lanes, jobs)
    # The enqueuer sent a message only when it armed the gate: far fewer than one per job.
    print(f"{len(sent)} messages from the enqueuer for {len(jobs)} jobs")
    assert 1 <= len(sent) < len(jobs) / 3, f"{len(sent)} messages for {len(jobs)} jobs"
    assert Job.objects.filter(attempts__gt=1).count() == 0
