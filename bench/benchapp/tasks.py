"""The ``tasks`` variant: the fenced ``bench.touch`` write as a ``@task`` of Django's tasks
framework, run by ``TombstoneBackend`` (bench/settings.py's ``TASKS["default"]``) as a fenced job
of the customer's lane on the django-q2 cluster.

A worker imports this module by the job's handler name (``task:bench.benchapp.tasks.touch``);
defining the task registers its handler.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from project.customers.models import Customer

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task(takes_context=True)
def touch(context: Any, customer: Customer) -> None:
    """The same write as the ``bench.touch`` handler: fenced on (pk, generation, version, live),
    ``synced_at`` and ``version + 1``."""
    context.update(synced_at=timezone.now())
