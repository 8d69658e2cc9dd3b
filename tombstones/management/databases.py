"""The ``--database`` option shared by the management commands, checked before any query."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS


def add_database_argument(parser: CommandParser) -> None:
    parser.add_argument(
        "--database",
        default=DEFAULT_DB_ALIAS,
        help=f'Database alias to use (a key of DATABASES). Defaults to "{DEFAULT_DB_ALIAS}".',
    )


def database_alias(options: dict[str, Any]) -> str:
    """The ``--database`` alias, or a CommandError naming it (Django would raise a traceback)."""
    alias = options["database"]
    if alias not in settings.DATABASES:
        known = ", ".join(sorted(settings.DATABASES))
        raise CommandError(f"Unknown database {alias!r} (--database): DATABASES has {known}.")
    return str(alias)
