"""Settings for worker subprocesses started by the acceptance tests: the demo's, plus a lease
short enough (TOMBSTONES_LEASE_SECONDS) for a test to wait out a crashed worker's lease, and
coalesced wake-ups when TOMBSTONES_COALESCE_WAKES=1."""

import os

from project.settings import *  # noqa: F403

TOMBSTONES_LEASE = float(os.environ.get("TOMBSTONES_LEASE_SECONDS", "60"))
TOMBSTONES_COALESCE_WAKES = os.environ.get("TOMBSTONES_COALESCE_WAKES") == "1"
