from __future__ import annotations

from django.apps import AppConfig


class TombstonesConfig(AppConfig):
    name = "tombstones"
    verbose_name = "Tombstone guard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Checks and signals only.
        from django.db.models.signals import post_migrate
        from django_q.signals import post_execute_in_worker, post_spawn

        from . import checks
        from .alarms import on_worker_start
        from .sweep import install_schedule
        from .worker import mark_q_task

        checks.register()
        post_execute_in_worker.connect(mark_q_task, dispatch_uid="tombstones.mark_q_task")
        post_spawn.connect(on_worker_start, dispatch_uid="tombstones.worker_start")
        post_migrate.connect(install_schedule, sender=self, dispatch_uid="tombstones.schedule")
