"""Settings for worker subprocesses started by the acceptance tests: the demo's, plus a lease
short enough (TOMBSTONES_LEASE_SECONDS) for a test to wait out a crashed worker's lease, a
shorter retry backoff (TOMBSTONES_RETRY_BACKOFF_SECONDS), and coalesced wake-ups when
TOMBSTONES_COALESCE_WAKES=1."""

import os
from datetime import timedelta

from project.settings import *  # noqa: F403

TOMBSTONES_LEASE = float(os.environ.get("TOMBSTONES_LEASE_SECONDS", "60"))
TOMBSTONES_COALESCE_WAKES = os.environ.get("TOMBSTONES_COALESCE_WAKES") == "1"
TOMBSTONES_RETRY_BACKOFF = timedelta(
    seconds=float(os.environ.get("TOMBSTONES_RETRY_BACKOFF_SECONDS", "2"))
)
