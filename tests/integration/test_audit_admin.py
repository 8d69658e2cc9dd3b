"""The job audit admin: list, detail, rejection log, timeline, dashboard, staff actions, roles.

Every page is fetched through Django's test client as a logged-in staff member or auditor; every
assertion is on the database state or the page content. Personal data is planted with unique
values and searched for in every page's HTML.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from project.customers.models import Customer
from tests.factories import CustomerFactory
from tests.jobkit import STAFF_CODENAMES, claim, run, temp_handler
from tests.jobkit import record as record_outcome
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job, JobEvent, Rejection
from tombstones.records.options import TombstoneOptions
from tombstones.roles import AUDITOR_PERMISSIONS, AUDITORS

pytestmark = pytest.mark.django_db

Status = Job.Status
Reason = Job.Reason

PLANTED_NAME = "Zyxwvut Plantedname"
PLANTED_EMAIL = "planted-7781@pii.test"
PLANTED_PHONE = "+15550007781"
PLANTED_PARAM = "param-secret-4412"
PLANTED_ERROR = "error-text-9931"
PLANTED = (PLANTED_NAME, PLANTED_EMAIL, PLANTED_PHONE, PLANTED_PARAM, PLANTED_ERROR)


# --- fixtures ------------------------------------------------------------------------------------


def _user(username: str, *codenames: str, groups: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(username, password="pw-" + username, is_staff=True)
    if codenames:
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="tombstones", codename__in=codenames)
        )
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    return user


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(_user("operator", *STAFF_CODENAMES))
    return client


@pytest.fixture
def auditor_client() -> Client:
    call_command("tombstones_roles", verbosity=0)  # idempotent; the migration made the group
    client = Client()
    client.force_login(_user("auditor", groups=(AUDITORS,)))
    return client


@pytest.fixture
def planted() -> Customer:
    return CustomerFactory(name=PLANTED_NAME, email=PLANTED_EMAIL, phone=PLANTED_PHONE)


def _raise_after_send(ctx: Any) -> None:
    # An external call that fails after sending: the outcome is unknown.
    raise RuntimeError(PLANTED_ERROR)


@pytest.fixture
def flaky_external() -> Iterator[list[str]]:
    """An external handler that records the idempotency keys it was called with, then fails."""
    keys: list[str] = []

    def handler(ctx: Any) -> None:
        keys.append(ctx.idempotency_key)
        _raise_after_send(ctx)

    with temp_handler("tests.flaky_external", handler, external=True):
        yield keys


def _uncertain(record: Customer) -> Job:
    job = run(enqueue("tests.flaky_external", record, params={"note": PLANTED_PARAM}))
    assert job.status == Status.UNCERTAIN
    assert job.reason == Reason.OUTCOME_UNKNOWN
    return job


def _rejected(record: Customer) -> Job:
    job = enqueue("customers.update_sheet_row", record, params={"note": PLANTED_PARAM})
    record.delete()
    job = run(job)
    assert job.status == Status.REJECTED
    return job


def _paused(record: Customer, **kwargs: Any) -> Job:
    job = enqueue("customers.update_sheet_row", record, **kwargs)
    record_outcome(claim(job), Status.PAUSED, Reason.TOMBSTONE_UNREADABLE)
    job.refresh_from_db()
    return job


def _html(response: Any) -> str:
    assert response.status_code == 200, (response.status_code, response.get("Location"))
    return response.content.decode()


def _assert_no_pii(text: str, where: str) -> None:
    for value in PLANTED:
        assert value not in text, f"{value!r} leaked into {where}"


def _act(client: Client, job: Job, slug: str, **data: str) -> Any:
    url = reverse("admin:tombstones_job_act", args=(job.pk, slug))
    return client.post(url, {"confirm": "yes", "seen_status": job.status, **data})


# --- job audit -----------------------------------------------------------------------------------


def test_job_audit__list_and_detail_show_ids_and_events_never_params(
    staff_client: Client, planted: Customer, flaky_external: list[str]
) -> None:
    uncertain = _uncertain(planted)
    rejected = _rejected(planted)

    # Long names may wrap at a <wbr> in the list's narrow columns.
    listing = _html(staff_client.get(reverse("admin:tombstones_job_changelist")))
    listing = listing.replace("<wbr>", "")
    ref = f"customers.customer:{planted.pk}"
    assert ref in listing
    assert "g1/v1" in listing  # the snapshot
    assert "source_deleted" in listing
    assert "tests.flaky_external" in listing
    _assert_no_pii(listing, "job list")

    detail = _html(staff_client.get(reverse("admin:tombstones_job_change", args=(rejected.pk,))))
    assert 'id="job-events"' in detail
    for event in ("enqueued", "claimed", "rejected"):
        assert f"<strong>{event}</strong>" in detail
    # The job's params are never shown; the event that says they were erased names no value.
    assert "<strong>params_erased</strong>" in detail
    assert "params" not in detail.lower().replace("parameters of the job", "").replace(
        "<strong>params_erased</strong>", ""
    )
    _assert_no_pii(detail, "job detail")

    detail = _html(staff_client.get(reverse("admin:tombstones_job_change", args=(uncertain.pk,))))
    assert "builtins.RuntimeError" in detail  # the error class, never its text
    _assert_no_pii(detail, "uncertain job detail")


def test_job_audit__is_read_only(staff_client: Client, planted: Customer) -> None:
    job = enqueue("customers.update_sheet_row", planted)
    assert staff_client.get(reverse("admin:tombstones_job_add")).status_code == 403
    url = reverse("admin:tombstones_job_change", args=(job.pk,))
    response = staff_client.post(url, {"status": "succeeded", "handler": "x"})
    assert response.status_code == 403
    delete = staff_client.post(
        reverse("admin:tombstones_job_delete", args=(job.pk,)), {"post": "yes"}
    )
    assert delete.status_code == 403
    job.refresh_from_db()
    assert (job.status, job.handler) == (Status.QUEUED, "customers.update_sheet_row")


def test_job_audit__search_by_job_id_and_record_pk(staff_client: Client) -> None:
    first, second = CustomerFactory(), CustomerFactory()
    job_a = enqueue("customers.update_sheet_row", first)
    job_b = enqueue("customers.update_sheet_row", second)
    url = reverse("admin:tombstones_job_changelist")

    def ids(term: str) -> set[int]:
        response = staff_client.get(url, {"q": term})
        assert response.status_code == 200
        return {job.pk for job in response.context["cl"].result_list}

    assert ids(f"#{job_b.pk}") == {job_b.pk}
    assert ids(f"customers.customer:{first.pk}") == {job_a.pk}
    assert job_a.pk in ids(str(first.pk))  # a bare number: that record's jobs, or that job id
    assert ids("#99999999999999999999999") == set()  # not an id: no error, no match
    assert ids("nothing-like-this") == set()


def test_job_audit__filters_by_status_reason_handler_and_date(
    staff_client: Client, planted: Customer
) -> None:
    rejected = _rejected(planted)
    queued = enqueue("customers.update_sheet_row", CustomerFactory())
    url = reverse("admin:tombstones_job_changelist")

    def ids(**params: str) -> set[int]:
        response = staff_client.get(url, params)
        assert response.status_code == 200, params
        return {job.pk for job in response.context["cl"].result_list}

    assert ids(status__exact="rejected") == {rejected.pk}
    assert ids(reason__exact="source_deleted") == {rejected.pk}
    assert ids(handler="customers.update_sheet_row") == {rejected.pk, queued.pk}
    # The date filter's own links ("Today", "Past 7 days", ...) and the date hierarchy.
    response = staff_client.get(url)
    date_filter = next(f for f in response.context["cl"].filter_specs if f.title == "created at")
    today = next(c for c in date_filter.choices(response.context["cl"]) if c["display"] == "Today")
    response = staff_client.get(url + today["query_string"])
    assert {job.pk for job in response.context["cl"].result_list} == {rejected.pk, queued.pk}
    assert ids(created_at__year="2000") == set()
    year = str(rejected.created_at.year)
    assert ids(created_at__year=year) == {rejected.pk, queued.pk}


# --- rejection log -------------------------------------------------------------------------------


def test_rejection_log__lists_rejections_only_with_expected_and_found(
    staff_client: Client, planted: Customer
) -> None:
    rejected = _rejected(planted)
    other = enqueue("customers.update_sheet_row", CustomerFactory())
    run(other)
    assert Rejection.objects.count() == 1  # the proxy's manager: rejected events only
    assert JobEvent.objects.exclude(event="rejected").exists()  # its claimed and checked

    response = staff_client.get(reverse("admin:tombstones_rejection_changelist"))
    page = _html(response)
    rows = list(response.context["cl"].result_list)
    assert [r.job_id for r in rows] == [rejected.pk]
    row = rows[0]
    assert (row.expected_generation, row.expected_version) == (1, 1)
    assert (row.found_generation, row.found_version) == (1, 2)  # the delete bumped the version
    assert "source_deleted" in page
    assert f"customers.customer:{planted.pk}" in page.replace("<wbr>", "")  # may wrap at a dot
    _assert_no_pii(page, "rejection log")
    # How far back it goes: the audit retention, and the moment it reaches back to.
    since = timezone.localtime(timezone.now() - timedelta(days=365)).strftime("%Y-%m-%d %H:")
    assert "Rejections are kept for 365 days (TOMBSTONES_AUDIT_RETENTION)" in page
    assert f"this log goes back to {since}" in page

    filtered = staff_client.get(
        reverse("admin:tombstones_rejection_changelist"), {"reason__exact": "generation_changed"}
    )
    assert list(filtered.context["cl"].result_list) == []


def test_rejection_log__csv_has_the_list_columns_and_its_filters(
    staff_client: Client, planted: Customer
) -> None:
    rejected = _rejected(planted)
    url = reverse("admin:tombstones_rejection_export")
    response = staff_client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response.streaming  # rows leave as the cursor reads them: any size, little memory
    text = b"".join(response.streaming_content).decode()
    _assert_no_pii(text, "CSV export")
    rows = list(csv.reader(io.StringIO(text)))
    listing = staff_client.get(reverse("admin:tombstones_rejection_changelist"))
    headers = [str(h["text"]) for h in _result_headers(listing)]
    # The list's columns, its g1/v2 snapshots as their two numbers each.
    split = {"expected": ["expected generation", "expected version"]}
    split["found"] = ["found generation", "found version"]
    assert rows[0] == [name for header in headers for name in split.get(header, [header])]
    assert rows[0] == [
        "timestamp",
        "reason",
        "job id",
        "record",
        "expected generation",
        "expected version",
        "found generation",
        "found version",
    ]
    assert rows[1][1:] == [
        "source_deleted",
        str(rejected.pk),
        f"customers.customer:{planted.pk}",
        "1",
        "1",
        "1",
        "2",
    ]
    # The list's filters apply to the export too.
    none = staff_client.get(url, {"reason__exact": "generation_changed"})
    assert len(list(csv.reader(io.StringIO(b"".join(none.streaming_content).decode())))) == 1
    assert staff_client.get(url, {"bogus__lookup": "1"}).status_code in (302, 400)


def _result_headers(response: Any) -> list[dict[str, Any]]:
    from django.contrib.admin.templatetags.admin_list import result_headers

    return [h for h in result_headers(response.context["cl"]) if h.get("text")]


# --- timeline and dashboard ----------------------------------------------------------------------


def test_timeline__draws_generations_deletion_recreation_and_each_job(
    staff_client: Client, planted: Customer
) -> None:
    old = enqueue("customers.update_sheet_row", planted, params={"note": PLANTED_PARAM})
    planted.delete()
    revived = Customer.all_objects.recreate(
        reference=planted.reference, name=PLANTED_NAME, email=PLANTED_EMAIL
    )
    assert revived.generation == 2
    new = enqueue("customers.update_sheet_row", revived)
    run(old)
    run(new)
    old.refresh_from_db()
    new.refresh_from_db()
    assert (old.status, old.reason) == (Status.REJECTED, Reason.GENERATION_CHANGED)
    assert new.status == Status.SUCCEEDED

    ct = ContentType.objects.get_for_model(Customer)
    response = staff_client.get(reverse("admin:tombstones_job_timeline", args=(ct.pk, planted.pk)))
    page = _html(response)
    assert '<svg class="tg-timeline" id="record-timeline"' in page
    # The picture's geometry: everything inside the drawing, each bar left to right, the old
    # job's bar ending (rejected) after the re-creation mark.
    svg = response.context["svg"]
    rows = {row["job"].pk: row for row in svg["rows"]}
    assert all(
        0 < row["x1"] <= row["x2"] < svg["outcome_x"] < svg["width"] for row in rows.values()
    )
    assert all(band["x"] + band["width"] <= svg["width"] for band in svg["bands"])
    recreated = next(mark for mark in svg["marks"] if mark["kind"] == "recreated")
    assert rows[old.pk]["x1"] < recreated["x"] < rows[old.pk]["x2"]
    assert "generation 1" in page
    assert "generation 2" in page
    assert "re-created as g2" in page
    assert f'data-job="{old.pk}"' in page
    assert f'data-job="{new.pk}"' in page
    assert "Rejected (generation_changed)" in page
    assert "Succeeded" in page
    assert planted.reference in page  # the business key: identity
    assert 'id="record-state">live<' in page
    _assert_no_pii(page, "timeline")
    # No asset from a CDN: a URL naming one (a bare "cdn" can be in a random CSRF token).
    assert not re.search(r"//[^\s\"'>]*cdn", page, re.IGNORECASE)


def test_timeline__of_a_tombstone_marks_the_deletion(
    staff_client: Client, planted: Customer
) -> None:
    _rejected(planted)
    ct = ContentType.objects.get_for_model(Customer)
    page = _html(
        staff_client.get(reverse("admin:tombstones_job_timeline", args=(ct.pk, planted.pk)))
    )
    assert 'id="record-state">tombstone<' in page
    assert ">deleted</text>" in page
    _assert_no_pii(page, "tombstone timeline")
    # A malformed pk or a content type that does not exist: a 404, no crash.
    unknown = reverse("admin:tombstones_job_timeline", args=(ct.pk, "not-a-pk"))
    assert staff_client.get(unknown).status_code == 404
    no_type = reverse("admin:tombstones_job_timeline", args=(999999, "1"))
    assert staff_client.get(no_type).status_code == 404


def test_timeline__shows_the_business_key_unless_it_is_personal(
    staff_client: Client, planted: Customer, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue("customers.update_sheet_row", planted)
    ct = ContentType.objects.get_for_model(Customer)
    timeline = reverse("admin:tombstones_job_timeline", args=(ct.pk, planted.pk))
    assert planted.reference in _html(staff_client.get(timeline))

    # As tombstone_identity(): a business key that is a personal field is not identity.
    monkeypatch.setattr(
        Customer, "_tombstone_options", TombstoneOptions("reference", ("reference", "name"))
    )
    page = _html(staff_client.get(timeline))
    assert planted.reference not in page
    assert "business key" not in page


def test_dashboard__counts_blocked_lanes_uncertain_escalations_and_chart(
    staff_client: Client, planted: Customer, flaky_external: list[str]
) -> None:
    uncertain = _uncertain(CustomerFactory())
    _rejected(planted)
    blocked_record = CustomerFactory()
    head = _paused(blocked_record)
    behind = enqueue("customers.update_sheet_row", blocked_record)
    escalated = run(enqueue("customers.update_sheet_row", CustomerFactory()))
    assert escalated.status == Status.SUCCEEDED
    Job.objects.filter(pk=escalated.pk).update(status=Status.ESCALATED, reason="record_missing")

    response = staff_client.get(reverse("admin:tombstones_job_dashboard"))
    page = _html(response)
    counts = {value: n for value, _, n in response.context["status_counts"]}
    assert counts[Status.REJECTED] == 1
    assert counts[Status.UNCERTAIN] == 1
    assert counts[Status.PAUSED] == 1
    assert counts[Status.QUEUED] == 1
    lanes = response.context["blocked_lanes"]
    assert [(lane.head.pk, lane.behind) for lane in lanes] == [(head.pk, 1)]
    assert "paused" in lanes[0].why
    assert behind.pk not in [lane.head.pk for lane in lanes]
    assert [j.pk for j in response.context["uncertain_jobs"]] == [uncertain.pk]
    assert [j.pk for j in response.context["escalated_jobs"]] == [escalated.pk]
    assert response.context["rejection_chart"]["total"] == 1
    assert '<svg class="tg-svg" id="rejections-chart"' in page
    assert 'data-count="1"' in page
    _assert_no_pii(page, "dashboard")
    # The index entry leads to it, and the proxy has no page of its own beyond that.
    index = _html(staff_client.get(reverse("admin:index")))
    assert reverse("admin:tombstones_dashboard_changelist") in index
    entry = staff_client.get(reverse("admin:tombstones_dashboard_changelist"))
    assert entry.status_code == 302
    assert entry["Location"] == reverse("admin:tombstones_job_dashboard")
    assert staff_client.get(f"/admin/tombstones/dashboard/{head.pk}/change/").status_code == 404


# --- staff actions -------------------------------------------------------------------------------


def test_resolve__delivered_marks_success_and_logs_ids_only(
    staff_client: Client, planted: Customer, flaky_external: list[str]
) -> None:
    job = _uncertain(planted)
    confirm = _html(
        staff_client.get(reverse("admin:tombstones_job_act", args=(job.pk, "resolve-delivered")))
    )
    assert 'name="seen_status" value="uncertain"' in confirm
    job.refresh_from_db()
    assert job.status == Status.UNCERTAIN  # a GET changes nothing

    response = _act(staff_client, job, "resolve-delivered")
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.status, job.reason) == (Status.SUCCEEDED, "")
    assert job.events.filter(event="resolved").count() == 1
    assert flaky_external == [job.idempotency_key]  # nothing was sent again
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert "resolve-delivered" in entry.change_message
    _assert_no_pii(entry.change_message + entry.object_repr, "LogEntry")


def test_resolve__resend_happens_once_with_the_same_idempotency_key(
    staff_client: Client,
    planted: Customer,
    flaky_external: list[str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    job = _uncertain(planted)
    with django_capture_on_commit_callbacks(execute=True):
        response = _act(staff_client, job, "resolve-resend")
    assert response.status_code == 302
    job.refresh_from_db()
    # The worker ran it again (sync broker): same job, same key, uncertain again.
    assert flaky_external == [job.idempotency_key, job.idempotency_key]
    assert job.status == Status.UNCERTAIN
    assert list(job.events.filter(event="resolved").values_list("reason", flat=True)) == [
        "outcome_unknown"
    ]

    # A second resend is neither offered nor carried out.
    page = _html(staff_client.get(reverse("admin:tombstones_job_change", args=(job.pk,))))
    assert 'data-action="resolve-resend"' not in page
    assert 'data-action="resolve-delivered"' in page
    with django_capture_on_commit_callbacks(execute=True):
        _act(staff_client, job, "resolve-resend")
    job.refresh_from_db()
    assert job.status == Status.UNCERTAIN
    assert len(flaky_external) == 2
    assert job.events.filter(event="resolved").count() == 1


def test_resolve__resend_of_a_record_deleted_meanwhile_is_rejected(
    staff_client: Client,
    planted: Customer,
    flaky_external: list[str],
    django_capture_on_commit_callbacks: Any,
) -> None:
    job = _uncertain(planted)
    planted.delete()
    with django_capture_on_commit_callbacks(execute=True):
        _act(staff_client, job, "resolve-resend")
    job.refresh_from_db()
    assert (job.status, job.reason) == (Status.REJECTED, Reason.SOURCE_DELETED)
    assert len(flaky_external) == 1


def test_resume__paused_job_runs_again(
    staff_client: Client, planted: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    job = _paused(planted)
    with django_capture_on_commit_callbacks(execute=True):
        _act(staff_client, job, "resume")
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED
    assert job.events.filter(event="resumed").count() == 1


def test_cancel__queued_job_is_cancelled_and_never_runs(
    staff_client: Client, planted: Customer
) -> None:
    job = enqueue("customers.update_sheet_row", planted)
    _act(staff_client, job, "cancel")
    job.refresh_from_db()
    assert (job.status, job.reason) == (Status.CANCELLED, Reason.CANCELLED_BY_STAFF)
    run(job)
    assert job.status == Status.CANCELLED
    assert job.events.filter(event="cancelled").count() == 1


def test_skip__blocked_head_is_cancelled_and_the_next_job_runs(
    staff_client: Client, planted: Customer, django_capture_on_commit_callbacks: Any
) -> None:
    head = _paused(planted)
    behind = enqueue("customers.update_sheet_row", planted)
    assert run(behind).status == Status.QUEUED  # blocked behind the head
    # Only the head offers "skip".
    page = _html(staff_client.get(reverse("admin:tombstones_job_change", args=(behind.pk,))))
    assert 'data-action="skip"' not in page
    page = _html(staff_client.get(reverse("admin:tombstones_job_change", args=(head.pk,))))
    assert 'data-action="skip"' in page
    refused = _act(staff_client, behind, "skip")  # not the head: the fence refuses it
    assert refused.status_code == 302
    behind.refresh_from_db()
    assert behind.status == Status.QUEUED

    with django_capture_on_commit_callbacks(execute=True):
        _act(staff_client, head, "skip")
    head.refresh_from_db()
    behind.refresh_from_db()
    assert (head.status, head.reason) == (Status.CANCELLED, Reason.CANCELLED_BY_STAFF)
    assert head.events.filter(event="skipped").count() == 1
    assert behind.status == Status.SUCCEEDED


# --- bad input -----------------------------------------------------------------------------------


def test_actions__forged_post_without_permission_is_refused(
    auditor_client: Client, planted: Customer
) -> None:
    job = enqueue("customers.update_sheet_row", planted)
    for slug in ("cancel", "skip"):
        response = _act(auditor_client, job, slug)
        assert response.status_code == 403
        confirm_page = reverse("admin:tombstones_job_act", args=(job.pk, slug))
        assert auditor_client.get(confirm_page).status_code == 403
    viewer = Client()
    viewer.force_login(_user("viewer", "view_job"))  # may look, may not cancel
    assert _act(viewer, job, "cancel").status_code == 403
    job.refresh_from_db()
    assert job.status == Status.QUEUED
    assert not job.events.exclude(event="enqueued").exists()
    assert not LogEntry.objects.exists()


def test_actions__tampered_or_stale_confirmation_changes_nothing(
    staff_client: Client, planted: Customer
) -> None:
    job = enqueue("customers.update_sheet_row", planted)
    # A status the action never applies to, a missing confirmation, a stale status.
    _act(staff_client, job, "cancel", seen_status="succeeded")
    staff_client.post(
        reverse("admin:tombstones_job_act", args=(job.pk, "cancel")), {"seen_status": "queued"}
    )
    Job.objects.filter(pk=job.pk).update(status=Status.RETRY_WAIT)
    _act(staff_client, job, "cancel", seen_status="queued")
    job.refresh_from_db()
    assert job.status == Status.RETRY_WAIT
    assert not job.events.exclude(event="enqueued").exists()
    # An unknown action or job is a 404, not a crash.
    assert _act(staff_client, job, "delete-everything").status_code == 404
    missing = staff_client.post(reverse("admin:tombstones_job_act", args=(987654, "cancel")))
    assert missing.status_code == 404


def test_actions__csrf_stays_on(planted: Customer) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(_user("operator", *STAFF_CODENAMES))
    job = enqueue("customers.update_sheet_row", planted)
    assert _act(client, job, "cancel").status_code == 403
    job.refresh_from_db()
    assert job.status == Status.QUEUED


def test_every_audit_page_requires_a_staff_login(planted: Customer) -> None:
    job = _rejected(planted)
    ct = ContentType.objects.get_for_model(Customer)
    urls = [
        reverse("admin:tombstones_job_changelist"),
        reverse("admin:tombstones_job_change", args=(job.pk,)),
        reverse("admin:tombstones_job_dashboard"),
        reverse("admin:tombstones_job_timeline", args=(ct.pk, planted.pk)),
        reverse("admin:tombstones_job_act", args=(job.pk, "cancel")),
        reverse("admin:tombstones_rejection_changelist"),
        reverse("admin:tombstones_rejection_export"),
        reverse("admin:tombstones_jobevent_changelist"),
    ]
    anonymous = Client()
    not_staff = Client()
    not_staff.force_login(User.objects.create_user("visitor", password="pw"))
    for url in urls:
        for client in (anonymous, not_staff):
            response = client.get(url)
            assert response.status_code == 302, url
            assert response["Location"].startswith(reverse("admin:login")), url
    # Staff without the view permission: refused as well.
    bare = Client()
    bare.force_login(_user("bare"))
    for url in urls:
        assert bare.get(url).status_code == 403, url


# --- roles ---------------------------------------------------------------------------------------


def test_auditors_group__is_made_by_the_migration_with_view_permissions_only() -> None:
    group = Group.objects.get(name=AUDITORS)
    got = set(group.permissions.values_list("content_type__app_label", "codename"))
    assert got == set(AUDITOR_PERMISSIONS)
    assert all(codename.startswith("view_") for _, codename in got)


def test_tombstones_roles__repairs_the_group() -> None:
    group = Group.objects.get(name=AUDITORS)
    group.permissions.add(Permission.objects.get(codename="change_customer"))
    group.permissions.remove(Permission.objects.get(codename="view_rejection"))
    out = io.StringIO()
    call_command("tombstones_roles", stdout=out)
    got = set(group.permissions.values_list("content_type__app_label", "codename"))
    assert got == set(AUDITOR_PERMISSIONS)
    assert "Removed 1" in out.getvalue()
    Group.objects.filter(name=AUDITORS).delete()
    call_command("tombstones_roles", verbosity=0)
    assert Group.objects.get(name=AUDITORS).permissions.count() == len(AUDITOR_PERMISSIONS)


def test_auditor__sees_every_audit_page_without_personal_data_and_no_actions(
    auditor_client: Client, planted: Customer, flaky_external: list[str]
) -> None:
    rejected = _rejected(planted)
    # The rejected record comes back with its personal data: a rejection page that showed the
    # record's fields would leak them.
    Customer.all_objects.recreate(
        reference=planted.reference, name=PLANTED_NAME, email=PLANTED_EMAIL, phone=PLANTED_PHONE
    )
    uncertain = _uncertain(CustomerFactory(name=PLANTED_NAME + " 2", email="x" + PLANTED_EMAIL))
    ct = ContentType.objects.get_for_model(Customer)
    rejection = Rejection.objects.get(job=rejected)
    rejection_page = reverse("admin:tombstones_rejection_change", args=(rejection.pk,))
    pages = [
        reverse("admin:index"),
        reverse("admin:app_list", args=("tombstones",)),
        reverse("admin:tombstones_job_changelist"),
        reverse("admin:tombstones_job_change", args=(rejected.pk,)),
        reverse("admin:tombstones_job_change", args=(uncertain.pk,)),
        reverse("admin:tombstones_job_history", args=(rejected.pk,)),
        reverse("admin:tombstones_job_dashboard"),
        reverse("admin:tombstones_job_timeline", args=(ct.pk, planted.pk)),
        reverse("admin:tombstones_rejection_changelist"),
        rejection_page,
        reverse("admin:tombstones_jobevent_changelist"),
        reverse("admin:tombstones_jobevent_change", args=(rejection.pk,)),
    ]
    for url in pages:
        page = _html(auditor_client.get(url))
        _assert_no_pii(page, url)
        assert "data-action=" not in page, url
    # The rejection's own page, with what the auditor needs: its reason, job and record.
    detail = _html(auditor_client.get(rejection_page))
    assert "source_deleted" in detail
    assert reverse("admin:tombstones_job_change", args=(rejected.pk,)) in detail
    assert f"customers.customer:{planted.pk}" in detail.replace("<wbr>", "")
    export = auditor_client.get(reverse("admin:tombstones_rejection_export"))
    csv_text = b"".join(export.streaming_content).decode()
    assert str(rejected.pk) in csv_text
    # No business records at all, so no personal fields.
    assert _customer_admin()
    for url in (
        reverse("admin:customers_customer_changelist"),
        reverse("admin:customers_customer_add"),
        reverse("admin:customers_customer_change", args=(planted.pk,)),
    ):
        assert auditor_client.get(url).status_code == 403, url


def _customer_admin() -> bool:
    from django.contrib import admin

    return Customer in admin.site._registry
