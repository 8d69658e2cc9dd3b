"""Settings of the benchmark cluster: the demo project's settings plus the bench app.

Differences from project.settings, all applied to every variant alike:

- ``bench.benchapp`` is installed (the ``bench.touch`` handler, the SQL-counting hook);
- ``DEBUG`` is off (``BENCH_DEBUG=1`` turns it back on): no debug cursor, as in production;
- django-q2 keeps every task row (``save_limit = 0``): the baseline's latency and completion are
  read from them, and pruning would add statements to the baseline only;
- ``BENCH_Q_RECYCLE`` overrides django-q2's worker recycling (default 500 tasks; the soak run
  turns it off so a leak would show), ``BENCH_CONN_MAX_AGE`` the connection lifetime;
- ``BENCH_LEASE`` sets ``TOMBSTONES_LEASE`` (seconds) and django-q2's ``timeout`` one second
  below it (bench/hosts.py: a killed host's jobs come back within seconds, not a minute);
- ``TASKS``: ``default`` is ``TombstoneBackend`` (as in project.settings; the ``tasks`` variant)
  and, when django-tasks-db is installed (the ``bench`` extra, never a dependency of the
  library), ``tasks_db`` is its ``DatabaseBackend`` with its app ``django_tasks_db`` (the
  ``tasks-db`` variant, run by ``manage.py db_worker --backend tasks_db``).
"""

from __future__ import annotations

import os
from importlib.util import find_spec

from project.settings import *  # noqa: F403
from project.settings import DATABASES, INSTALLED_APPS, Q_CLUSTER

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]

TASKS: dict[str, dict[str, object]] = {
    "default": {"BACKEND": "tombstones.tasks.TombstoneBackend"},
}
if find_spec("django_tasks_db") is not None:
    INSTALLED_APPS.append("django_tasks_db")
    TASKS["tasks_db"] = {"BACKEND": "django_tasks_db.DatabaseBackend"}

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
