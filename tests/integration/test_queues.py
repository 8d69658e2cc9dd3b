"""Named queues (issue 36): a job's queue is its lane's, a worker claims from the queues it
serves only, however deep another queue's backlog, priorities order due lanes across the queues
a worker serves, and each queue's wake-ups go to the django-q2 cluster that serves it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction

import tombstones
from tests.factories import CustomerFactory
from tests.jobkit import redis_broker, redis_client, temp_handler
from tombstones.conf import tombstone_settings
from tombstones.exceptions import InvalidOrderingKey, UnknownQueue
from tombstones.jobs import ledger, queues, wakeups
from tombstones.jobs.engine import sweep as sweep_module
from tombstones.models import Job

Status = Job.Status
QUEUES = {"emails": None, "reports": "reports-cluster"}


def _touch(ctx: Any) -> None:
    ctx.update(phone=f"+{ctx.job.pk}")


@pytest.fixture
def named(db: None, settings: Any) -> Iterator[None]:
    """Two named queues beside "default"; nothing runs until the test claims."""
    settings.TOMBSTONES_Q_OPTIONS = {}
    settings.TOMBSTONES_QUEUES = QUEUES
    with temp_handler("t.touch", _touch), temp_handler("t.plain", _touch, plain=True):
        yield


def _taken(claim: ledger.Claim | None) -> list[int]:
    return [] if claim is None else sorted(j.pk for j in claim.jobs)


def _finish(claim: ledger.Claim | None) -> None:
    assert claim is not None
    Job.objects.filter(pk__in=[j.pk for j in claim.jobs]).update(
        status=Status.SUCCEEDED, claim_token="", ready_at=None
    )


# --- the queue of a job -----------------------------------------------------------------------


def test_queues__a_job_in_a_named_queue_has_that_queue_and_its_own_lane(named: None) -> None:
    customer = CustomerFactory()
    plain = tombstones.enqueue("t.touch", customer)
    mail = tombstones.enqueue("t.touch", customer, queue="emails")
    keyed = tombstones.enqueue("t.touch", customer, queue="emails", ordering_key="account:9")
    many = tombstones.enqueue_many("t.touch", [customer], queue="reports")
    alone = tombstones.enqueue_plain("t.plain", queue="emails")
    rows = {j.pk: (j.queue, j.lane) for j in Job.objects.all()}
    label = f"customers.customer:{customer.pk}"
    assert rows[plain.pk] == ("default", label)
    assert rows[mail.pk] == ("emails", f"queue:emails/{label}")
    assert rows[keyed.pk] == ("emails", "queue:emails/account:9")
    assert rows[many[0].pk] == ("reports", f"queue:reports/{label}")
    assert rows[alone.pk][0] == "emails"
    assert rows[alone.pk][1].startswith("plain:")


def test_queues__an_unknown_queue_is_refused_before_any_sql(named: None) -> None:
    customer = CustomerFactory()
    with transaction.atomic():
        for call in (
            lambda: tombstones.enqueue("t.touch", customer, queue="emials"),
            lambda: tombstones.enqueue_many("t.touch", [customer], queue="emials"),
            lambda: tombstones.enqueue_plain("t.plain", queue="emials"),
            lambda: tombstones.enqueue("t.touch", customer, queue=3),  # type: ignore[arg-type]
        ):
            with pytest.raises(UnknownQueue, match="'default', 'emails', 'reports'"):
                call()
        assert Job.objects.count() == 0  # and the transaction is still usable
    assert issubclass(UnknownQueue, ValueError)


def test_queues__an_ordering_key_cannot_name_a_queues_lane(named: None) -> None:
    customer = CustomerFactory()
    with pytest.raises(InvalidOrderingKey, match="'queue:'"):
        tombstones.enqueue("t.touch", customer, ordering_key="queue:emails/x")
    # A key that fits the lane's column alone, too long with the queue before it.
    with pytest.raises(InvalidOrderingKey, match="In queue 'emails' an ordering key has at most"):
        tombstones.enqueue("t.touch", customer, queue="emails", ordering_key="k" * 250)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "value",
    [[], {"a/b": None}, {"": None}, {"emails": ""}, {"emails": 3}, {"x" * 65: None}],
)
def test_queues__a_malformed_setting_names_itself(settings: Any, value: Any) -> None:
    settings.TOMBSTONES_QUEUES = value
    with pytest.raises(ImproperlyConfigured, match="TOMBSTONES_QUEUES"):
        tombstone_settings.QUEUES  # noqa: B018
    assert any("TOMBSTONES_QUEUES" in message for message in tombstone_settings.validate())


# --- claims -----------------------------------------------------------------------------------


def test_queues__a_worker_claims_from_its_queues_only(named: None) -> None:
    customers = CustomerFactory.create_batch(3)
    default = [tombstones.enqueue("t.touch", c).pk for c in customers]
    mail = [tombstones.enqueue("t.touch", c, queue="emails").pk for c in customers]
    assert _taken(ledger.claim(10, queues=("emails",))) == sorted(mail)
    assert ledger.claim(10, queues=("reports",)) is None
    assert _taken(ledger.claim(10, queues=("default",))) == sorted(default)


def test_queues__a_backlog_in_one_queue_does_not_hide_anothers_job(named: None) -> None:
    """The defect the per-queue scan prevents: a worker of one queue reading through another
    queue's due hints (a bounded scan of them all) finds none of its own."""
    backlog = [tombstones.enqueue("t.touch", c).pk for c in CustomerFactory.create_batch(300)]
    mail = tombstones.enqueue("t.touch", CustomerFactory(), queue="emails")
    for workers in (1, 4):
        claim = ledger.claim(1, workers=workers, queues=("emails",))
        assert _taken(claim) == [mail.pk]
        Job.objects.filter(pk=mail.pk).update(
            status=Status.QUEUED, claim_token="", attempts=0, ready_at=mail.ready_at
        )
    assert Job.objects.filter(pk__in=backlog, status=Status.QUEUED).count() == 300


