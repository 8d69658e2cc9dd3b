"""The audit lists' search: the Jobs list finds a record's jobs by its business key (never by a
personal one)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from project.customers.models import Customer, SheetRow
from tests.factories import CustomerFactory
from tests.jobkit import run
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job
from tombstones.records.options import TombstoneOptions

pytestmark = pytest.mark.django_db

Reason = Job.Reason


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def staff_client(staff: User) -> Client:
    return _client(staff)


@pytest.fixture
def auditor_client(auditor: User) -> Client:
    return _client(auditor)


def _source_deleted() -> Job:
    customer = CustomerFactory()
    job = enqueue("customers.update_sheet_row", customer)
    customer.delete()
    return run(job)


def _generation_changed() -> Job:
    customer = CustomerFactory()
    job = enqueue("customers.update_sheet_row", customer)
    customer.delete()
    Customer.all_objects.recreate(reference=customer.reference, name="Back", email="b@x.test")
    return run(job)


@pytest.fixture
def rejections() -> list[Job]:
    """Four source_deleted rejections, one generation_changed, and a job that succeeded."""
    jobs = [_source_deleted() for _ in range(4)] + [_generation_changed()]
    assert {job.reason for job in jobs} == {Reason.SOURCE_DELETED, Reason.GENERATION_CHANGED}
    assert run(enqueue("customers.update_sheet_row", CustomerFactory())).status == "succeeded"
    return jobs


def _offered(client: Client, name: str, title: str) -> list[str]:
    """The choices of one filter of a list; none when the filter is not shown."""
    response = client.get(reverse(f"admin:tombstones_{name}_changelist"))
    assert response.status_code == 200
    changelist = response.context["cl"]
    specs = [f for f in changelist.filter_specs if str(f.title) == title and f.has_output()]
    return [str(choice["display"]) for spec in specs for choice in spec.choices(changelist)]


# --- business-key search -------------------------------------------------------------------------


def _found(client: Client, term: str) -> set[int]:
    response = client.get(reverse("admin:tombstones_job_changelist"), {"q": term})
    assert response.status_code == 200, term
    return {job.pk for job in response.context["cl"].result_list}


@pytest.mark.parametrize("who", ["staff", "auditor"])
def test_job_search__finds_the_jobs_of_a_business_key(
    who: str, staff_client: Client, auditor_client: Client
) -> None:
    client = {"staff": staff_client, "auditor": auditor_client}[who]
    wanted = CustomerFactory(reference="C-9999")
    other = CustomerFactory(reference="C-1000")
    jobs = [enqueue("customers.update_sheet_row", wanted) for _ in range(2)]
    enqueue("customers.update_sheet_row", other)
    SheetRow.objects.create(customer=other, reference="C-9999-row")  # another model, another key

    assert _found(client, "C-9999") == {job.pk for job in jobs}
    assert _found(client, "  C-9999 ") == {job.pk for job in jobs}
    # A tombstone keeps its key: the jobs of a deleted record are found, the rejected one too.
    wanted.delete()
    assert run(jobs[0]).status == Job.Status.REJECTED
    assert _found(client, "C-9999") == {job.pk for job in jobs}
    # Exact keys only; "#" names a job id; odd input finds nothing and fails nothing.
    for term in ("c-9999", "C-999", "#C-9999", "C-9999" * 20, "' OR 1=1 --", "%", "_"):
        assert _found(client, term) == set(), term
    # Ids still work beside keys.
    assert _found(client, f"#{jobs[1].pk}") == {jobs[1].pk}
    assert _found(client, f"customers.customer:{wanted.pk}") == {job.pk for job in jobs}


def test_job_search__finds_a_key_of_any_tombstone_model(staff_client: Client) -> None:
    customer = CustomerFactory(reference="C-4242")
    row = SheetRow.objects.create(customer=customer, reference="ROW-77")
    customer_job = enqueue("customers.update_sheet_row", customer)
    row_job = Job.objects.create(
        handler="tests.row", content_type_id=_ct(SheetRow), object_id=str(row.pk), lane="x"
    )
    assert _found(staff_client, "ROW-77") == {row_job.pk}
    assert _found(staff_client, "C-4242") == {customer_job.pk}


def _ct(model: type) -> int:
    from django.contrib.contenttypes.models import ContentType

    return int(ContentType.objects.get_for_model(model).pk)


@pytest.mark.parametrize("who", ["staff", "auditor"])
def test_job_search__never_answers_for_a_personal_business_key(
    who: str, staff_client: Client, auditor_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = {"staff": staff_client, "auditor": auditor_client}[who]
    customer = CustomerFactory(reference="C-7777")
    job = enqueue("customers.update_sheet_row", customer)
    assert _found(client, "C-7777") == {job.pk}
    # As tombstone_identity(): a business key that is a personal field is not identity, so the
    # audit neither shows it nor tells whether a record with it has jobs.
    monkeypatch.setattr(
        Customer, "_tombstone_options", TombstoneOptions("reference", ("reference", "name"))
    )
    assert _found(client, "C-7777") == set()
    assert _found(client, str(customer.pk)) == {job.pk}  # the pk, an id, still finds it


def test_job_search__names_content_types_with_every_record_condition() -> None:
    # The job table's record index is (content type, object id): a bare object id would scan it.
    from django.contrib.contenttypes.models import ContentType
    from django.db.models import Q

    from tombstones.admin.search import search_jobs

    customer = CustomerFactory(reference="C-5150")
    types = sorted(
        ct.pk for ct in ContentType.objects.get_for_models(*_tombstone_models()).values()
    )
    assert len(types) >= 2  # customers and sheet rows at least

    def where(term: str) -> object:
        return search_jobs(Job.objects.all(), term, "pk").query.where

    assert (
        where("7")
        == Job.objects.filter(Q(content_type_id__in=types, object_id="7") | Q(pk=7)).query.where
    )
    assert (
        where("C-5150")
        == Job.objects.filter(
            Q(content_type_id__in=types, object_id="C-5150")
            | Q(content_type=_ct(Customer), object_id__in=[str(customer.pk)])
        ).query.where
    )


def _tombstone_models() -> list[type]:
    from django.apps import apps

    from tombstones.records.mixin import TombstoneModel

    return [m for m in apps.get_models() if issubclass(m, TombstoneModel)]
