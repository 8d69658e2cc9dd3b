"""(Re)create the "Auditors" group: view-only on the job audit, nothing on business records."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from ...roles import AUDITOR_PERMISSIONS, AUDITORS, apply_auditors
from ..databases import add_database_argument, database_alias


class Command(BaseCommand):
    help = (
        f'Create or repair the "{AUDITORS}" group: view permissions on the job audit, the '
        "rejection log and the dashboard, and nothing else."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        using = database_alias(options)
        with transaction.atomic(using=using):
            group, removed = apply_auditors(using=using)
        if options["verbosity"] >= 1:
            codenames = ", ".join(f"{app}.{code}" for app, code in AUDITOR_PERMISSIONS)
            self.stdout.write(f'Group "{group.name}": {codenames}.')
            if removed:
                self.stdout.write(f"Removed {removed} other permission(s) from the group.")
