"""Settings of the soak's processes (the feeder, the editor, the ``qcluster``): the demo
project's, pointed by the environment at the soak's private servers, plus what the chaos needs.

- ``SOAK_LEASE`` (seconds, default 4) sets ``TOMBSTONES_LEASE``, and django-q2's ``timeout`` one
  second below it (``tombstones.E023``): a killed worker's claim is taken back within seconds;
- retries come back quickly (``TOMBSTONES_RETRY_BACKOFF`` 0.2 s, at most 2 s) and a job may be
  claimed 8 times (kills charge a job claimed alone), so the soak drains in bounded time;
- ``DEBUG`` is off (no query log in a process that runs for an hour), and the ``tombstones``
  logger says warnings only (``SOAK_LOG_LEVEL``): one line per job would be most of the I/O.
"""

from __future__ import annotations

import os
from datetime import timedelta

from project.settings import *  # noqa: F403
from project.settings import LOGGING, Q_CLUSTER

DEBUG = False
SECRET_KEY = "soak-only-not-a-secret"  # a scratch database, removed after the run

TOMBSTONES_LEASE = float(os.environ.get("SOAK_LEASE", "4"))
TOMBSTONES_RETRY_BACKOFF = timedelta(seconds=0.2)
TOMBSTONES_RETRY_BACKOFF_MAX = timedelta(seconds=2)
TOMBSTONES_MAX_ATTEMPTS = 8
# A second queue on the same cluster: its workers scan both queues' hints (one range each).
TOMBSTONES_QUEUES = {"bulk": None}

Q_CLUSTER = {
    **Q_CLUSTER,
    "timeout": max(1, int(TOMBSTONES_LEASE) - 1),
    "retry": 60,
}

LOGGING = {
    **LOGGING,
    "loggers": {
        **LOGGING["loggers"],
        "tombstones": {
            "handlers": ["console"],
            "level": os.environ.get("SOAK_LOG_LEVEL", "WARNING"),
        },
    },
}
