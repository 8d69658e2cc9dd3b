"""The demo's job handlers (imported automatically: modules named ``handlers``)."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request

from django.conf import settings
from django.core.mail import send_mail
from django.utils import timezone

import tombstones
from tombstones.context import HandlerContext

from .models import SheetRow


@tombstones.handler("customers.update_sheet_row")
def update_sheet_row(ctx: HandlerContext) -> None:
    """Internal: mirror the customer into its sheet rows, then stamp the customer."""
    customer = ctx.record
    digest = hashlib.sha256(customer.name.encode()).hexdigest()[:16]
    ctx.write(
        SheetRow.objects.filter(customer_id=customer.pk),
        name_hash=digest,
        synced_version=customer.version,
    )
    ctx.update(synced_at=timezone.now())


@tombstones.handler("customers.send_welcome", external=True)
def send_welcome(ctx: HandlerContext) -> None:
    """External: an email through Django's email backend."""
    send_mail(
        "Welcome",
        f"Hello, your customer reference is {ctx.record.reference}.",
        None,
        [ctx.record.email],
        fail_silently=False,
    )


@tombstones.handler("customers.sync_crm", external=True)
def sync_crm(ctx: HandlerContext) -> None:
    """External: POST to the (fake) CRM with an idempotency key; params["crm_delay"] slows it."""
    url = settings.CRM_URL
    delay = ctx.params.get("crm_delay")
    if delay:
        url = f"{url}?delay={float(delay)}"
    body = json.dumps(
        {"reference": ctx.record.reference, "name": ctx.record.name, "email": ctx.record.email}
    ).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": ctx.idempotency_key},
    )
    try:
        with urllib.request.urlopen(request, timeout=float(ctx.params.get("timeout", 2))) as resp:
            resp.read()
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            # Nothing reached the CRM: safe to retry.
            raise tombstones.TransientError("CRM refused the connection") from None
        raise
