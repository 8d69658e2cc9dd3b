"""The fake CRM endpoint the demo's sync_crm handler posts to."""

from __future__ import annotations

import json
import time

from django.db.models import F
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .models import CrmContact

MAX_DELAY = 30.0


@csrf_exempt  # a machine-to-machine endpoint: authenticated by its idempotency key only
@require_POST
def fake_crm_contacts(request: HttpRequest) -> HttpResponse:
    delay = min(float(request.GET.get("delay", 0) or 0), MAX_DELAY)
    if delay > 0:
        time.sleep(delay)  # lets the demo show a timeout after sending -> uncertain
    key = request.headers.get("Idempotency-Key", "")
    if not key:
        return JsonResponse({"error": "Idempotency-Key header required"}, status=400)
    try:
        payload = json.loads(request.body or b"{}")
    except ValueError:
        return JsonResponse({"error": "invalid JSON"}, status=400)
    contact, created = CrmContact.objects.get_or_create(
        idempotency_key=key, defaults={"reference": str(payload.get("reference", ""))[:32]}
    )
    if not created:
        CrmContact.objects.filter(pk=contact.pk).update(deliveries=F("deliveries") + 1)
    return JsonResponse(
        {"id": contact.pk, "duplicate": not created}, status=201 if created else 200
    )
