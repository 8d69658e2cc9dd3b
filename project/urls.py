from django.contrib import admin
from django.urls import include, path

from project.customers.views import fake_crm_contacts

urlpatterns = [
    path("fake-crm/contacts/", fake_crm_contacts, name="fake-crm-contacts"),
    path("admin/", admin.site.urls),
    # The Prometheus metrics (tombstones:metrics): staff with view_metrics, or a bearer token.
    path("tombstones/", include("tombstones.urls")),
]

# Auditors who open a staff-only admin page learn what their role can see (Django's 403 elsewhere).
handler403 = "tombstones.views.permission_denied"