def test_queues__one_records_jobs_in_two_queues_are_two_lanes(named: None) -> None:
    """A lane never spans queues: a default-queue job of the record running holds its default
    lane only; the record's job in "emails" is a head of its own lane."""
    customer = CustomerFactory()
    first = tombstones.enqueue("t.touch", customer)
    behind = tombstones.enqueue("t.touch", customer)
    mail = tombstones.enqueue("t.touch", customer, queue="emails")
    assert _taken(ledger.claim(1, queues=("default",))) == [first.pk]  # first runs: holds
    assert ledger.claim(5, queues=("default",)) is None  # behind waits for it
    assert _taken(ledger.claim(5, queues=("emails",))) == [mail.pk]
    assert Job.objects.get(pk=behind.pk).status == Status.QUEUED


def test_queues__priorities_order_due_lanes_across_the_queues_served(named: None) -> None:
    early = tombstones.enqueue("t.touch", CustomerFactory())
    low = tombstones.enqueue("t.touch", CustomerFactory(), queue="emails", priority=5)
    high = tombstones.enqueue("t.touch", CustomerFactory(), queue="reports", priority=50)
    served = ("default", "emails", "reports")
    order = []
    for _ in range(3):
        claim = ledger.claim(1, queues=served)
        order += _taken(claim)
        _finish(claim)
    assert order == [high.pk, low.pk, early.pk]


def test_queues__the_hints_of_a_queue_are_one_index_range_each(named: None) -> None:
    """The scan of a worker serving two queues: one statement, a range of the hint index per
    queue (never a read of the queues it does not serve)."""
    from django.test.utils import CaptureQueriesContext

    for queue in ("default", "emails", "reports"):
        tombstones.enqueue("t.touch", CustomerFactory(), queue=queue)
    with CaptureQueriesContext(connection) as captured:
        claim = ledger.claim(5, queues=("default", "emails"))
    assert len(_taken(claim)) == 2
    scans = [q["sql"] for q in captured.captured_queries if "UNION ALL" in q["sql"]]
    scans = [sql for sql in scans if '"queue"' in sql and "ready_at" in sql]
    assert len(scans) == 1, scans
    assert "'reports'" not in scans[0]
    assert Job.objects.filter(queue="reports", status=Status.QUEUED).count() == 1


