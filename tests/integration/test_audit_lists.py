"""The audit lists' filters, counts and search: a filter offers only the values its list holds, a
filtered list does not count the whole table again, and the Jobs list finds a record's jobs by
its business key (never by a personal one)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from project.customers.models import Customer, SheetRow
from tests.factories import CustomerFactory
from tests.jobkit import run
from tombstones.admin.filters import occurring
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job, JobEvent, Rejection
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


# --- filters -------------------------------------------------------------------------------------


def test_reason_filter__offers_only_the_reasons_its_list_holds(
    staff_client: Client, rejections: list[Job]
) -> None:
    # "All", then the reasons that occur, in their declared order (17 reasons exist).
    assert len(Reason.choices) > 10
    assert _offered(staff_client, "rejection", "reason") == [
        "All",
        "Source Deleted",
        "Generation Changed",
    ]
    # The Jobs and event lists also hold jobs and events without a reason ("-").
    assert _offered(staff_client, "job", "reason") == [
        "All",
        "-",
        "Source Deleted",
        "Generation Changed",
    ]
    assert _offered(staff_client, "jobevent", "reason") == _offered(staff_client, "job", "reason")
    assert _offered(staff_client, "job", "status") == ["All", "Succeeded", "Rejected"]
    assert "Claimed" in _offered(staff_client, "jobevent", "event")
    assert "Cancelled" not in _offered(staff_client, "jobevent", "event")
    # Django's own parameter still filters, so old links keep working.
    response = staff_client.get(
        reverse("admin:tombstones_rejection_changelist"), {"reason__exact": "generation_changed"}
    )
    assert [r.job_id for r in response.context["cl"].result_list] == [rejections[-1].pk]


def test_reason_filter__is_not_shown_while_its_list_is_empty(staff_client: Client) -> None:
    assert _offered(staff_client, "rejection", "reason") == []
    job = enqueue("customers.update_sheet_row", CustomerFactory())
    # Events without a reason, but no rejection (a job that succeeds at once stores none).
    JobEvent.objects.create(
        job=job, content_type=job.content_type, object_id=job.object_id, event="claimed"
    )
    assert not Rejection.objects.exists()
    assert _offered(staff_client, "rejection", "reason") == []
    assert _offered(staff_client, "jobevent", "reason") == ["All", "-"]


def test_occurring__asks_every_value_in_one_query(rejections: list[Job]) -> None:
    values = [value for value, _label in Reason.choices]
    with CaptureQueriesContext(connection) as queries:
        found = occurring(Rejection.objects.all(), "reason", values)
    assert found == {Reason.SOURCE_DELETED, Reason.GENERATION_CHANGED}
    assert len(queries.captured_queries) == 1
    assert "DISTINCT" not in queries.captured_queries[0]["sql"].upper()


# --- counts --------------------------------------------------------------------------------------


def test_rejection_log__a_filtered_list_does_not_count_the_whole_table(
    staff_client: Client, rejections: list[Job]
) -> None:
    url = reverse("admin:tombstones_rejection_changelist")
    with CaptureQueriesContext(connection) as queries:
        response = staff_client.get(url, {"reason__exact": "source_deleted"})
    html = response.content.decode()
    assert response.context["cl"].result_count == 4
    assert "4 results" in html
    assert "5 total" not in html
    assert "Show all" in html  # back to the whole list
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counts) == 1, counts  # the filtered list's own count only
    assert "source_deleted" in counts[0]


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
