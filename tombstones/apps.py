"""The app config: ``ready()`` registers the system checks and connects the signals."""

from __future__ import annotations

from importlib import import_module

from django.apps import AppConfig


class TombstonesConfig(AppConfig):
    name = "tombstones"
    verbose_name = "Tombstone guard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Checks and signals only.
        from django.db.models.signals import post_migrate
        from django_q.signals import post_execute_in_worker, post_spawn

        from . import signals
        from .jobs import checks as job_checks
        from .jobs import erasure, retention, sqlite_indexes
        from .jobs.engine.runner import on_worker_start
        from .jobs.engine.sweep import install_schedule
        from .jobs.ledger import rollup
        from .records import checks as record_checks
        from .worker import mark_q_task

        record_checks.register()
        job_checks.register()
        # Job params are erased with their record (the records layer sends, the job layer acts).
        signals.record_tombstoned.connect(
            erasure.erase_on_tombstone, dispatch_uid="tombstones.erase_params"
        )
        signals.records_purged.connect(
            erasure.erase_on_purge, dispatch_uid="tombstones.erase_params_on_purge"
        )
        post_execute_in_worker.connect(mark_q_task, dispatch_uid="tombstones.mark_q_task")
        post_spawn.connect(on_worker_start, dispatch_uid="tombstones.worker_start")
        post_migrate.connect(install_schedule, sender=self, dispatch_uid="tombstones.schedule")
        post_migrate.connect(
            sqlite_indexes.after_migrate, sender=self, dispatch_uid="tombstones.sqlite_indexes"
        )
        post_migrate.connect(
            rollup.after_migrate, sender=self, dispatch_uid="tombstones.outcome_rollup"
        )
        post_migrate.connect(
            retention.install_schedule, sender=self, dispatch_uid="tombstones.purge_schedule"
        )
        if _names_our_backend():
            # Django registers the checks of its TASKS backends (ours: E030-E032) when its tasks
            # framework is imported, which nothing else does at startup.
            import_module("tombstones.tasks")


def _names_our_backend() -> bool:
    from django.conf import settings

    found = getattr(settings, "TASKS", None)
    return isinstance(found, dict) and any(
        isinstance(conf, dict) and str(conf.get("BACKEND", "")).startswith("tombstones.tasks")
        for conf in found.values()
    )
