"""Admin integration: ``TombstoneAdmin`` for business models, and the job audit admins."""

from .audit_admin import (
    DashboardAdmin,
    JobAdmin,
    JobEventAdmin,
    RejectionAdmin,
    timeline_url,
)
from .record_admin import TombstoneAdmin

__all__ = [
    "DashboardAdmin",
    "JobAdmin",
    "JobEventAdmin",
    "RejectionAdmin",
    "TombstoneAdmin",
    "timeline_url",
]
