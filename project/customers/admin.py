"""The demo's admin: business records through TombstoneAdmin, the fake CRM read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from tombstones.admin import TombstoneAdmin

from .handlers import queue_erasure
from .models import CrmContact, Customer, SheetRow
from .tasks import refresh_sheet_rows


@admin.register(Customer)
class CustomerAdmin(TombstoneAdmin):
    # Personal columns on the live list only: TombstoneAdmin lists tombstones by identity.
    list_display = ("reference", "name", "email", "generation", "version")
    search_fields = ("reference",)
    actions = ("refresh_sheet_rows",)

    @admin.action(description="Refresh their sheet rows (a Django task per customer)")
    def refresh_sheet_rows(self, request: HttpRequest, queryset: QuerySet[Customer]) -> None:
        ids = [refresh_sheet_rows.enqueue(customer).id for customer in queryset]
        self.message_user(
            request, f"Queued {len(ids)} task(s): job {', '.join(ids)}.", messages.SUCCESS
        )

    # A delete also queues the erasure of what handlers derived from the customer, in the same
    # transaction: a delete that rolls back queues nothing.
    def delete_model(self, request: HttpRequest, obj: Customer) -> None:
        super().delete_model(request, obj)
        queue_erasure([obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Customer]) -> None:
        pks = list(queryset.values_list("pk", flat=True))
        super().delete_queryset(request, queryset)
        queue_erasure(Customer.tombstones.filter(pk__in=pks))


@admin.register(SheetRow)
class SheetRowAdmin(TombstoneAdmin):
    list_display = ("reference", "customer", "synced_version", "generation", "version")
    list_select_related = ("customer",)
    search_fields = ("reference",)


@admin.register(CrmContact)
class CrmContactAdmin(admin.ModelAdmin):
    """What the fake CRM received: written by the CRM endpoint only, so read-only here."""

    list_display = ("idempotency_key", "reference", "deliveries", "received_at")
    search_fields = ("reference", "idempotency_key")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
