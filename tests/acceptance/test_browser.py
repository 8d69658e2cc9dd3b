"""Real-browser tests: Playwright drives Debian's chromium against the live test server.

- Staff deletes a customer and sees the tombstone; a queued job for it is rejected by a real
  django-q2 worker (a ``manage.py qcluster`` process on the test database).
- An auditor sees the rejection log; no page the auditor can reach contains planted personal
  data; customer pages and staff actions are refused.
- The timeline and the dashboard render (screenshots in artifacts/screenshots/).
- Bad input: a forged action POST without permission, a tampered version field, a tampered
  confirmation: nothing changes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urldefrag, urljoin, urlsplit

import pytest
from django.conf import settings as django_settings
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from project.customers.models import Customer, SheetRow
from tests.factories import CustomerFactory, SheetRowFactory
from tests.jobkit import STAFF_CODENAMES
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job, JobEvent
from tombstones.roles import AUDITORS
from tombstones.worker import run as run_worker

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

PLANTED_NAME = "Zyxwvut Plantedname"
PLANTED_EMAIL = "planted-7781@pii.test"
PASSWORD = "a-long-test-password-5521"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does it)",
    ),
]

STAFF_PERMISSIONS = {
    "customers": ("view_customer", "change_customer", "delete_customer", "view_sheetrow"),
    "tombstones": STAFF_CODENAMES,
}


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _broker_not_inline(settings: Any) -> None:
    # Wake-ups go to the ORM broker (no cluster unless a test starts one): each test decides
    # when a job runs, through a real worker or the worker's own function.
    settings.TOMBSTONES_Q_OPTIONS = {}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # between browser steps are plain synchronous code.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            try:
                yield chromium
            finally:
                chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    try:
        yield tab
    finally:
        context.close()


def _staff() -> User:
    user = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    for app_label, codenames in STAFF_PERMISSIONS.items():
        user.user_permissions.add(
            *Permission.objects.filter(content_type__app_label=app_label, codename__in=codenames)
        )
    return user


def _auditor() -> User:
    call_command("tombstones_roles", verbosity=0)  # a flushed test database has no group
    user = User.objects.create_user("auditor", password=PASSWORD, is_staff=True)
    user.groups.add(Group.objects.get(name=AUDITORS))
    return user


def _login(page: Any, live_server: Any, user: User) -> None:
    page.goto(f"{live_server.url}{reverse('admin:login')}")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")


def _shot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def _database_url() -> str:
    """The test database as a DATABASE_URL for a worker process (django-environ syntax)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}{port}/{db['NAME']}"


def _wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Cluster:
    """A real ``manage.py qcluster`` on the test database (one worker), stopped by its pid."""

    def __init__(self, log: Path) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": _database_url(),
            "Q_WORKERS": "1",
            "Q_SYNC": "false",
            "DJANGO_SETTINGS_MODULE": "project.settings",
        }
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: its worker children stop with it
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            # The cluster's own shutdown (SIGTERM to its main process) stops its workers.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._out.close()


# --- staff ---------------------------------------------------------------------------------------


