"""Named queues on real clusters (issue 36): a qcluster serves the queues routed to it only, and
a cluster started with ``Q_CLUSTER_NAME`` for a queue runs that queue's jobs, woken by the
messages its enqueues sent before it started. One record's jobs in two queues are two lanes.
PostgreSQL + Redis, or SQLite + the ORM broker."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from django.db import transaction
from django.test import override_settings

from project.stress.cluster import Cluster
from tombstones.jobs import wakeups
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job

from .helpers_cluster import broker_cluster, entity, finished, is_postgres, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

Status = Job.Status


def _broker(name: str) -> object:
    """This process's broker for the cluster ``name`` (Redis with PostgreSQL, as the
    clusters' own; django-q2's ORM broker on SQLite)."""
    if is_postgres():
        from tests.jobkit import redis_broker, redis_client

        found = redis_broker(redis_client(), name)
    else:
        from django_q.brokers import get_broker

        found = get_broker(name)
    wakeups._brokers[(os.getpid(), name)] = found
    return found


def test_queues_cluster__a_cluster_runs_the_queues_routed_to_it_only() -> None:
    reports = f"rep-{uuid.uuid4().hex[:8]}"  # the django-q2 cluster of the queue "reports"
    routes = {"reports": reports}
    record = entity("Q1")
    with (
        override_settings(TOMBSTONES_QUEUES=routes),
        broker_cluster(1, TOMBSTONES_QUEUES_JSON=json.dumps(routes)) as home,
    ):
        broker = _broker(reports)
        # The record's job in "reports" first, then one in "default": two lanes of one record.
        with transaction.atomic():
            waiting = enqueue("stress.count", record, params={"how": "f"}, queue="reports")
        with transaction.atomic():
            ran = enqueue("stress.count", record, params={"how": "f"})
        wait_for(lambda: finished(ran), timeout=60)
        # The home cluster's claim took its own queue's job, never the older one of "reports".
        waiting.refresh_from_db()
        assert (waiting.status, waiting.attempts, waiting.owner) == (Status.QUEUED, 0, "")
        assert waiting.lane == f"queue:reports/{ran.lane}"

        other = Cluster(
            1,
            name=home.name,  # the same site (its signing salt), another cluster name
            settings_module="tests.acceptance.cluster_settings",
            env={**home.extra_env, "Q_CLUSTER_NAME": reports},
            broker=broker,
        )
        with other:
            # Woken by the message its enqueue sent to "rep-..." before the cluster started.
            wait_for(lambda: finished(waiting), timeout=60)
            with transaction.atomic():
                later = [
                    enqueue("stress.count", record, params={"how": "f"}, queue="reports"),
                    enqueue("stress.count", record, params={"how": "f"}),
                ]
            wait_for(lambda: finished(*later), timeout=60)
    rows = {job.pk: job for job in Job.objects.filter(pk__in=[ran.pk, waiting.pk])}
    assert {job.status for job in rows.values()} == {Status.SUCCEEDED}
    assert rows[waiting.pk].owner != rows[ran.pk].owner  # two clusters' workers
    record.refresh_from_db()
    assert record.counter == 4
