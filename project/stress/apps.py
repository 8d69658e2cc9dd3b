from django.apps import AppConfig


class StressConfig(AppConfig):
    name = "project.stress"
    label = "stress"
    verbose_name = "Race harness"
    default_auto_field = "django.db.models.BigAutoField"
