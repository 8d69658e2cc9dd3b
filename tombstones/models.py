"""The app's models, where Django (and users) look for them.

The job table lives in :mod:`tombstones.jobs.models`, the record mixin in
:mod:`tombstones.records.mixin`; this module only hands them on.
"""

from .jobs.models import Dashboard, Job, JobEvent, Rejection
from .records.mixin import TombstoneModel

__all__ = ["Dashboard", "Job", "JobEvent", "Rejection", "TombstoneModel"]
