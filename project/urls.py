from django.contrib import admin
from django.urls import path

from project.customers.views import fake_crm_contacts

urlpatterns = [
    path("fake-crm/contacts/", fake_crm_contacts, name="fake-crm-contacts"),
    path("admin/", admin.site.urls),
]

# Auditors who open a staff-only admin page learn what their role can see (Django's 403 elsewhere).
handler403 = "tombstones.views.permission_denied"
