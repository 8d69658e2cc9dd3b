"""Settings of the benchmark cluster: the demo project's settings plus the bench app.

Differences from project.settings, all applied to every variant alike:

- ``bench.benchapp`` is installed (the ``bench.touch`` handler, the SQL-counting hook);
- ``DEBUG`` is off (``BENCH_DEBUG=1`` turns it back on): no debug cursor, as in production;
- django-q2 keeps every task row (``save_limit = 0``): the baseline's latency and completion are
  read from them, and pruning would add statements to the baseline only;
- ``BENCH_Q_RECYCLE`` overrides django-q2's worker recycling (default 500 tasks; the soak run
  turns it off so a leak would show), ``BENCH_CONN_MAX_AGE`` the connection lifetime;
- ``BENCH_LEASE`` sets ``TOMBSTONES_LEASE`` (seconds) and django-q2's ``timeout`` one second
  below it (bench/hosts.py: a killed host's jobs come back within seconds, not a minute).
"""

from __future__ import annotations

import os

from project.settings import *  # noqa: F403
from project.settings import DATABASES, INSTALLED_APPS, Q_CLUSTER

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]

DEBUG = os.environ.get("BENCH_DEBUG", "") == "1"

Q_CLUSTER = {**Q_CLUSTER, "save_limit": 0}
if os.environ.get("BENCH_Q_RECYCLE"):
    Q_CLUSTER["recycle"] = int(os.environ["BENCH_Q_RECYCLE"])

if os.environ.get("BENCH_CONN_MAX_AGE"):
    DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ["BENCH_CONN_MAX_AGE"])

if os.environ.get("BENCH_LEASE"):
    TOMBSTONES_LEASE = float(os.environ["BENCH_LEASE"])
    Q_CLUSTER["timeout"] = max(1, int(TOMBSTONES_LEASE) - 1)

if os.environ.get("BENCH_BATCH_SIZE"):
    TOMBSTONES_BATCH_SIZE = int(os.environ["BENCH_BATCH_SIZE"])
