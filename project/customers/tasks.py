"""The demo's job through Django's own tasks framework (``django.tasks``; on Django 5.2 the
``django-tasks`` backport): TASKS's TombstoneBackend makes it a fenced job of its customer."""

from __future__ import annotations

import hashlib
from typing import Any

from django.utils import timezone

from .models import Customer, SheetRow

try:
    from django.tasks import task
except ImportError:  # Django 5.2
    from django_tasks import task


@task(takes_context=True)
def refresh_sheet_rows(context: Any, customer: Customer) -> None:
    """Mirror the customer into its sheet rows, fenced on the customer (as the handler
    ``customers.update_sheet_row`` does): a customer deleted or re-created since the enqueue
    rejects the job, and a newer version is read again first."""
    digest = hashlib.sha256(customer.name.encode()).hexdigest()[:16]
    context.write(
        SheetRow.objects.filter(customer_id=customer.pk),
        name_hash=digest,
        synced_version=customer.version,
    )
    context.update(synced_at=timezone.now())
