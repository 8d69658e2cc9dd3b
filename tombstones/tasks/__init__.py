"""Fenced jobs through Django's own tasks framework (``django.tasks``; on Django 5.2 the
``django-tasks`` backport).

::

    TASKS = {"default": {"BACKEND": "tombstones.tasks.TombstoneBackend"}}

A function decorated with Django's ``@task`` whose arguments hold a ``TombstoneModel`` instance
is a fenced job: ``.enqueue()`` snapshots that record (model, pk, generation, version) into a job
of its lane, and a worker of the django-q2 cluster runs it through the same road as
``tombstones.enqueue``. See docs/tasks.md.
"""

from __future__ import annotations

from .backend import TombstoneBackend
from .context import TombstoneTaskContext
from .task import TombstoneTask, fenced_task

__all__ = ["TombstoneBackend", "TombstoneTask", "TombstoneTaskContext", "fenced_task"]
