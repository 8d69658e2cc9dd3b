"""Seed the demo: a few customers with their sheet rows, an admin and an auditor.

Idempotent: existing rows are left alone (a customer deleted during the demo stays a tombstone
unless ``--revive`` is given). Passwords come from DEMO_ADMIN_PASSWORD / DEMO_AUDITOR_PASSWORD,
or are generated once and kept in ``.demo-credentials`` (git-ignored) so every run prints the
same ones.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from project.customers.models import Customer, SheetRow

CUSTOMERS = [
    ("C-1001", "Ada Lovelace", "ada@example.test", "+44 20 7946 0001"),
    ("C-1002", "Grace Hopper", "grace@example.test", "+1 202 555 0102"),
    ("C-1003", "Alan Turing", "alan@example.test", "+44 20 7946 0003"),
    ("C-1004", "Katherine Johnson", "katherine@example.test", "+1 757 555 0104"),
    ("C-1005", "Edsger Dijkstra", "edsger@example.test", "+31 20 555 0105"),
]

AUDITORS = "Auditors"
# The auditor reads the job audit and nothing else.
AUDITOR_PERMISSIONS = (("tombstones", "view_job"), ("tombstones", "view_jobevent"))

USERS = (
    # username, env var, superuser
    ("admin", "DEMO_ADMIN_PASSWORD", True),
    ("auditor", "DEMO_AUDITOR_PASSWORD", False),
)


class Command(BaseCommand):
    help = "Create the demo's customers, sheet rows, users and the Auditors group (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--revive",
            action="store_true",
            help="Re-create demo customers deleted earlier, as a new generation.",
        )
        parser.add_argument(
            "--credentials-file",
            default=str(Path(settings.BASE_DIR) / ".demo-credentials"),
            help="Where generated passwords are kept (default: .demo-credentials).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        passwords = self._passwords(Path(options["credentials_file"]))
        with transaction.atomic():
            created, revived, tombstones = self._customers(revive=options["revive"])
            group = self._auditors_group()
            self._users(passwords, group)
        if options["verbosity"] >= 1:
            self.stdout.write(
                f"demo data: {len(CUSTOMERS)} customers ({created} created, {revived} revived)"
            )
            for reference in tombstones:
                self.stdout.write(f"  {reference} is a tombstone (use --revive to re-create it)")
        # Always printed: the demo script shows these lines in its banner.
        self.stdout.write("demo users:")
        for username, _, _ in USERS:
            self.stdout.write(f"  {username:<8} password: {passwords[username]}")

    def _passwords(self, path: Path) -> dict[str, str]:
        stored: dict[str, str] = {}
        if path.exists():
            try:
                stored = json.loads(path.read_text())
            except ValueError:
                raise CommandError(f"{path} is not valid JSON: delete it to regenerate.") from None
        result: dict[str, str] = {}
        generated = False
        for username, env_var, _ in USERS:
            password = os.environ.get(env_var, "")
            if password:
                try:
                    validate_password(password)
                except ValidationError as exc:
                    raise CommandError(f"{env_var}: {' '.join(exc.messages)}") from None
            else:
                password = stored.get(username) or ""
                if not password:
                    password = secrets.token_urlsafe(12)
                    generated = True
                stored[username] = password
            result[username] = password
        if generated:
            path.write_text(json.dumps(stored, indent=2) + "\n")
            path.chmod(0o600)
        return result

    def _customers(self, *, revive: bool) -> tuple[int, int, list[str]]:
        created = revived = 0
        tombstones: list[str] = []
        for reference, name, email, phone in CUSTOMERS:
            fields = {"reference": reference, "name": name, "email": email, "phone": phone}
            customer = Customer.all_objects.filter(reference=reference).first()
            if customer is None:
                customer = Customer.objects.create(**fields)
                created += 1
            elif customer.is_tombstone:
                if not revive:
                    tombstones.append(reference)
                    continue
                customer = Customer.all_objects.recreate(**fields)
                revived += 1
            self._sheet_row(customer)
        return created, revived, tombstones

    def _sheet_row(self, customer: Customer) -> None:
        reference = f"row-{customer.reference}"
        row = SheetRow.all_objects.filter(reference=reference).first()
        if row is None:
            SheetRow.objects.create(reference=reference, customer=customer)
        elif row.is_tombstone:
            SheetRow.all_objects.recreate(reference=reference, customer=customer)

    def _auditors_group(self) -> Group:
        # May already exist (created by a migration): only add the two view permissions.
        group, _ = Group.objects.get_or_create(name=AUDITORS)
        for app_label, codename in AUDITOR_PERMISSIONS:
            try:
                permission = Permission.objects.get(
                    content_type__app_label=app_label, codename=codename
                )
            except Permission.DoesNotExist:
                raise CommandError(
                    f"Permission {app_label}.{codename} is missing: run 'manage.py migrate' first."
                ) from None
            group.permissions.add(permission)
        return group

    def _users(self, passwords: dict[str, str], group: Group) -> None:
        User = get_user_model()
        for username, _, superuser in USERS:
            user, _ = User.objects.get_or_create(username=username)
            user.is_active = True
            user.is_staff = True
            user.is_superuser = superuser
            user.set_password(passwords[username])
            user.save()
            if not superuser:
                user.groups.add(group)
