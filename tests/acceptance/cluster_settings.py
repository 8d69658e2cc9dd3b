"""Settings for worker subprocesses started by the acceptance tests: the demo's, plus a lease
short enough (TOMBSTONES_LEASE_SECONDS) for a test to wait out a crashed worker's lease."""

import os

from project.settings import *  # noqa: F403

TOMBSTONES_LEASE = float(os.environ.get("TOMBSTONES_LEASE_SECONDS", "60"))
