"""The audit side is translatable like the record side: its Python strings (gettext) and its
templates ({% translate %}) go through Django's catalogs. A German test catalog, compiled with
msgfmt, shows each layer's strings translated."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import translation

from tests.factories import CustomerFactory
from tests.jobkit import STAFF_CODENAMES, run
from tombstones.admin import dashboard, timeline
from tombstones.jobs import staff_actions
from tombstones.jobs.enqueue import enqueue
from tombstones.models import Job

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(shutil.which("msgfmt") is None, reason="msgfmt (GNU gettext) is missing"),
]

# msgid -> German: one string per module and template of the audit side.
CATALOG = {
    "Cancel": "Abbrechen",  # operations
    "created": "erstellt",  # audit_admin column
    "{action} (selected jobs)": "{action} (ausgewählte Aufträge)",  # admin_actions
    "due at": "fällig um",  # dashboard
    "re-created as g%(n)s": "neu angelegt als g%(n)s",  # timeline
    "This page is for staff": "Diese Seite ist für Mitarbeiter",  # views
    "Waiting jobs": "Wartende Aufträge",  # dashboard.html
    "Event timeline of this job": "Ereignisse dieses Auftrags",  # job_change_form.html
    "Jobs and events, in order": "Aufträge und Ereignisse, der Reihe nach",  # timeline.html
    "What auditors can see": "Was Prüfer sehen",  # auditor_forbidden.html
}


def _po(entries: dict[str, str]) -> str:
    def quote(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    head = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
    return head + "".join(f"msgid {quote(k)}\nmsgstr {quote(v)}\n\n" for k, v in entries.items())


@pytest.fixture
def german(tmp_path: Path) -> Iterator[None]:
    folder = tmp_path / "de" / "LC_MESSAGES"
    folder.mkdir(parents=True)
    (folder / "django.po").write_text(_po(CATALOG), encoding="utf-8")
    subprocess.run(
        ["msgfmt", "-o", str(folder / "django.mo"), str(folder / "django.po")], check=True
    )
    with override_settings(LOCALE_PATHS=[str(tmp_path)]), translation.override("de"):
        yield


def _client(*codenames: str, groups: tuple[str, ...] = ()) -> Client:
    user = User.objects.create_user("u-" + "-".join(groups or ("staff",)), is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="tombstones", codename__in=codenames)
    )
    for name in groups:
        user.groups.add(Group.objects.get(name=name))
    client = Client()
    client.force_login(user)
    return client


def test_i18n__python_strings_of_the_audit_side_are_translated(german: None) -> None:
    from django.utils import timezone

    from tombstones.admin import JobAdmin
    from tombstones.admin.bulk_actions import BULK_ACTIONS

    assert str(staff_actions.ACTIONS["cancel"].title) == "Abbrechen"
    assert str(JobAdmin.created.short_description) == "erstellt"
    cancel = next(a for a in BULK_ACTIONS if a.__name__ == "cancel")
    assert str(cancel.short_description) == "Abbrechen (ausgewählte Aufträge)"
    job = enqueue(
        "customers.update_sheet_row",
        CustomerFactory(),
        run_after=timezone.now() + timedelta(hours=1),
    )
    assert dashboard.why_waiting(job, timezone.now()).text == "fällig um"
    customer = CustomerFactory()
    old = enqueue("customers.update_sheet_row", customer)
    customer.delete()
    from project.customers.models import Customer

    revived = Customer.all_objects.recreate(reference=customer.reference, name="x", email="x@x.x")
    run(old)
    data = timeline.build(old.content_type, str(revived.pk))
    assert "neu angelegt als g2" in [mark["label"] for mark in data.svg["marks"]]


def test_i18n__templates_of_the_audit_side_are_translated(german: None) -> None:
    staff = _client(*STAFF_CODENAMES)
    job = run(enqueue("customers.update_sheet_row", CustomerFactory()))
    assert job.status == Job.Status.SUCCEEDED
    pages = {
        reverse("admin:tombstones_job_dashboard"): "Wartende Aufträge",
        reverse("admin:tombstones_job_change", args=(job.pk,)): "Ereignisse dieses Auftrags",
        reverse(
            "admin:tombstones_job_timeline", args=(job.content_type_id, job.object_id)
        ): "Aufträge und Ereignisse, der Reihe nach",
    }
    for url, text in pages.items():
        html = staff.get(url).content.decode()
        assert text in html, url

    call_command("tombstones_roles", verbosity=0)
    auditor = _client(groups=("Auditors",))
    response = auditor.get(reverse("admin:customers_customer_changelist"))
    assert response.status_code == 403
    html = response.content.decode()
    assert "Was Prüfer sehen" in html
    assert "Diese Seite ist für Mitarbeiter" in html
