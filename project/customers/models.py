"""The demo's business models: a customer and the spreadsheet row that mirrors it."""

from __future__ import annotations

from django.db import models

from tombstones.models import TombstoneModel


class Customer(TombstoneModel):
    reference = models.CharField(max_length=32, unique=True)  # business key
    name = models.CharField(max_length=100)
    email = models.EmailField()
    phone = models.CharField(max_length=32, blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)

    class TombstoneMeta:
        business_key = "reference"
        personal_fields = ("name", "email", "phone")

    class Meta:
        ordering = ("reference",)

    def __str__(self) -> str:
        # What staff see on a live record's pages; logs use tombstone_identity().
        return f"Customer {self.reference}"


class SheetRow(TombstoneModel):
    """The "related spreadsheet row" of the seed: written by the update_sheet_row job."""

    reference = models.CharField(max_length=40, unique=True)  # business key
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="sheet_rows")
    name_hash = models.CharField(max_length=64, blank=True)  # derived from the name: personal
    synced_version = models.PositiveIntegerField(null=True, blank=True)

    class TombstoneMeta:
        business_key = "reference"
        personal_fields = ("name_hash",)

    class Meta:
        ordering = ("reference",)

    def __str__(self) -> str:
        return f"Sheet row {self.reference}"


class CrmContact(models.Model):
    """What the demo's fake CRM received: keyed by idempotency key, so a resend is a no-op."""

    idempotency_key = models.CharField(max_length=100, unique=True)
    reference = models.CharField(max_length=32)
    deliveries = models.PositiveIntegerField(default=1)
    received_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"CRM contact {self.reference}"