def test_browser__staff_deletes_a_customer_and_a_real_worker_rejects_its_queued_job(
    page: Any, live_server: Any
) -> None:
    staff = _staff()
    row = SheetRowFactory(customer__name=PLANTED_NAME, customer__email=PLANTED_EMAIL)
    customer = row.customer
    job = enqueue("customers.update_sheet_row", customer)
    assert Job.objects.get(pk=job.pk).status == Job.Status.QUEUED  # nobody ran it yet

    _login(page, live_server, staff)
    page.goto(f"{live_server.url}{reverse('admin:customers_customer_delete', args=(customer.pk,))}")
    _shot(page, "01-staff-delete-confirmation")
    page.click("#content form input[type=submit]")
    page.wait_for_selector(".messagelist")

    tomb = Customer.all_objects.get(pk=customer.pk)
    assert tomb.deleted_at is not None
    assert (tomb.generation, tomb.version) == (1, 2)
    assert PLANTED_NAME not in (tomb.name, tomb.email)  # personal fields erased
    assert not Customer.objects.filter(pk=customer.pk).exists()

    # The tombstone, by identity, in the tombstone filter of the customer list.
    page.goto(
        f"{live_server.url}{reverse('admin:customers_customer_changelist')}?records=tombstones"
    )
    listing = page.content()
    assert customer.reference in listing
    _shot(page, "02-staff-tombstone-list")

    # A real django-q2 worker takes the queued job's message and rejects it.
    cluster = Cluster(SCREENSHOTS.parent / "qcluster-browser.log")
    try:
        _wait_for(
            lambda: Job.objects.get(pk=job.pk).status not in Job.UNFINISHED,
            timeout=90,
            what="the qcluster worker to finish the job",
        )
    finally:
        cluster.stop()
    job.refresh_from_db()
    assert (job.status, job.reason) == (Job.Status.REJECTED, Job.Reason.SOURCE_DELETED)
    assert job.owner  # the worker that held the lease: another process, not this one
    assert job.owner.split(":")[-1] != str(os.getpid())
    row.refresh_from_db()
    assert row.synced_version is None  # nothing was written
    assert row.name_hash == ""

    page.goto(f"{live_server.url}{reverse('admin:tombstones_job_change', args=(job.pk,))}")
    detail = page.content()
    assert "source_deleted" in detail
    assert page.locator("#job-events strong", has_text="rejected").count() == 1
    _shot(page, "03-staff-rejected-job")

    # The tombstone's own page links to the record timeline, which shows the deletion and the
    # rejected job.
    page.goto(f"{live_server.url}{reverse('admin:customers_customer_change', args=(customer.pk,))}")
    page.click("a.timelinelink")
    page.wait_for_selector("svg#record-timeline")
    assert page.locator("#record-state").inner_text() == "tombstone"
    assert page.locator("svg#record-timeline g.mark-deleted").count() == 1
    assert page.locator(f'svg#record-timeline g.job-rejected[data-job="{job.pk}"]').count() == 1
    _shot(page, "03b-tombstone-timeline")

    # The admin's own log of the deletion names the record by identity only.
    entries = list(LogEntry.objects.values_list("object_repr", "change_message"))
    assert entries
    for repr_, message in entries:
        assert PLANTED_NAME not in repr_ + message
        assert PLANTED_EMAIL not in repr_ + message


# --- auditor -------------------------------------------------------------------------------------


def _crawl(page: Any, start: str, limit: int = 250) -> dict[str, str]:
    """Every admin page reachable from ``start`` by following links: {url: html}."""
    base = urlsplit(start)
    todo, seen, pages = [start], {start}, {}
    logout = reverse("admin:logout")
    while todo and len(pages) < limit:
        url = todo.pop(0)
        response = page.request.get(url, max_redirects=0)
        if response.status != 200:
            continue
        body = response.text()
        pages[url] = body
        if not response.headers.get("content-type", "").startswith("text/html"):
            continue
        for href in _links(body):
            target = urldefrag(urljoin(url, href))[0]
            parts = urlsplit(target)
            if parts.netloc != base.netloc or not parts.path.startswith("/admin/"):
                continue
            if parts.path.startswith(logout) or target in seen:
                continue
            seen.add(target)
            todo.append(target)
    return pages


def _links(html: str) -> list[str]:
    from html.parser import HTMLParser

    found: list[str] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "a":
                href = dict(attrs).get("href")
                if href and not href.startswith(("javascript:", "mailto:")):
                    found.append(href)

    Parser().feed(html)
    return found


