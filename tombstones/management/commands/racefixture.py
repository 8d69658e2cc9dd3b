"""``manage.py racefixture``: run the race fixture against the real database and worker."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import tombstone_settings
from ...contrib.racefixture import SEED_CASES, WORKED_EXAMPLE, FixtureError, RaceFixture, load_cases
from ...exceptions import UnknownHandler
from ...jobs.registry import TASK_PREFIX, get_handler
from ..databases import add_database_argument, database_alias


class Command(BaseCommand):
    help = (
        "Run the race fixture (its four race cases and the worked example) through the "
        "production worker phases, in transactions that are rolled back. Exits non-zero on any "
        "mismatch."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = tombstone_settings.RACE_FIXTURE
        parser.add_argument(
            "--model", default=defaults.get("model"), help="app_label.Model on the mixin."
        )
        parser.add_argument(
            "--handler",
            default=defaults.get("handler"),
            help="Registered handler name, or task:<dotted path> of a django.tasks task.",
        )
        parser.add_argument("--cases", help="A JSON file of extra cases.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        using = database_alias(options)
        if not options["model"] or not options["handler"]:
            raise CommandError("Give --model app_label.Model and --handler name.")
        try:
            model = apps.get_model(options["model"])
        except (LookupError, ValueError):
            raise CommandError(f"Unknown model {options['model']!r}.") from None
        handler: Any = options["handler"]
        try:
            get_handler(handler)
        except UnknownHandler as exc:
            raise CommandError(str(exc)) from None
        if handler.startswith(TASK_PREFIX):
            # Its jobs are enqueued through the task itself, arguments and all.
            from ...tasks.backend import task_of

            handler = task_of(handler)
        try:
            extra = load_cases(options["cases"]) if options["cases"] else []
            fixture = RaceFixture(model, handler, using=using)
        except FixtureError as exc:
            raise CommandError(str(exc)) from None
        four = fixture.run(SEED_CASES)
        others = fixture.run([WORKED_EXAMPLE, *extra])
        self.stdout.write(four.table())
        self.stdout.write("")
        self.stdout.write(others.table())
        if not (four.ok and others.ok):
            raise CommandError("The race fixture found a mismatch (see the table above).")
        # Each table already ends with its summary line: the verdict says something else.
        count = len(four.results) + len(others.results)
        self.stdout.write(self.style.SUCCESS(f"The race fixture: all {count} cases as expected."))
