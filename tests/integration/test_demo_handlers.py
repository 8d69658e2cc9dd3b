"""The demo's handlers against real endpoints: the fake CRM served by a live server, email,
and the erasure a delete queues."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.mail import EmailMessage
from django.core.mail.backends.filebased import EmailBackend as FileEmailBackend
from django.test import Client
from django.urls import reverse

import tombstones
from project.customers.handlers import CUSTOMER_HEADER as HEADER
from project.customers.handlers import erase_welcome_mail
from project.customers.models import CrmContact, Customer, SheetRow
from tests.factories import CustomerFactory, SheetRowFactory
from tests.jobkit import make_due, run
from tests.mail import file_mail
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
    customer = CustomerFactory()
    job = run(tombstones.enqueue("customers.sync_crm", customer))
    assert (job.status, job.reason) == (Job.Status.RETRY_WAIT, Job.Reason.TRANSIENT)
    # This customer's (the test before may still be writing its own: its fake CRM answers
    # after the job gave up waiting, once that test's database was flushed).
    assert not CrmContact.objects.filter(reference=customer.reference).exists()


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


# --- erasure on delete -----------------------------------------------------------------------

NAME = "Wxyvut Erasename"
EMAIL = "erase-3391@pii.test"


@pytest.fixture
def mail_dir(settings: Any, tmp_path: Path) -> Path:
    """The demo's file email backend, in a folder of this test's own."""
    file_mail(settings, tmp_path)
    return tmp_path


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root"))
    return client


def _welcomed(reference: str, **fields: Any) -> SheetRow:
    """A customer whose sheet row was synced and who was sent the welcome email."""
    row = SheetRowFactory(customer__reference=reference, **fields)
    assert run(tombstones.enqueue("customers.update_sheet_row", row.customer)).status == "succeeded"
    customer = Customer.objects.get(pk=row.customer_id)
    assert run(tombstones.enqueue("customers.send_welcome", customer)).status == "succeeded"
    row.refresh_from_db()
    assert row.name_hash
    return row


def _mails(folder: Path) -> str:
    return "\n".join(path.read_text() for path in folder.glob("*.log"))


def test_admin_delete__queues_the_erasure_that_clears_sheet_row_and_email(
    mail_dir: Path, staff: Client
) -> None:
    row = _welcomed("C-ERASE", customer__name=NAME, customer__email=EMAIL)
    other = _welcomed("C-KEEP")
    assert EMAIL in _mails(mail_dir)
    url = reverse("admin:customers_customer_delete", args=(row.customer_id,))

    response = staff.post(url, {"post": "yes"})

    assert response.status_code == 302
    erase = Job.objects.get(handler="customers.erase_customer")
    assert (erase.object_id, erase.status) == (str(row.customer_id), Job.Status.SUCCEEDED)
    assert erase.lane == f"customers.customer:{row.customer_id}"  # the customer's own lane
    row.refresh_from_db()
    assert (row.name_hash, row.synced_version) == ("", None)
    mails = _mails(mail_dir)
    assert EMAIL not in mails
    assert "C-ERASE" not in mails
    assert other.customer.email in mails  # another customer's email stays
    other.refresh_from_db()
    assert other.name_hash
    tomb = Customer.all_objects.get(pk=row.customer_id)
    assert (tomb.name, tomb.email, tomb.is_tombstone) == ("", "", True)


def test_admin_bulk_delete__queues_one_erasure_per_customer(mail_dir: Path, staff: Client) -> None:
    rows = [_welcomed(f"C-BULK-{n}") for n in range(2)]
    response = staff.post(
        reverse("admin:customers_customer_changelist"),
        {
            "action": "delete_selected",
            "_selected_action": [row.customer_id for row in rows],
            "post": "yes",
        },
    )
    assert response.status_code == 302
    erasures = Job.objects.filter(handler="customers.erase_customer")
    assert sorted(erasures.values_list("object_id", flat=True)) == sorted(
        str(row.customer_id) for row in rows
    )
    assert set(erasures.values_list("status", flat=True)) == {Job.Status.SUCCEEDED}
    assert set(SheetRow.objects.values_list("name_hash", flat=True)) == {""}
    assert list(mail_dir.glob("*.log")) == []


def test_erasure__of_a_recreated_customer_is_rejected_and_writes_nothing(
    settings: Any, mail_dir: Path
) -> None:
    row = _welcomed("C-AGAIN")
    settings.TOMBSTONES_Q_OPTIONS = {}  # queued only: run by hand below
    customer = Customer.objects.get(pk=row.customer_id)
    customer.delete()
    erase = tombstones.enqueue("customers.erase_customer", customer)
    Customer.all_objects.recreate(reference="C-AGAIN", name="New Name", email="new@x.test")

    erase = run(erase)

    # Generation 2 is another customer: the erasure of generation 1 must not touch its data.
    assert (erase.status, erase.reason) == (Job.Status.REJECTED, Job.Reason.GENERATION_CHANGED)
    before = row.name_hash
    row.refresh_from_db()
    assert row.name_hash == before
    assert len(list(mail_dir.glob("*.log"))) == 1


def test_erase_welcome_mail__keeps_another_customer_s_mail_in_the_same_file(
    mail_dir: Path,
) -> None:
    """One backend instance writes every message it sends to one file (and two made in the same
    second may share one): the erasure removes this customer's messages, not the file."""
    backend = FileEmailBackend(file_path=str(mail_dir))
    sent = [
        EmailMessage("Welcome", f"Hi {ref}", None, [f"{ref}@x.test"], headers={HEADER: ref})
        for ref in ("C-GONE", "C-STAYS", "C-GONE")
    ]
    assert backend.send_messages(sent) == 3
    (path,) = mail_dir.glob("*.log")

    assert erase_welcome_mail("C-GONE") == 2
    assert erase_welcome_mail("C-GONE") == 0

    text = path.read_text()
    assert "C-GONE" not in text
    assert text.count("C-STAYS@x.test") == 1
    assert erase_welcome_mail("C-STAYS") == 1
    assert list(mail_dir.glob("*.log")) == []
