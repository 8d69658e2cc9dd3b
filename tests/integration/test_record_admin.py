"""TombstoneAdmin through the Django test client: delete makes tombstones, tombstones are
read-only identity, the change form is fenced on the version it was opened at, re-create by
adding, pages that name a live record by str() and a tombstone by identity, and admin log
entries without personal data."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.test import Client
from django.urls import NoReverseMatch, reverse

from project.customers.models import CrmContact, Customer, SheetRow
from tests.factories import CustomerFactory, SheetRowFactory
from tombstones.admin import records as record_admin
from tombstones.models import Job
from tombstones.records.options import TombstoneOptions

pytestmark = pytest.mark.django_db

PLANTED = "Zyxwvut-Planted"  # a personal value that must never show up


def url(name: str, *args: Any) -> str:
    return reverse(f"admin:customers_customer_{name}", args=args)


def row(pk: Any) -> Customer:
    return Customer.all_objects.get(pk=pk)


def raw_update(pk: Any, **fields: Any) -> None:
    """Write behind the mixin's back (no version bump, tombstones too): planted test data."""
    models.QuerySet.update(Customer.all_objects.filter(pk=pk), **fields)


def queued_job(record: models.Model, status: str = "queued", lane: str = "x") -> Job:
    return Job.objects.create(
        handler="customers.update_sheet_row",
        content_type=ContentType.objects.get_for_model(record),
        object_id=str(record.pk),
        generation=1,
        version=1,
        lane=lane,
        status=status,
    )


