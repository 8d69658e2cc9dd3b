"""The audit admins answer only their declared filters; the timeline only for records it may show.

Every request goes through Django's test client, as a superuser and as an auditor.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import run
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job
from tombstones.roles import AUDITORS

pytestmark = pytest.mark.django_db

HANDLER = "customers.update_sheet_row"


def _superuser() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root"))
    return client


def _auditor() -> Client:
    call_command("tombstones_roles", verbosity=0)
    user = User.objects.create_user("auditor", password="pw-auditor", is_staff=True)
    user.groups.add(Group.objects.get(name=AUDITORS))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture(params=["superuser", "auditor"])
def client(request: pytest.FixtureRequest) -> Client:
    return _superuser() if request.param == "superuser" else _auditor()


@pytest.fixture
def rejected() -> Job:
    """A rejected job: it appears in all three audit lists."""
    customer = CustomerFactory()
    job = enqueue(HANDLER, customer, params={"mode": "full"})
    customer.delete()
    job = run(job)
    assert job.status == Job.Status.REJECTED
    return job


JOBS = "admin:tombstones_job_changelist"
EVENTS = "admin:tombstones_jobevent_changelist"
REJECTIONS = "admin:tombstones_rejection_changelist"
EXPORT = "admin:tombstones_rejection_export"

# Lookups on hidden or undeclared columns: each must be refused, whatever it would match.
UNDECLARED = {
    JOBS: [
        "params__mode__startswith=f",  # answers "1 job" / "0 jobs" about a hidden value
        "params__mode__startswith=x",
        "params__contains=x",  # a 500 on SQLite before
        "params__has_key=mode",
        "lane__startswith=c",
        "owner__contains=a",
        "content_type__app_label=customers",
    ],
    EVENTS: ["job__params__contains=x", "worker__startswith=w", "object_id__gt=0"],
    REJECTIONS: ["job__params__mode=full", "worker__startswith=w", "expected_version__gte=1"],
    EXPORT: ["job__params__mode=full", "worker__startswith=w", "object_id__startswith=1"],
}


@pytest.mark.parametrize(
    ("page", "query"), [(page, query) for page, queries in UNDECLARED.items() for query in queries]
)
def test_undeclared_lookup__is_refused_for_every_user(
    client: Client, rejected: Job, page: str, query: str
) -> None:
    response = client.get(f"{reverse(page)}?{query}")
    # Django's invalid-lookup handling: a 400 (DisallowedModelAdminLookup), never an answer.
    assert response.status_code == 400, (page, query, response.status_code)
    assert b"result_list" not in response.content  # no list, no count
    assert not response["Content-Type"].startswith("text/csv")


DECLARED = {
    JOBS: [
        "status__exact=rejected",
        "reason__exact=source_deleted",
        "handler=customers.update_sheet_row",
        "created_at__gte=2000-01-01+00:00:00%2B00:00",
        "created_at__year=2000",
        "q=1",
    ],
    EVENTS: ["event__exact=rejected", "reason__exact=source_deleted", "q=%231"],
    REJECTIONS: ["reason__exact=source_deleted", "created_at__year=2000", "q=1"],
    EXPORT: ["reason__exact=source_deleted", "created_at__year=2000"],
}


@pytest.mark.parametrize(
    ("page", "query"), [(page, query) for page, queries in DECLARED.items() for query in queries]
)
def test_declared_filters_and_search__still_work(
    client: Client, rejected: Job, page: str, query: str
) -> None:
    assert client.get(f"{reverse(page)}?{query}").status_code == 200


def test_timeline_link__to_the_records_jobs_still_works(client: Client, rejected: Job) -> None:
    response = client.get(
        reverse(JOBS), {"content_type": rejected.content_type_id, "object_id": rejected.object_id}
    )
    assert response.status_code == 200
    assert [job.pk for job in response.context["cl"].result_list] == [rejected.pk]


# --- the timeline --------------------------------------------------------------------------------


def _timeline(content_type_id: int, object_id: str) -> str:
    return reverse("admin:tombstones_job_timeline", args=(content_type_id, object_id))


def test_timeline__of_a_model_without_the_mixin_is_a_404(client: Client) -> None:
    user_type = ContentType.objects.get_for_model(User)
    user = User.objects.get()  # the logged-in user: a real row, e.g. auth.user:1
    assert client.get(_timeline(user_type.pk, str(user.pk))).status_code == 404


@pytest.mark.parametrize(
    "object_id", ["not-a-pk", "1.5", "007", " 1", "99999999999999999999999", "-"]
)
def test_timeline__of_a_malformed_id_is_a_404(client: Client, object_id: str) -> None:
    customer_type = ContentType.objects.get_for_model(Customer)
    CustomerFactory(pk=7)
    assert client.get(_timeline(customer_type.pk, object_id)).status_code == 404


def test_timeline__of_a_missing_record_without_jobs_is_a_404(client: Client) -> None:
    customer_type = ContentType.objects.get_for_model(Customer)
    assert client.get(_timeline(customer_type.pk, "424242")).status_code == 404


def test_timeline__of_a_purged_record_with_jobs_shows_the_jobs(client: Client) -> None:
    customer = CustomerFactory()
    job = enqueue(HANDLER, customer)
    customer.delete()
    Customer.tombstones.filter(pk=customer.pk).purge()
    response = client.get(_timeline(job.content_type_id, job.object_id))
    assert response.status_code == 200
    assert b'id="record-state">missing' in response.content


def test_timeline__auditor_sees_records_with_jobs_only() -> None:
    auditor = _auditor()
    customer_type = ContentType.objects.get_for_model(Customer)
    quiet = CustomerFactory(reference="NO-JOBS-1")
    busy = CustomerFactory(reference="HAS-JOBS-1")
    enqueue(HANDLER, busy)

    assert auditor.get(_timeline(customer_type.pk, str(quiet.pk))).status_code == 404
    page = auditor.get(_timeline(customer_type.pk, str(busy.pk)))
    assert page.status_code == 200
    assert b"HAS-JOBS-1" in page.content
    # Staff who may view customers see any customer's timeline.
    staff = _superuser()
    response = staff.get(_timeline(customer_type.pk, str(quiet.pk)))
    assert response.status_code == 200
    assert b"NO-JOBS-1" in response.content
