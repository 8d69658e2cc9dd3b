"""The "Auditors" group: view-only on the audit models, nothing on business records.

Applied by migration ``0003_auditors_group`` and re-applied by ``manage.py tombstones_roles``.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps as global_apps

AUDITORS = "Auditors"

# (app_label, codename): view the job audit, its events, the rejection log and the dashboard.
AUDITOR_PERMISSIONS: tuple[tuple[str, str], ...] = (
    ("tombstones", "view_job"),
    ("tombstones", "view_jobevent"),
    ("tombstones", "view_rejection"),
    ("tombstones", "view_dashboard"),
)


def apply_auditors(apps: Any = global_apps, using: str = "default") -> tuple[Any, int]:
    """Create the group if needed and set its permissions to exactly AUDITOR_PERMISSIONS.

    Returns ``(group, number of permissions removed)``: anything granted to the group by hand
    beyond the audit views is taken away, so auditors never reach personal fields.
    """
    from django.contrib.auth.management import create_permissions

    # Permissions of proxy models and Meta.permissions exist only after post_migrate: make them.
    config = apps.get_app_config("tombstones")
    if getattr(config, "models_module", None) is None:
        config.models_module = True  # historical app configs have none; create_permissions skips
        try:
            create_permissions(config, apps=apps, verbosity=0, using=using)
        finally:
            config.models_module = None
    else:
        create_permissions(config, apps=apps, verbosity=0, using=using)

    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    group, _ = group_model.objects.using(using).get_or_create(name=AUDITORS)
    wanted = []
    for app_label, codename in AUDITOR_PERMISSIONS:
        wanted.append(
            permission_model.objects.using(using).get(
                content_type__app_label=app_label, codename=codename
            )
        )
    before = set(group.permissions.values_list("pk", flat=True))
    group.permissions.set(wanted)
    removed = len(before - {p.pk for p in wanted})
    return group, removed
