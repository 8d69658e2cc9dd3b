"""The ``tasks-db`` variant: ``bench.tasks.fast_touch``'s plain, unfenced write as a ``@task`` of
django-tasks-db's ``DatabaseBackend`` (the ``tasks_db`` alias of bench/settings.py's ``TASKS``),
run by ``manage.py db_worker`` processes (bench/db_workers.py).

Imported only when that backend is configured (django-tasks-db installed: the ``bench`` extra).
"""

from __future__ import annotations

from bench.tasks import fast_touch

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

BACKEND = "tasks_db"


@task(backend=BACKEND)
def touch(pk: int) -> None:
    """``synced_at`` and ``version + 1`` of the customer, unguarded (as ``baseline-fast``)."""
    fast_touch(pk)


@task(backend=BACKEND)
def ping() -> str:
    """Proves the workers claim and record tasks before the clock starts."""
    return "pong"