def test_browser__auditor_reads_the_rejection_log_and_never_sees_personal_data(
    page: Any, live_server: Any
) -> None:
    auditor = _auditor()
    # A customer deleted under its queued job (rejected), one live customer with personal data
    # and jobs whose params carry it (params are never shown).
    gone = CustomerFactory(name=PLANTED_NAME + " Gone", email="gone-" + PLANTED_EMAIL)
    rejected = enqueue("customers.update_sheet_row", gone, params={"note": "param-secret-4412"})
    gone.delete()
    run_worker(rejected.pk)
    rejected.refresh_from_db()
    assert rejected.status == Job.Status.REJECTED
    # The deleted customer comes back with its personal data: a rejection page that showed the
    # record's fields would leak them.
    Customer.all_objects.recreate(
        reference=gone.reference, name=PLANTED_NAME + " Gone", email="gone-" + PLANTED_EMAIL
    )
    live = CustomerFactory(name=PLANTED_NAME, email=PLANTED_EMAIL)
    queued = enqueue("customers.update_sheet_row", live, params={"note": "param-secret-4412"})
    event = JobEvent.objects.get(job=rejected, event="rejected")

    _login(page, live_server, auditor)
    page.goto(f"{live_server.url}{reverse('admin:tombstones_rejection_changelist')}")
    table = page.locator("#result_list")
    row_text = table.inner_text()
    assert "source_deleted" in row_text
    assert str(rejected.pk) in row_text
    assert f"customers.customer:{gone.pk}" in row_text
    assert page.locator("#result_list td.field-timestamp, #result_list th.field-timestamp").count()
    assert event.created_at.strftime("%Y") in row_text  # the timestamp column
    _shot(page, "04-auditor-rejection-log")

    pages = _crawl(page, f"{live_server.url}/admin/")
    visited = {urlsplit(url).path for url in pages}
    # The crawl really reached the audit pages, the job detail, the timeline and the CSV.
    for must in (
        reverse("admin:tombstones_job_changelist"),
        reverse("admin:tombstones_job_change", args=(rejected.pk,)),
        reverse("admin:tombstones_job_change", args=(queued.pk,)),
        reverse("admin:tombstones_rejection_changelist"),
        reverse("admin:tombstones_rejection_change", args=(event.pk,)),
        reverse("admin:tombstones_rejection_export"),
        reverse("admin:tombstones_job_dashboard"),
        reverse(
            "admin:tombstones_job_timeline",
            args=(ContentType.objects.get_for_model(Customer).pk, live.pk),
        ),
    ):
        assert must in visited, (must, sorted(visited))
    assert len(pages) >= 20
    for url, html in pages.items():
        assert PLANTED_NAME not in html, url
        assert PLANTED_EMAIL not in html, url
    assert not any(path.startswith("/admin/customers/") for path in visited)

    # Customer pages, with their personal fields: refused.
    for url in (
        reverse("admin:customers_customer_changelist"),
        reverse("admin:customers_customer_change", args=(live.pk,)),
    ):
        response = page.goto(f"{live_server.url}{url}")
        assert response.status == 403, url
        assert PLANTED_NAME not in page.content()
    # Staff actions: not offered, and refused when forged (with a valid CSRF token).
    page.goto(f"{live_server.url}{reverse('admin:tombstones_job_change', args=(queued.pk,))}")
    assert page.locator(".tg-action").count() == 0
    act = reverse("admin:tombstones_job_act", args=(queued.pk, "cancel"))
    assert page.goto(f"{live_server.url}{act}").status == 403
    forged = _forged_post(page, live_server, act, {"confirm": "yes", "seen_status": "queued"})
    assert forged == 403
    queued.refresh_from_db()
    assert queued.status == Job.Status.QUEUED
    assert not queued.events.exclude(event="enqueued").exists()


def _forged_post(page: Any, live_server: Any, path: str, data: dict[str, str]) -> int:
    """POST from the logged-in page itself, with the CSRF cookie's token: only permission
    checks can refuse it."""
    script = """async ([url, data]) => {
        const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken='));
        const body = new URLSearchParams(data);
        body.append('csrfmiddlewaretoken', token ? token.split('=')[1] : '');
        const r = await fetch(url, {method: 'POST', body, redirect: 'manual',
                                    headers: {'X-CSRFToken': token ? token.split('=')[1] : ''}});
        return r.status;
    }"""
    return int(page.evaluate(script, [f"{live_server.url}{path}", data]))


# --- timeline and dashboard ----------------------------------------------------------------------


