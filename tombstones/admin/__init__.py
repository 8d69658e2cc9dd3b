"""Admin integration: ``TombstoneAdmin`` (and its form) for business models, the job audit admins.

Importing this package registers the audit admins (:mod:`.audit`, :mod:`.jobs`).
"""

from .audit import JobEventAdmin, RejectionAdmin, timeline_url
from .jobs import DashboardAdmin, JobAdmin
from .record_form import TombstoneAdminForm
from .records import TombstoneAdmin, TombstoneStateFilter

__all__ = [
    "DashboardAdmin",
    "JobAdmin",
    "JobEventAdmin",
    "RejectionAdmin",
    "TombstoneAdmin",
    "TombstoneAdminForm",
    "TombstoneStateFilter",
    "timeline_url",
]
