"""The app's own pages, outside the admin: ``path("tombstones/", include("tombstones.urls"))``.

- ``tombstones:metrics``: the Prometheus metrics (:mod:`tombstones.monitoring.views`).
"""

from django.urls import path

from .monitoring import views

app_name = "tombstones"

urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
]