def test_browser__timeline_and_dashboard_render_the_race(page: Any, live_server: Any) -> None:
    staff = _staff()
    customer = CustomerFactory()
    SheetRow.objects.create(customer=customer, reference=f"row-{customer.reference}")
    old = enqueue("customers.update_sheet_row", customer)
    customer.delete()
    revived = Customer.all_objects.recreate(
        reference=customer.reference, name="Second Life", email="second@example.test"
    )
    new = enqueue("customers.update_sheet_row", revived)
    run_worker(old.pk)  # runs every due job: the old one and the new one
    old.refresh_from_db()
    new.refresh_from_db()
    assert (old.status, old.reason) == (Job.Status.REJECTED, Job.Reason.GENERATION_CHANGED)
    assert new.status == Job.Status.SUCCEEDED

    _login(page, live_server, staff)
    # From the record's change page to its timeline.
    page.goto(f"{live_server.url}{reverse('admin:customers_customer_change', args=(revived.pk,))}")
    page.click("a.timelinelink")
    page.wait_for_selector("svg#record-timeline")
    svg = page.locator("svg#record-timeline")
    assert svg.is_visible()
    box = svg.bounding_box()
    assert box is not None
    assert box["width"] > 300
    assert box["height"] > 100
    assert page.locator("svg#record-timeline g.generation").count() == 2
    assert page.locator(f'svg#record-timeline g.job[data-job="{old.pk}"]').count() == 1
    assert page.locator("svg#record-timeline g.job-rejected").count() == 1
    assert page.locator("svg#record-timeline g.job-succeeded").count() == 1
    assert "re-created as g2" in svg.inner_html()
    _shot(page, "05-timeline")

    page.goto(f"{live_server.url}{reverse('admin:index')}")
    page.click(f"a[href='{reverse('admin:tombstones_dashboard_changelist')}']")
    page.wait_for_selector("svg#rejections-chart")
    assert page.locator('#status-counts [data-status="rejected"] .n').inner_text() == "1"
    assert page.locator('#status-counts [data-status="succeeded"] .n').inner_text() == "1"
    assert page.locator('svg#rejections-chart g.bar[data-count="1"]').count() == 1
    _shot(page, "06-dashboard")


# The timeline's text: its box in the page and its size on screen (CSS size x the drawing's scale).
_TIMELINE_TEXTS = """svg => [...svg.querySelectorAll('text')].map(t => {
    const r = t.getBoundingClientRect();
    const size = parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a;
    return {text: t.textContent.trim(), x: r.left, y: r.top, width: r.width, height: r.height,
            size: size};
})"""
_RECTS = """els => els.map(e => {
    const r = e.getBoundingClientRect(); return {x: r.left, right: r.right};
})"""


def _timeline(page: Any, live_server: Any, record: Customer) -> Any:
    content_type = ContentType.objects.get_for_model(Customer)
    page.goto(
        f"{live_server.url}"
        f"{reverse('admin:tombstones_job_timeline', args=(content_type.pk, record.pk))}"
    )
    return page.locator("svg#record-timeline")


def _assert_timeline_text_readable_and_apart(svg: Any, what: str) -> None:
    texts = svg.evaluate(_TIMELINE_TEXTS)
    assert len(texts) > 4, what
    for t in texts:
        assert t["size"] >= 12, (what, t)  # issue 24: 9-10 px
    for i, a in enumerate(texts):
        for b in texts[i + 1 :]:
            assert not _boxes_overlap(a, b), (what, a["text"], b["text"], a, b)