def form_data(customer: Customer, **overrides: Any) -> dict[str, Any]:
    data = {
        "reference": customer.reference,
        "name": customer.name,
        "email": customer.email,
        "phone": customer.phone,
        "synced_at_0": "",
        "synced_at_1": "",
        "opened_generation": str(customer.generation),
        "opened_version": str(customer.version),
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def staff_client(*codenames: str) -> Client:
    from django.contrib.auth.models import User

    user = User.objects.create_user("staff", password="x", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="customers", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def text(response: Any) -> str:
    return response.content.decode()


# --- delete ------------------------------------------------------------------------------------


def test_delete_view__confirmation_names_personal_fields_and_counts_queued_jobs(
    admin_client: Client,
) -> None:
    customer = CustomerFactory(name=PLANTED)
    sheet_row = SheetRowFactory(customer=customer)  # PROTECT: in Django's cascade summary
    queued_job(customer, lane="a")
    queued_job(customer, lane="b")
    queued_job(customer, status="running", lane="c")
    queued_job(customer, status="retry_wait", lane="d")
    queued_job(customer, status="succeeded", lane="e")  # finished: not counted
    queued_job(CustomerFactory(), lane="f")  # another record: not counted

    response = admin_client.get(url("delete", customer.pk))

    assert response.status_code == 200
    page = text(response)
    personal = re.search(r'<ul class="tombstone-personal-fields">(.*?)</ul>', page, re.S)
    assert personal is not None
    assert re.findall(r"<li>(.*?)</li>", personal.group(1)) == ["Name", "Email", "Phone"]
    assert "4 queued jobs reference this record" in page
    assert f"delete the customer “{customer}”?" in page  # named by str(), as Django does
    # No cascade list, no protected list, no personal value.
    assert "deleted-objects" not in page
    assert sheet_row.reference not in page
    assert PLANTED not in page
    assert 'name="post" value="yes"' in page
    assert row(customer.pk).deleted_at is None  # GET changes nothing


def test_delete_view__post_makes_a_tombstone_with_erased_personal_fields(
    admin_client: Client,
) -> None:
    customer = CustomerFactory(name=PLANTED, phone="+15550001")
    sheet_row = SheetRowFactory(customer=customer)  # PROTECT: Django's delete would refuse

    response = admin_client.post(url("delete", customer.pk), {"post": "yes"})

    assert response.status_code == 302
    assert response["Location"] == url("changelist")
    tomb = row(customer.pk)
    assert tomb.deleted_at is not None
    assert (tomb.name, tomb.email, tomb.phone) == ("", "", "")
    assert (tomb.generation, tomb.version) == (1, 2)
    assert not Customer.objects.filter(pk=customer.pk).exists()
    assert SheetRow.objects.filter(pk=sheet_row.pk).exists()  # nothing cascades


def test_delete_view__of_a_tombstone_is_refused(admin_client: Client) -> None:
    customer = CustomerFactory()
    customer.delete()
    before = row(customer.pk).version

    response = admin_client.post(url("delete", customer.pk), {"post": "yes"})

    assert response.status_code == 403
    assert row(customer.pk).version == before


def test_delete_selected__confirms_then_tombstones_the_selected_live_records(
    admin_client: Client,
) -> None:
    first, second, kept = CustomerFactory(), CustomerFactory(name=PLANTED), CustomerFactory()
    SheetRowFactory(customer=second)  # PROTECT: Django's delete_selected would refuse
    dead = CustomerFactory()
    dead.delete()
    dead_version = row(dead.pk).version
    queued_job(second)
    selected = [first.pk, second.pk, dead.pk]
    changelist = url("changelist") + "?records=all"

    step1 = admin_client.post(
        changelist, {"action": "delete_selected", "index": "0", "_selected_action": selected}
    )

    assert step1.status_code == 200
    page = text(step1)
    assert "These personal fields will be erased" in page
    assert "1 queued job references these records" in page
    assert f"<li>{first} (0 queued jobs)</li>" in page
    assert f"<li>{second} (1 queued job)</li>" in page
    assert dead.reference not in page  # already a tombstone: not listed
    assert PLANTED not in page
    assert row(first.pk).deleted_at is None
    assert row(second.pk).deleted_at is None

    step2 = admin_client.post(
        changelist,
        {"action": "delete_selected", "post": "yes", "_selected_action": selected},
        follow=True,
    )

    assert step2.status_code == 200
    assert "2 customers are now tombstones." in text(step2)
    for pk in (first.pk, second.pk):
        tomb = row(pk)
        assert tomb.deleted_at is not None
        assert (tomb.name, tomb.email, tomb.phone) == ("", "", "")
    assert row(kept.pk).deleted_at is None
    assert row(dead.pk).version == dead_version  # the tombstone was not touched again
    logged = LogEntry.objects.filter(action_flag=DELETION).values_list("object_id", flat=True)
    assert sorted(logged) == sorted([str(first.pk), str(second.pk)])


def test_delete__without_delete_permission_is_refused(admin_client: Client) -> None:
    customer = CustomerFactory()
    client = staff_client("view_customer", "change_customer")

    assert client.get(url("delete", customer.pk)).status_code == 403
    assert client.post(url("delete", customer.pk), {"post": "yes"}).status_code == 403
    changelist = client.get(url("changelist"))
    assert changelist.status_code == 200
    assert 'value="delete_selected"' not in text(changelist)
    client.post(
        url("changelist"),
        {"action": "delete_selected", "post": "yes", "_selected_action": [customer.pk]},
    )

    assert row(customer.pk).deleted_at is None
    # The same requests by a superuser do delete: the refusal above is the permission's.
    admin_client.post(url("delete", customer.pk), {"post": "yes"})
    assert row(customer.pk).deleted_at is not None


def test_delete__csrf_is_enforced(admin_user: Any) -> None:
    customer = CustomerFactory()
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)

    response = client.post(url("delete", customer.pk), {"post": "yes"})

    assert response.status_code == 403
    assert row(customer.pk).deleted_at is None


def test_sheet_row_delete__names_its_derived_personal_field(admin_client: Client) -> None:
    sheet_row = SheetRowFactory()

    response = admin_client.get(reverse("admin:customers_sheetrow_delete", args=[sheet_row.pk]))

    assert "Name hash" in text(response)  # a hash of a name is personal data too
    assert "No queued job references this record." in text(response)


def test_delete__of_a_model_without_personal_fields_says_nothing_is_erased(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SheetRow, "_tombstone_options", TombstoneOptions("reference", ()))
    sheet_row = SheetRowFactory()

    response = admin_client.get(reverse("admin:customers_sheetrow_delete", args=[sheet_row.pk]))

    assert "declares no personal fields" in text(response)


# --- changelist and tombstone pages ------------------------------------------------------------


def test_changelist__shows_live_records_by_default_and_tombstones_through_the_filter(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A __str__ that reads a personal field: a tombstone's row must not use it.
    monkeypatch.setattr(Customer, "__str__", lambda self: f"Customer {self.name}")
    CustomerFactory(reference="LIVE-REF-1")
    dead = CustomerFactory(reference="DEAD-REF-1")
    dead.delete()
    raw_update(dead.pk, name=PLANTED)  # not erased, somehow: still never listed

    live_page = text(admin_client.get(url("changelist")))
    dead_page = text(admin_client.get(url("changelist") + "?records=tombstones"))
    all_page = text(admin_client.get(url("changelist") + "?records=all"))

    assert "LIVE-REF-1" in live_page
    assert "DEAD-REF-1" not in live_page
    assert "DEAD-REF-1" in dead_page
    assert "LIVE-REF-1" not in dead_page
    assert "LIVE-REF-1" in all_page
    assert "DEAD-REF-1" in all_page
    assert "?records=tombstones" in live_page  # the filter is offered
    for page in (dead_page, all_page):
        assert PLANTED not in page


@pytest.mark.parametrize(
    "fieldsets", [None, [(None, {"fields": ["reference", "name", "email", "phone"]})]]
)
def test_tombstone_change_page__is_read_only_identity_without_personal_values(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch, fieldsets: Any
) -> None:
    # Whatever the subclass's fieldsets and __str__ say, a tombstone shows its identity only.
    monkeypatch.setattr(admin.site._registry[Customer], "fieldsets", fieldsets)
    monkeypatch.setattr(Customer, "__str__", lambda self: f"Customer {self.name}")
    customer = CustomerFactory(reference="DEAD-REF-2")
    customer.delete()
    raw_update(customer.pk, name=PLANTED, email=f"{PLANTED}@example.test", phone=PLANTED)

    response = admin_client.get(url("change", customer.pk))

    assert response.status_code == 200
    page = text(response)
    assert PLANTED not in page
    assert "DEAD-REF-2" in page
    assert "is a tombstone" in page
    assert 'name="_save"' not in page
    assert 'name="name"' not in page
    assert 'name="opened_version"' not in page
    readonly = re.findall(r'<div class="readonly">(.*?)</div>', page, re.S)
    assert len(readonly) == 5  # pk, business key, generation, version, deleted_at
    assert readonly[:4] == [str(customer.pk), "DEAD-REF-2", "1", "2"]
    assert url("delete", customer.pk) not in page


def test_tombstone_change_page__post_changes_nothing(admin_client: Client) -> None:
    customer = CustomerFactory()
    customer.delete()
    before = row(customer.pk)

    response = admin_client.post(
        url("change", customer.pk), form_data(before, name="New Name"), follow=True
    )

    assert "was deleted" in text(response)
    after = row(customer.pk)
    assert (after.name, after.version, after.deleted_at) == ("", before.version, before.deleted_at)


def test_history_page__names_a_live_record_by_str_and_a_tombstone_by_identity(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    customer = CustomerFactory(name=PLANTED)
    monkeypatch.setattr(Customer, "__str__", lambda self: f"Customer {self.name}")

    live = text(admin_client.get(url("history", customer.pk)))
    customer.delete()
    raw_update(customer.pk, name=PLANTED)  # not erased, somehow: still never shown
    dead = admin_client.get(url("history", customer.pk))

    # Staff who may open the live record see its fields anyway: Django's heading.
    assert f"Change history: Customer {PLANTED}" in live
    assert dead.status_code == 200
    assert PLANTED not in text(dead)
    identity = f"customers.Customer pk={customer.pk} generation=1 reference={customer.reference}"
    assert f"Change history: {identity}" in text(dead)


def test_timeline_link__present_when_the_view_exists_and_omitted_otherwise(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = CustomerFactory()
    dead = CustomerFactory()
    dead.delete()
    ct = ContentType.objects.get_for_model(Customer)

    # A URL that takes (content_type_id, object_id), standing in for the timeline view.
    monkeypatch.setattr(record_admin, "TIMELINE_URL", "admin:view_on_site")
    for record in (live, dead):
        page = text(admin_client.get(url("change", record.pk)))
        expected = reverse("admin:view_on_site", args=(ct.pk, str(record.pk)))
        assert f'<a href="{expected}" class="timelinelink">Timeline</a>' in page

    monkeypatch.setattr(record_admin, "TIMELINE_URL", "admin:tombstones_no_such_view")
    page = text(admin_client.get(url("change", live.pk)))
    assert response_ok(page)
    assert "timelinelink" not in page

    # The real view: linked once it is installed, simply omitted until then.
    monkeypatch.setattr(record_admin, "TIMELINE_URL", "admin:tombstones_job_timeline")
    page = text(admin_client.get(url("change", live.pk)))
    try:
        real = reverse("admin:tombstones_job_timeline", args=(ct.pk, str(live.pk)))
    except NoReverseMatch:
        assert "timelinelink" not in page
    else:
        assert f'<a href="{real}" class="timelinelink">' in page


def response_ok(page: str) -> bool:
    return 'id="customer_form"' in page


# --- the fenced change form --------------------------------------------------------------------


def test_change_form__saves_at_the_version_it_was_opened_at(admin_client: Client) -> None:
    customer = CustomerFactory()
    page = text(admin_client.get(url("change", customer.pk)))
    opened = re.search(r'name="opened_version" value="(\d+)"', page)
    assert opened is not None
    assert opened.group(1) == "1"
    assert 'name="version"' not in page  # version is read-only, not an input

    response = admin_client.post(url("change", customer.pk), form_data(customer, name="Renamed"))

    assert response.status_code == 302
    saved = row(customer.pk)
    assert (saved.name, saved.version) == ("Renamed", 2)


def test_change_form__refuses_a_record_changed_since_it_was_opened(admin_client: Client) -> None:
    customer = CustomerFactory(name="Original")
    admin_client.get(url("change", customer.pk))  # opened at version 1
    Customer.objects.filter(pk=customer.pk).update(name="Written by a job")  # version 2

    response = admin_client.post(
        url("change", customer.pk), form_data(customer, name="Staff edit", opened_version="1")
    )

    assert response.status_code == 200
    assert "changed since you opened it" in text(response)
    after = row(customer.pk)
    assert (after.name, after.version) == ("Written by a job", 2)
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    ("version", "error"),
    [
        ("abc", "version is missing or invalid"),
        ("0", "version is missing or invalid"),
        ("-1", "version is missing or invalid"),
        ("", "version is missing or invalid"),
        (None, "version is missing or invalid"),  # the field left out of the POST
        ("999", "changed since you opened it"),
    ],
)
def test_change_form__refuses_a_tampered_version(
    admin_client: Client, version: Any, error: str
) -> None:
    customer = CustomerFactory(name="Original")

    response = admin_client.post(
        url("change", customer.pk), form_data(customer, name="Tampered", opened_version=version)
    )

    assert response.status_code == 200
    assert error in text(response)
    after = row(customer.pk)
    assert (after.name, after.version) == ("Original", 1)


def test_change_form__refuses_a_form_opened_on_an_older_generation(admin_client: Client) -> None:
    customer = CustomerFactory(name="Generation one")
    opened = form_data(customer, name="Stale edit")  # generation 1, version 1
    customer.delete()
    Customer.all_objects.recreate(
        reference=customer.reference, name="Generation two", email="two@example.test"
    )  # generation 2, version 1: the version alone would match

    response = admin_client.post(url("change", customer.pk), opened)

    assert response.status_code == 200
    assert "was deleted (or deleted and re-created) since you opened it" in text(response)
    after = row(customer.pk)
    assert (after.name, after.generation, after.version) == ("Generation two", 2, 1)


def test_change_form__conflict_at_save_time_rolls_back_and_reports(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    customer = CustomerFactory(name="Original")

    def job_writes_after_the_check(form: Any, cleaned: dict[str, Any]) -> None:
        # A write landing between the form's check and the fenced UPDATE.
        Customer.objects.filter(pk=customer.pk).update(phone="+15559999")

    monkeypatch.setattr(record_admin.TombstoneAdminForm, "_check_fence", job_writes_after_the_check)

    response = admin_client.post(
        url("change", customer.pk), form_data(customer, name="Staff edit"), follow=True
    )

    assert "changed since you opened it" in text(response)
    after = row(customer.pk)
    assert after.name == "Original"
    assert not LogEntry.objects.exists()  # the log entry rolled back with the view


def test_change_form__business_key_of_a_tombstone_is_a_form_error(admin_client: Client) -> None:
    dead = CustomerFactory(reference="DEAD-REF-3")
    dead.delete()
    customer = CustomerFactory()

    response = admin_client.post(
        url("change", customer.pk), form_data(customer, reference="DEAD-REF-3")
    )

    assert response.status_code == 200
    assert "belongs to a deleted record" in text(response)
    assert row(customer.pk).reference == customer.reference


# --- add and re-create -------------------------------------------------------------------------


def test_add__a_tombstoned_business_key_recreates_it_as_the_next_generation(
    admin_client: Client,
) -> None:
    customer = CustomerFactory(reference="BACK-1")
    customer.delete()

    response = admin_client.post(
        url("add"),
        {"reference": "BACK-1", "name": "Returning", "email": "back@example.test", "phone": ""},
        follow=True,
    )

    assert (
        f'“<a href="{url("change", customer.pk)}">Customer BACK-1</a>” was re-created as '
        "generation 2" in text(response)
    )
    assert Customer.all_objects.filter(reference="BACK-1").count() == 1
    revived = row(customer.pk)
    assert (revived.generation, revived.version, revived.deleted_at) == (2, 1, None)
    assert (revived.name, revived.email) == ("Returning", "back@example.test")


def test_add__a_new_business_key_is_generation_one(admin_client: Client) -> None:
    response = admin_client.post(
        url("add"),
        {"reference": "NEW-1", "name": "New", "email": "new@example.test", "phone": ""},
        follow=True,
    )

    assert "was added successfully" in text(response)
    created = Customer.objects.get(reference="NEW-1")
    assert (created.generation, created.version) == (1, 1)


def test_add__a_live_business_key_is_a_unique_error(admin_client: Client) -> None:
    customer = CustomerFactory(reference="TAKEN-1", name="Holder")

    response = admin_client.post(
        url("add"),
        {"reference": "TAKEN-1", "name": "Intruder", "email": "i@example.test", "phone": ""},
    )

    assert response.status_code == 200
    assert "Customer with this Reference already exists." in text(response)
    assert Customer.all_objects.count() == 1
    assert (row(customer.pk).name, row(customer.pk).version) == ("Holder", 1)


# --- log entries -------------------------------------------------------------------------------


def test_log_entries__carry_identity_only_whatever_str_returns(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A model whose __str__ leaks personal data: the admin must not pass it to LogEntry.
    monkeypatch.setattr(Customer, "__str__", lambda self: f"{self.name} <{self.email}>")
    edited = CustomerFactory(name=PLANTED)
    deleted = CustomerFactory(name=PLANTED)
    bulk = CustomerFactory(name=PLANTED)
    recreated = CustomerFactory(reference="BACK-2", name=PLANTED)
    recreated.delete()

    # follow=True: the success messages (shown once, to this user) are consumed here.
    admin_client.post(
        url("change", edited.pk), form_data(edited, email=f"{PLANTED}@x.test"), follow=True
    )
    admin_client.post(url("delete", deleted.pk), {"post": "yes"})
    admin_client.post(
        url("changelist"),
        {"action": "delete_selected", "post": "yes", "_selected_action": [bulk.pk]},
    )
    admin_client.post(
        url("add"),
        {"reference": "BACK-2", "name": PLANTED, "email": "b@example.test", "phone": ""},
        follow=True,  # its message names the live record by str(), to the staff who typed it
    )

    entries = list(LogEntry.objects.order_by("pk"))
    assert [e.object_id for e in entries] == [
        str(edited.pk),
        str(deleted.pk),
        str(bulk.pk),
        str(recreated.pk),
    ]
    generations = (1, 1, 1, 2)  # the re-created record's entry names its second life
    for entry, record, gen in zip(
        entries, (edited, deleted, bulk, recreated), generations, strict=True
    ):
        assert entry.object_repr == (
            f"customers.Customer pk={record.pk} generation={gen} reference={record.reference}"
        )
        assert PLANTED not in entry.change_message
    assert row(edited.pk).email == f"{PLANTED}@x.test"  # the edit itself went through
    assert '"Email"' in entries[0].change_message  # field labels, not values
    edited.delete()  # the log outlives the record: its history page shows none of its values
    history = text(admin_client.get(url("history", edited.pk)))
    assert PLANTED not in history


def test_identity__leaves_out_a_personal_business_key(monkeypatch: pytest.MonkeyPatch) -> None:
    customer = Customer(pk=7, reference="C-7", name=PLANTED, generation=3)
    assert customer.tombstone_identity() == "customers.Customer pk=7 generation=3 reference=C-7"

    monkeypatch.setattr(
        Customer, "_tombstone_options", TombstoneOptions("reference", ("reference", "name"))
    )
    assert customer.tombstone_identity() == "customers.Customer pk=7 generation=3"


def test_messages__name_a_live_record_by_str_and_a_deleted_one_by_identity(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    customer = CustomerFactory()
    deleted = CustomerFactory(name=PLANTED)
    monkeypatch.setattr(Customer, "__str__", lambda self: f"Customer {self.name}")

    changed = admin_client.post(
        url("change", customer.pk), form_data(customer, name="Renamed"), follow=True
    )
    gone = admin_client.post(url("delete", deleted.pk), {"post": "yes"}, follow=True)

    assert f'“<a href="{url("change", customer.pk)}">Customer Renamed</a>” was changed' in text(
        changed
    )
    # The record's name was erased with it: the message must not bring it back.
    assert f"The customer with ID {deleted.pk} is now a tombstone." in text(gone)
    assert PLANTED not in text(gone)


# --- the demo's other models -------------------------------------------------------------------


def test_crm_contact_admin__is_read_only(admin_client: Client) -> None:
    contact = CrmContact.objects.create(idempotency_key="k-1", reference="C-1")

    assert admin_client.get(reverse("admin:customers_crmcontact_add")).status_code == 403
    page = text(admin_client.get(reverse("admin:customers_crmcontact_change", args=[contact.pk])))
    assert 'name="_save"' not in page
    admin_client.post(
        reverse("admin:customers_crmcontact_change", args=[contact.pk]),
        {"idempotency_key": "k-2", "reference": "C-2", "deliveries": "5"},
    )
    contact.refresh_from_db()
    assert (contact.idempotency_key, contact.deliveries) == ("k-1", 1)


def test_sheet_row_admin__lists_live_rows(admin_client: Client) -> None:
    live = SheetRowFactory()
    dead = SheetRowFactory()
    dead.delete()

    page = text(admin_client.get(reverse("admin:customers_sheetrow_changelist")))

    assert live.reference in page
    assert dead.reference not in page
    assert SheetRow.tombstones.filter(pk=dead.pk).exists()
