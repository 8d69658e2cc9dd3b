"""Admin integration: ``TombstoneAdmin`` for business models, and the job audit admins."""

from .record_admin import TombstoneAdmin

__all__ = ["TombstoneAdmin"]