def test_browser__timeline_labels_apart_readable_and_bars_end_at_the_outcome(
    page: Any, live_server: Any
) -> None:
    """Issue 24, point 3: labels on top of each other, a succeeded job's bar across the deletion,
    9-10 px text."""
    staff = _staff()
    customer = CustomerFactory()
    SheetRow.objects.create(customer=customer, reference=f"row-{customer.reference}")
    done = enqueue("customers.update_sheet_row", customer, params={"note": "ids only"})
    run_worker(done.pk)
    late = enqueue("customers.update_sheet_row", customer)
    customer.delete()  # erases the params of `done`: a params_erased event after the deletion
    run_worker(late.pk)
    done.refresh_from_db()
    late.refresh_from_db()
    assert done.status == Job.Status.SUCCEEDED
    assert (late.status, late.reason) == (Job.Status.REJECTED, Job.Reason.SOURCE_DELETED)
    assert done.events.filter(event=JobEvent.Event.PARAMS_ERASED).exists()
    _login(page, live_server, staff)

    # The tombstone: the succeeded job's bar and dots end before the "deleted" line.
    svg = _timeline(page, live_server, customer)
    _shot(page, "13-timeline-tombstone")
    (deleted,) = svg.locator("g.mark-deleted line").evaluate_all(_RECTS)
    bar = svg.locator(f'g.job[data-job="{done.pk}"]')
    (line,) = bar.locator("line").evaluate_all(_RECTS)
    dots = bar.locator("circle").evaluate_all(_RECTS)
    assert len(dots) >= 2
    assert line["right"] < deleted["x"], (line, deleted)
    assert max(d["right"] for d in dots) < deleted["x"], (dots, deleted)
    # The rejected job found the tombstone: its outcome is after the deletion.
    (rejected,) = svg.locator(f'g.job[data-job="{late.pk}"] line').evaluate_all(_RECTS)
    assert rejected["right"] > deleted["x"]
    _assert_timeline_text_readable_and_apart(svg, "tombstone")

    # Re-created, a job on the new generation: "tombstone seen" and "re-created as g2" are a
    # step apart, their labels on two lines; the text is readable at 1280 and 1440 px.
    revived = Customer.all_objects.recreate(
        reference=customer.reference, name="Second Life", email="second@example.test"
    )
    fresh = enqueue("customers.update_sheet_row", revived)
    run_worker(fresh.pk)
    for width in (1280, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        svg = _timeline(page, live_server, revived)
        _shot(page, f"14-timeline-recreated-{width}")
        labels = [t.text_content().strip() for t in svg.locator("text").all()]
        assert "tombstone seen" in labels
        assert "re-created as g2" in labels
        _assert_timeline_text_readable_and_apart(svg, f"re-created at {width}")
        _within_viewport(page, svg.bounding_box(), "timeline")
        _no_horizontal_scroll(page, "timeline")


# --- bad input -----------------------------------------------------------------------------------


def test_browser__tampered_version_and_forged_actions_change_nothing(
    page: Any, live_server: Any
) -> None:
    staff = _staff()
    customer = CustomerFactory(phone="+15550001111")
    _login(page, live_server, staff)

    # A tampered (generation, version) in the change form: refused, nothing written.
    page.goto(f"{live_server.url}{reverse('admin:customers_customer_change', args=(customer.pk,))}")
    page.fill("#id_phone", "+15559999999")
    page.evaluate("document.querySelector('input[name=opened_version]').value = '7'")
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    _shot(page, "07-tampered-version")
    fresh = Customer.all_objects.get(pk=customer.pk)
    assert (fresh.phone, fresh.version) == ("+15550001111", 1)

    # A tampered confirmation of a staff action: the job stays as it was.
    job = enqueue("customers.update_sheet_row", customer)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.PAUSED)  # a lane head to skip
    page.goto(f"{live_server.url}{reverse('admin:tombstones_job_act', args=(job.pk, 'skip'))}")
    page.evaluate("document.querySelector('input[name=seen_status]').value = 'succeeded'")
    page.click("#confirm-action")
    page.wait_for_selector(".messagelist .error")
    job.refresh_from_db()
    assert job.status == Job.Status.PAUSED

    # The real two-step path works: confirm page, then the POST.
    page.goto(f"{live_server.url}{reverse('admin:tombstones_job_act', args=(job.pk, 'skip'))}")
    _shot(page, "08-confirm-skip")
    page.click("#confirm-action")
    page.wait_for_selector(".messagelist .success")
    job.refresh_from_db()
    assert (job.status, job.reason) == (Job.Status.CANCELLED, Job.Reason.CANCELLED_BY_STAFF)

    # Staff without the permission for an action: a forged POST is refused.
    other = enqueue("customers.update_sheet_row", CustomerFactory())
    staff.user_permissions.remove(Permission.objects.get(codename="cancel_job"))
    act = reverse("admin:tombstones_job_act", args=(other.pk, "cancel"))
    assert _forged_post(page, live_server, act, {"confirm": "yes", "seen_status": "queued"}) == 403
    other.refresh_from_db()
    assert other.status == Job.Status.QUEUED
    assert django_settings.CSRF_COOKIE_HTTPONLY is False  # the forged POST really had a token


# --- layout at common screen widths --------------------------------------------------------------


def _boxes_overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return not (
        a["x"] + a["width"] <= b["x"]
        or b["x"] + b["width"] <= a["x"]
        or a["y"] + a["height"] <= b["y"]
        or b["y"] + b["height"] <= a["y"]
    )


def _within_viewport(page: Any, box: dict[str, float] | None, what: str) -> None:
    width = page.evaluate("window.innerWidth")
    assert box is not None, what
    assert box["x"] >= 0, (what, box)
    assert box["x"] + box["width"] <= width, (what, box, width)


def _within(inner: dict[str, float] | None, outer: dict[str, float] | None) -> None:
    assert inner is not None
    assert outer is not None
    assert inner["x"] >= outer["x"], (inner, outer)
    assert inner["x"] + inner["width"] <= outer["x"] + outer["width"], (inner, outer)


