"""Settings for worker subprocesses started by the acceptance tests: the demo's, plus a lease
short enough (TOMBSTONES_LEASE_SECONDS) for a test to wait out a crashed worker's lease, a
shorter retry backoff (TOMBSTONES_RETRY_BACKOFF_SECONDS), TOMBSTONES_MAX_ATTEMPTS, and
django-q2's task timeout (Q_TIMEOUT), the cluster the jobs go to (TOMBSTONES_Q_CLUSTER) and named
queues (TOMBSTONES_QUEUES_JSON)."""

import json
import os
from datetime import timedelta

from project.settings import *  # noqa: F403

TOMBSTONES_LEASE = float(os.environ.get("TOMBSTONES_LEASE_SECONDS", "60"))
TOMBSTONES_MAX_ATTEMPTS = int(os.environ.get("TOMBSTONES_MAX_ATTEMPTS", "5"))
# django-q2's task timeout stays below the lease (tombstones.E023).
_timeout = os.environ.get("Q_TIMEOUT") or min(50, max(1, int(TOMBSTONES_LEASE) - 1))
Q_CLUSTER = {**Q_CLUSTER, "timeout": int(_timeout)}  # noqa: F405
TOMBSTONES_RETRY_BACKOFF = timedelta(
    seconds=float(os.environ.get("TOMBSTONES_RETRY_BACKOFF_SECONDS", "2"))
)
if os.environ.get("TOMBSTONES_Q_CLUSTER"):
    TOMBSTONES_Q_OPTIONS = {"cluster": os.environ["TOMBSTONES_Q_CLUSTER"]}
# Named queues and the clusters serving them, as JSON (tests/acceptance/test_queues_cluster.py).
if os.environ.get("TOMBSTONES_QUEUES_JSON"):
    TOMBSTONES_QUEUES = json.loads(os.environ["TOMBSTONES_QUEUES_JSON"])
