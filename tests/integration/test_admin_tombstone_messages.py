"""What staff read after deleting through a TombstoneAdmin: the record became a tombstone (named
by its model and id, never by ``str()``), its personal fields were erased, its jobs are fenced.
The single delete view and the bulk ``delete_selected`` action alike."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from project.customers.models import Customer
from tests.factories import CustomerFactory

pytestmark = pytest.mark.django_db

PLANTED = "Zyxwvut-Planted-Msg"  # a personal value: never in a message


def _messages(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_delete_view__says_tombstone_by_model_and_id_never_str(
    admin_client: Client, monkeypatch: Any
) -> None:
    customer = CustomerFactory(name=PLANTED)
    # A model whose str() reads a personal field: the message must not echo it.
    monkeypatch.setattr(Customer, "__str__", lambda self: f"Customer {self.name}")
    url = reverse("admin:customers_customer_delete", args=(customer.pk,))

    response = admin_client.post(url, {"post": "yes"}, follow=True)

    assert Customer.all_objects.get(pk=customer.pk).deleted_at is not None
    assert response.redirect_chain[-1][0] == reverse("admin:customers_customer_changelist")
    [message] = _messages(response)
    assert message.startswith(f"The customer with ID {customer.pk} is now a tombstone.")
    assert "personal fields were erased: name, email, phone." in message
    assert "jobs are fenced" in message
    assert "deleted successfully" not in message
    page = response.content.decode()
    assert PLANTED not in page
    assert customer.reference not in message  # model and id only


def test_delete_selected__says_how_many_became_tombstones(
    admin_client: Client, monkeypatch: Any
) -> None:
    first, second = CustomerFactory(name=PLANTED), CustomerFactory(name=PLANTED + "2")
    monkeypatch.setattr(Customer, "__str__", lambda self: f"Customer {self.name}")
    changelist = reverse("admin:customers_customer_changelist")

    response = admin_client.post(
        changelist,
        {"action": "delete_selected", "post": "yes", "_selected_action": [first.pk, second.pk]},
        follow=True,
    )

    assert Customer.tombstones.filter(pk__in=[first.pk, second.pk]).count() == 2
    [message] = _messages(response)
    assert message.startswith("2 customers are now tombstones.")
    assert "Their personal fields were erased: name, email, phone." in message
    assert "Their jobs are fenced" in message
    assert "Successfully deleted" not in message
    assert PLANTED not in response.content.decode()


def test_delete_view__in_a_popup_answers_the_popup(admin_client: Client) -> None:
    customer = CustomerFactory()
    url = reverse("admin:customers_customer_delete", args=(customer.pk,))

    response = admin_client.post(url, {"post": "yes", "_popup": "1"})

    assert response.status_code == 200
    assert "popup_response" in response.templates[0].name
    assert Customer.all_objects.get(pk=customer.pk).deleted_at is not None