def _no_horizontal_scroll(page: Any, what: str) -> None:
    scroll, client = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert scroll <= client, (what, scroll, client)


def _race_with_history(jobs: int) -> tuple[Customer, list[Job]]:
    """A record deleted and re-created, its old job rejected, many jobs after: a wide history."""
    customer = CustomerFactory()
    SheetRow.objects.create(customer=customer, reference=f"row-{customer.reference}")
    old = enqueue("customers.update_sheet_row", customer)
    customer.delete()
    revived = Customer.all_objects.recreate(
        reference=customer.reference, name="Second Life", email="second@example.test"
    )
    later = [enqueue("customers.update_sheet_row", revived) for _ in range(jobs)]
    run_worker(old.pk)
    return revived, [old, *later]


@pytest.mark.parametrize("width", [1280, 1400])
def test_browser__job_page_list_and_timeline_fit_the_screen(
    browser: Any, live_server: Any, width: int
) -> None:
    staff = _staff()
    record, jobs = _race_with_history(jobs=12)
    uncertain = jobs[-1]
    Job.objects.filter(pk=uncertain.pk).update(
        status=Job.Status.UNCERTAIN, reason=Job.Reason.OUTCOME_UNKNOWN
    )
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        _login(page, live_server, staff)

        # The job page: three resolve buttons, the timeline and history; none covers the heading.
        page.goto(
            f"{live_server.url}{reverse('admin:tombstones_job_change', args=(uncertain.pk,))}"
        )
        _shot(page, f"10-job-page-{width}")
        buttons = page.locator(".object-tools a")
        assert buttons.count() >= 5
        headings = page.locator("#content h1, #content h2").first
        for heading in (page.locator("#content h1"), page.locator("#content > h2")):
            if not heading.count():
                continue
            heading_box = heading.first.bounding_box()
            assert heading_box is not None
            for i in range(buttons.count()):
                box = buttons.nth(i).bounding_box()
                assert box is not None
                assert not _boxes_overlap(box, heading_box), (buttons.nth(i).inner_text(), width)
                _within_viewport(page, box, buttons.nth(i).inner_text())
        assert headings.count()
        # The styles come from the static file, through the admin's Media.
        assert page.locator('link[href$="tombstones/admin.css"]').count() == 1
        assert "<style" not in page.content()

        # The Jobs list: the time columns are on screen, no horizontal scroll.
        page.goto(f"{live_server.url}{reverse('admin:tombstones_job_changelist')}")
        _shot(page, f"11-jobs-list-{width}")
        for column in ("created", "started", "finished"):
            header = page.locator(
                f"#result_list th.column-{column}, #result_list th.column-{column}_at"
            )
            assert header.count() == 1, column
            _within_viewport(page, header.bounding_box(), column)
            _within(header.bounding_box(), page.locator("#changelist .results").bounding_box())
        cells = page.locator("#result_list td.field-finished, #result_list td.field-finished_at")
        _within_viewport(page, cells.first.bounding_box(), "finished cell")
        # The list itself does not scroll sideways (the admin wraps it in a scrolling box).
        scroll, client = page.locator("#changelist .results").evaluate(
            "el => [el.scrollWidth, el.clientWidth]"
        )
        assert scroll <= client, ("jobs list scrolls sideways", scroll, client)
        _no_horizontal_scroll(page, "jobs list")

        # The timeline: the whole drawing, its re-create marker and its outcomes, on screen.
        content_type = ContentType.objects.get_for_model(Customer)
        page.goto(
            f"{live_server.url}"
            f"{reverse('admin:tombstones_job_timeline', args=(content_type.pk, record.pk))}"
        )
        _shot(page, f"12-timeline-{width}")
        svg = page.locator("svg#record-timeline")
        _within_viewport(page, svg.bounding_box(), "timeline")
        _within_viewport(page, svg.locator("g.mark-recreated").bounding_box(), "re-create marker")
        outcomes = svg.locator("g.job text.outcome")
        assert outcomes.count() == len(jobs)
        for i in range(outcomes.count()):
            _within_viewport(page, outcomes.nth(i).bounding_box(), outcomes.nth(i).text_content())
        _no_horizontal_scroll(page, "timeline")
    finally:
        context.close()