def test_queues__the_sweep_wakes_each_cluster_with_a_due_queue(
    named: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    woken: list[tuple[int, str | None]] = []
    monkeypatch.setattr(
        sweep_module, "wake_soon", lambda job_id, cluster=None: woken.append((job_id, cluster))
    )
    monkeypatch.setattr("tombstones.jobs.enqueue.wake_soon", lambda *a, **k: None)
    mail = tombstones.enqueue("t.touch", CustomerFactory(), queue="emails")
    report = tombstones.enqueue("t.touch", CustomerFactory(), queue="reports")
    assert sweep_module.sweep()["dispatched"] == 2
    # "emails" names no cluster: the home one; "reports" its own.
    assert sorted(woken, key=str) == sorted(
        [(mail.pk, queues.home_cluster()), (report.pk, "reports-cluster")], key=str
    )


# --- wake-ups ---------------------------------------------------------------------------------


@pytest.fixture
def two_lists(transactional_db: None, settings: Any) -> Iterator[tuple[Any, Any]]:
    """Redis lists of two clusters that no cluster reads: the home one and "reports"'."""
    client = redis_client()
    home, other = (f"wk-{uuid.uuid4().hex[:8]}" for _ in range(2))
    settings.TOMBSTONES_Q_OPTIONS = {"cluster": home}
    settings.TOMBSTONES_QUEUES = {"emails": None, "reports": other}
    brokers = (redis_broker(client, home), redis_broker(client, other))
    for name, broker in zip((home, other), brokers, strict=True):
        wakeups._brokers[(os.getpid(), name)] = broker
    try:
        with temp_handler("t.touch", _touch):
            yield brokers
    finally:
        for name, broker in zip((home, other), brokers, strict=True):
            for suffix in ("", ":tombstones:gate", ":tombstones:helper"):
                client.delete(f"{broker.list_key}{suffix}")
            wakeups._brokers.pop((os.getpid(), name), None)


def test_queues__a_wake_up_goes_to_the_cluster_serving_the_queue(
    two_lists: tuple[Any, Any],
) -> None:
    home, reports = two_lists
    with transaction.atomic():
        tombstones.enqueue("t.touch", CustomerFactory(), queue="emails")
        tombstones.enqueue("t.touch", CustomerFactory(), queue="reports")
        tombstones.enqueue("t.touch", CustomerFactory())
    # One message per cluster for the transaction's jobs, each gate of its own.
    assert (home.queue_size(), reports.queue_size()) == (1, 1)
    tombstones.enqueue("t.touch", CustomerFactory(), queue="reports")  # its gate is armed
    assert (home.queue_size(), reports.queue_size()) == (1, 1)


def test_queues__a_cluster_worker_serves_the_queues_routed_to_it(
    named: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_q.conf import Conf

    monkeypatch.setattr(queues, "in_cluster_worker", lambda: True)
    monkeypatch.setattr(Conf, "CLUSTER_NAME", "reports-cluster")
    assert queues.served() == ("reports",)
    monkeypatch.setattr(Conf, "CLUSTER_NAME", queues.home_cluster())
    assert queues.served() == ("default", "emails")
    monkeypatch.setattr(queues, "in_cluster_worker", lambda: False)
    assert queues.served() == ("default", "emails", "reports")  # a test, a command, sync mode


def test_queues__the_job_page_shows_the_queue(named: None, admin_client: Any) -> None:
    from django.urls import reverse

    job = tombstones.enqueue("t.touch", CustomerFactory(), queue="emails")
    page = admin_client.get(reverse("admin:tombstones_job_change", args=[job.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Queue:" in text
    assert '<div class="readonly">emails</div>' in text
