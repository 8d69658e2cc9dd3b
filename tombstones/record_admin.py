"""TombstoneAdmin: a ModelAdmin base for business models on the mixin (placeholder, in progress)."""

from __future__ import annotations

from django.contrib import admin


class TombstoneAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """In progress."""
