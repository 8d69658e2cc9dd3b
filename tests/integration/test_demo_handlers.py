"""The demo's handlers against real endpoints: the fake CRM served by a live server, email."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import tombstones
from project.customers.models import CrmContact
from tests.factories import CustomerFactory
from tests.jobkit import make_due, run
from tombstones.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def crm(live_server: Any, settings: Any) -> str:
    settings.CRM_URL = f"{live_server.url}/fake-crm/contacts/"
    return str(settings.CRM_URL)


def test_sync_crm__delivers_once_with_the_idempotency_key(crm: str) -> None:
    customer = CustomerFactory()
    job = run(tombstones.enqueue("customers.sync_crm", customer))
    assert job.status == Job.Status.SUCCEEDED
    contact = CrmContact.objects.get()
    assert contact.idempotency_key == job.idempotency_key
    assert (contact.reference, contact.deliveries) == (customer.reference, 1)


def test_sync_crm__timeout_after_sending_is_uncertain_and_not_repeated(crm: str) -> None:
    job = run(
        tombstones.enqueue(
            "customers.sync_crm", CustomerFactory(), params={"crm_delay": 2, "timeout": 0.5}
        )
    )
    assert (job.status, job.reason) == (Job.Status.UNCERTAIN, Job.Reason.OUTCOME_UNKNOWN)
    make_due(job)
    job = run(job)
    assert job.status == Job.Status.UNCERTAIN
    assert job.attempts == 1


def test_sync_crm__refused_connection_is_a_retry(settings: Any) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.CRM_URL = f"http://127.0.0.1:{port}/fake-crm/contacts/"
    job = run(tombstones.enqueue("customers.sync_crm", CustomerFactory()))
    assert (job.status, job.reason) == (Job.Status.RETRY_WAIT, Job.Reason.TRANSIENT)
    assert not CrmContact.objects.exists()


def test_send_welcome__rejected_for_a_deleted_customer_sends_nothing(
    mailoutbox: list[Any], settings: Any
) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {}  # queued in the ORM broker; no worker runs it yet
    customer = CustomerFactory()
    job = tombstones.enqueue("customers.send_welcome", customer)
    customer.delete()
    job = run(job)
    assert (job.status, job.reason) == (Job.Status.REJECTED, Job.Reason.SOURCE_DELETED)
    assert mailoutbox == []
