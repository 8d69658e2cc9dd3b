from django.apps import AppConfig


class CustomersConfig(AppConfig):
    name = "project.customers"
    label = "customers"
    verbose_name = "Customers (demo)"
    default_auto_field = "django.db.models.BigAutoField"
