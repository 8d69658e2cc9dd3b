"""Django's tasks framework: ``django.tasks`` (Django 6.0+), or on Django 5.2 its backport,
the ``django-tasks`` package (``pip install "django-tombstone-guard[tasks]"``)."""

# mypy: ignore-errors
# (the two homes of one API: whichever is absent is typed as Any by ignore_missing_imports)

from __future__ import annotations

try:
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:
    try:
        from django_tasks import (
            DEFAULT_TASK_BACKEND_ALIAS,
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
    except ImportError as exc:
        raise ImportError(
            "tombstones.tasks needs Django's tasks framework: Django 6.0 or later, or on "
            'Django 5.2 the django-tasks backport (pip install "django-tombstone-guard[tasks]").'
        ) from exc

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
