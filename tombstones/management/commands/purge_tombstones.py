"""``manage.py purge_tombstones``: hard-delete tombstones past retention that no job still needs."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import models, transaction
from django.db.models import Exists, OuterRef, Value
from django.db.models.functions import Cast, Now

from ...conf import tombstone_settings
from ...jobs.models import Job
from ...records import writes
from ...records.mixin import TombstoneModel
from ..databases import add_database_argument, database_alias


class Command(BaseCommand):
    help = (
        "Remove tombstones older than TOMBSTONES_RETENTION that no unfinished job references. "
        "Says what it kept and why."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", action="append", help="Only this app_label.Model.")
        parser.add_argument("--dry-run", action="store_true", help="Report, remove nothing.")
        parser.add_argument("--noinput", "--no-input", action="store_false", dest="interactive")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        db = database_alias(options)
        verbosity = options["verbosity"]
        targets = self._models(options["model"])
        # One plan, made before anything is removed, for the dry run and the real run alike: the
        # real run removes only what its plan lists (re-checked as it goes), so both say the same.
        plans = [self._plan(model, db) for model in targets]
        total = sum(len(p["purgeable"]) for p in plans)
        for plan in plans:
            self.stdout.write(
                f"{plan['label']}: {len(plan['purgeable'])} past retention, unreferenced and "
                f"unprotected; kept {plan['young']} younger than retention, "
                f"{plan['referenced']} referenced by unfinished jobs, "
                f"{len(plan['protected'])} protected by related rows"
            )
            if verbosity >= 1:
                for identity, blockers in plan["protected"]:
                    self.stdout.write(f"  kept {identity}: protected by {'; '.join(blockers)}")
        if any(plan["protected"] for plan in plans) and verbosity >= 1:
            self.stdout.write(
                "A tombstone is kept while related rows point to it: delete or detach them, or "
                "keep it (see 'Tombstones that related rows protect' in docs/records.md)."
            )
        if not total:
            self.stdout.write("Nothing to remove.")
            return
        if options["dry_run"]:
            self.stdout.write(f"Would remove {total} tombstone(s) (dry run).")
            return
        if options["interactive"]:
            answer = input(f"Remove {total} tombstone(s) permanently? Type 'yes' to continue: ")
            if answer != "yes":
                raise CommandError("Purge cancelled.")
        removed = 0
        for plan in plans:
            removed_here, protected = self._purge(plan, db)
            removed += removed_here
            if protected:
                self.stdout.write(
                    f"{plan['label']}: kept {protected} more, protected by related rows written "
                    "since the plan"
                )
        self.stdout.write(self.style.SUCCESS(f"Removed {removed} tombstone(s)."))

    def _models(self, labels: list[str] | None) -> list[type[TombstoneModel]]:
        if not labels:
            return [m for m in apps.get_models() if issubclass(m, TombstoneModel)]
        found = []
        for label in labels:
            try:
                model = apps.get_model(label)
            except (LookupError, ValueError):
                raise CommandError(f"Unknown model {label!r}.") from None
            if not issubclass(model, TombstoneModel):
                raise CommandError(f"{label} is not a TombstoneModel.")
            found.append(model)
        return found

    def _plan(self, model: type[TombstoneModel], db: str) -> dict[str, Any]:
        content_type = ContentType.objects.db_manager(db).get_for_model(model)
        referenced = Exists(
            Job.objects.using(db)
            .unfinished()
            .filter(content_type=content_type, object_id=Cast(OuterRef("pk"), models.CharField()))
        )
        cutoff = Now() - Value(tombstone_settings.RETENTION)
        dead = model.tombstones.using(db)
        old = dead.filter(deleted_at__lt=cutoff)
        candidates = list(old.filter(~referenced).order_by("pk").values_list("pk", flat=True))
        purgeable, protected = self._unprotected(model, candidates, db)
        return {
            "label": model._meta.label,
            "model": model,
            "referenced_q": referenced,
            "cutoff": cutoff,
            "purgeable": purgeable,
            "protected": protected,
            "young": dead.filter(deleted_at__gte=cutoff).count(),
            "referenced": old.filter(referenced).count(),
        }

    def _unprotected(
        self, model: type[TombstoneModel], pks: list[Any], db: str
    ) -> tuple[list[Any], list[tuple[str, list[str]]]]:
        """The pks nothing protects, and the identity and blockers of the others: asked as the
        purge itself asks (writes.purge_blockers), all at once, then one by one if any is."""
        dead = model.tombstones.using(db)
        purgeable: list[Any] = []
        protected: list[tuple[str, list[str]]] = []
        for start in range(0, len(pks), writes.PK_CHUNK):
            chunk = pks[start : start + writes.PK_CHUNK]
            if not writes.purge_blockers(dead.filter(pk__in=chunk)):
                purgeable += chunk
                continue
            for tomb in dead.filter(pk__in=chunk).order_by("pk"):
                blockers = writes.purge_blockers(dead.filter(pk=tomb.pk))
                if blockers:
                    protected.append((tomb.tombstone_identity(), blockers))
                else:
                    purgeable.append(tomb.pk)
        return purgeable, protected

    def _purge(self, plan: dict[str, Any], db: str) -> tuple[int, int]:
        model = plan["model"]
        removed = protected = 0
        for pk in plan["purgeable"]:
            # One by one: a row protected by a foreign key must not block the others, and the
            # retention and job conditions are re-checked in the deleting statement's transaction.
            try:
                with transaction.atomic(using=db):
                    still = (
                        model.tombstones.using(db)
                        .filter(pk=pk, deleted_at__lt=plan["cutoff"])
                        .filter(~plan["referenced_q"])
                    )
                    removed += 1 if writes.purge(still) else 0
            except (models.ProtectedError, models.RestrictedError):
                protected += 1
        return removed, protected
