"""The task class of :class:`~tombstones.tasks.TombstoneBackend` and the companion decorator."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..jobs.coalescing import Coalescing, KeyFunc, declare
from ..jobs.registry import TASK_PREFIX
from .compat import (
    DEFAULT_TASK_BACKEND_ALIAS,
    DEFAULT_TASK_PRIORITY,
    DEFAULT_TASK_QUEUE_NAME,
    InvalidTask,
    Task,
    task_backends,
)

if TYPE_CHECKING:
    from ..jobs.registry import Handler


@dataclass(frozen=True, slots=True, kw_only=True)
class TombstoneTask(Task):
    """Django's ``Task`` with two options of its own (``@task(fence=..., external=...)``).

    ``fence`` names the parameter that holds the record the job is fenced on; it is needed only
    when a call can pass more than one ``TombstoneModel`` instance. ``external`` marks a task
    that calls another system: the call is bracketed as sending/sent and an uncertain outcome is
    never repeated by itself.
    """

    fence: str | None = None
    external: bool = False
    # Coalescing per record (tombstones.jobs.coalescing): as @tombstones.handler's options.
    coalesce: bool | KeyFunc = False
    debounce: timedelta | None = None
    max_delay: timedelta | None = None
    edge: str = "trailing"

    def coalescing(self) -> Coalescing | None:
        """The coalescing options, checked (ImproperlyConfigured for what cannot work)."""
        return declare(
            self.module_path, self.coalesce, self.debounce, self.max_delay, self.edge, plain=False
        )

    @property
    def handler_name(self) -> str:
        """The job's handler name: the task's dotted path, which a worker can import."""
        return f"{TASK_PREFIX}{self.module_path}"

    def tombstone_handler(self) -> Handler:
        """The job handler that runs this task (the registry asks for it by name); its backend
        makes it, so that this class imports nothing of what runs it."""
        made: Handler = self.get_backend().handler_for(self)  # type: ignore[attr-defined]
        return made

    def parameters(self) -> list[inspect.Parameter]:
        """The parameters a caller fills: the function's, without ``context``."""
        found = list(inspect.signature(self.func).parameters.values())
        return found[1:] if self.takes_context else found


def fenced_task(
    function: Callable[..., Any] | None = None,
    *,
    fence: str | None = None,
    external: bool = False,
    coalesce: bool | KeyFunc = False,
    debounce: timedelta | None = None,
    max_delay: timedelta | None = None,
    edge: str = "trailing",
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
) -> Any:
    """``@task`` with ``fence``, ``external`` and the coalescing options (``coalesce``,
    ``debounce``, ``max_delay``, ``edge``: :mod:`tombstones.jobs.coalescing`) on every Django
    version.

    Django 6.1's ``@task`` passes these keywords to the backend's task class itself; Django 6.0's
    does not, so there write ``@fenced_task(fence="customer")``. The task is the same.
    """

    def wrapper(func: Callable[..., Any]) -> TombstoneTask:
        if not issubclass(task_backends[backend].task_class, TombstoneTask):
            raise InvalidTask(
                f"fenced_task needs a TombstoneBackend; the TASKS backend {backend!r} is "
                f"{type(task_backends[backend]).__name__}."
            )
        return TombstoneTask(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,  # Django 6.0's Task has no default for it
            fence=fence,
            external=external,
            coalesce=coalesce,
            debounce=debounce,
            max_delay=max_delay,
            edge=edge,
        )

    return wrapper(function) if function is not None else wrapper
