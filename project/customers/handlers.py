"""The demo's job handlers (imported automatically: modules named ``handlers``).

Whatever a handler derives from a customer's personal fields (the sheet row's name hash, the
welcome email) is personal data too: ``erase_customer``, queued in the customer's lane when it is
deleted, removes it.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.mail.backends.filebased import EmailBackend as FileEmailBackend
from django.utils import timezone

import tombstones
from tombstones.context import HandlerContext
from tombstones.models import Job

from .models import Customer, SheetRow

# Marks the demo's emails with the customer's business key (identity, not personal data), so the
# erasure can find them once the address itself is erased.
CUSTOMER_HEADER = "X-Demo-Customer"


@tombstones.handler("customers.update_sheet_row")
def update_sheet_row(ctx: HandlerContext) -> None:
    """Internal: mirror the customer into its sheet rows, then stamp the customer.

    The name hash is derived personal data: erase_customer clears it when the customer is deleted.
    """
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
    """External: an email through Django's email backend (erase_customer removes its copy)."""
    EmailMessage(
        "Welcome",
        f"Hello, your customer reference is {ctx.record.reference}.",
        None,
        [ctx.record.email],
        headers={CUSTOMER_HEADER: ctx.record.reference},
    ).send(fail_silently=False)


@tombstones.handler("customers.erase_customer", accepts_tombstones=True)
def erase_customer(ctx: HandlerContext) -> None:
    """Internal, queued on delete: remove what the demo derived from the customer.

    It runs on the tombstone, after the jobs of the customer's lane that were due at the delete,
    so a sheet row one of them wrote is cleared too. A job delayed past the delete takes its place
    in the lane when it is due, after this one, and writes nothing (its record is a tombstone). A
    re-created customer is another generation: this job is then rejected, and the new customer's
    data stays.
    """
    ctx.write(SheetRow.objects.filter(customer_id=ctx.record.pk), name_hash="", synced_version=None)
    erase_welcome_mail(ctx.record.reference)


def queue_erasure(customers: Iterable[Customer]) -> list[Job]:
    """Queue erase_customer for each customer just deleted, in the caller's transaction."""
    return [tombstones.enqueue("customers.erase_customer", customer) for customer in customers]


def _mailer() -> Any:
    """The default email backend (Django 6.1 deprecated get_connection() for ``mailers``)."""
    try:
        from django.core.mail import mailers  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return get_connection()
    return mailers.default


# What Django's file email backend writes after each message.
MAIL_SEPARATOR = b"-" * 79 + b"\n"


def erase_welcome_mail(reference: str) -> int:
    """Delete the demo's emails to this customer from the file email backend's folder.

    A file holds every message one backend instance wrote, and two instances made in the same
    second may share a file: only this customer's messages go, the others' stay. Idempotent, so a
    retried or repeated erasure is harmless. Other backends keep no copy here.
    """
    connection = _mailer()
    if not isinstance(connection, FileEmailBackend):
        return 0
    header = f"{CUSTOMER_HEADER}: {reference}".encode()
    marker = re.compile(rb"^" + re.escape(header) + rb"\r?$", re.M)
    removed = 0
    for path in Path(connection.file_path).glob("*.log"):
        messages = [m for m in path.read_bytes().split(MAIL_SEPARATOR) if m]
        kept = [m for m in messages if not marker.search(m)]
        if len(kept) == len(messages):
            continue
        removed += len(messages) - len(kept)
        if kept:
            path.write_bytes(b"".join(m + MAIL_SEPARATOR for m in kept))
        else:
            path.unlink(missing_ok=True)
    return removed


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
