"""The metrics page (``tombstones:metrics``): Prometheus' text format, for a user with the
``tombstones.view_metrics`` permission (superusers included) or a request bearing
``TOMBSTONES_METRICS_TOKEN``; refused to anyone else."""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..conf import tombstone_settings
from .metrics import registry

PERMISSION = "tombstones.view_metrics"


def _bearer(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _refused(request: HttpRequest) -> HttpResponse | None:
    """None when the request may read the metrics, else the response that refuses it."""
    given = _bearer(request)
    if given is not None:
        expected = tombstone_settings.METRICS_TOKEN
        if expected and hmac.compare_digest(given.encode(), expected.encode()):
            return None
    elif request.user.has_perm(PERMISSION):
        return None
    if given is None and request.user.is_authenticated:
        return HttpResponse("Forbidden: needs the view_metrics permission.\n", status=403)
    refused = HttpResponse("Unauthorized: log in, or send the metrics bearer token.\n", status=401)
    refused["WWW-Authenticate"] = 'Bearer realm="tombstones"'
    return refused


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refused = _refused(request)
    if refused is not None:
        return refused
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
