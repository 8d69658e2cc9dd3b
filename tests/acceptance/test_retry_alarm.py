"""A retry is woken when its backoff ends, by the worker that parked it (a real qcluster).

No sweep runs here, and nothing else sends a message for a job in retry_wait: without the
worker's alarm the retried jobs would stay in retry_wait and the test would time out.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django_q.models import Schedule

from tombstones.jobs import enqueue as dispatch
from tombstones.models import Job, JobEvent

from .helpers_cluster import Cluster, entity, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

BACKOFF = 1.0  # seconds: the cluster's TOMBSTONES_RETRY_BACKOFF (cluster_settings)


def test_retry_alarm__a_retry_runs_once_its_backoff_ends_without_the_sweep(
    settings: Any,
) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}
    Schedule.objects.all().delete()  # no sweep
    env = {"TOMBSTONES_RETRY_BACKOFF_SECONDS": str(BACKOFF)}
    cluster = Cluster(2, settings_module="tests.acceptance.cluster_settings", env=env)
    with cluster, cluster.messages():
        # Before the first enqueue: the running cluster parks a flaky job as soon as it commits,
        # so a later start missed the first backoff's beginning on a loaded machine (0.7 s).
        started = time.monotonic()
        flaky = [
            dispatch.enqueue("stress.apply", entity(f"F{i}"), params={"transient_attempts": 1})
            for i in range(3)
        ]
        steady = [dispatch.enqueue("stress.apply", entity(f"S{i}")) for i in range(3)]
        wait_for(lambda: not Job.objects.filter(status__in=Job.UNFINISHED).exists(), 30)
        took = time.monotonic() - started
    jobs = {job.pk: job for job in Job.objects.all()}
    assert {jobs[j.pk].status for j in flaky + steady} == {Job.Status.SUCCEEDED}
    assert [jobs[j.pk].attempts for j in flaky] == [2, 2, 2]
    assert [jobs[j.pk].attempts for j in steady] == [1, 1, 1]
    retried = JobEvent.objects.filter(event=JobEvent.Event.RETRY, reason=Job.Reason.TRANSIENT)
    assert retried.count() == 3
    for event in retried:  # each retry ran its backoff after it was parked (database clock)
        waited = jobs[event.job_id].finished_at - event.created_at
        assert waited.total_seconds() >= BACKOFF, (event.job_id, waited)
    print(f"3 retries with a {BACKOFF}s backoff done in {took:.1f}s")
    assert took >= BACKOFF
