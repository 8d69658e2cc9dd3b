"""What a task with ``takes_context=True`` receives: Django's ``TaskContext`` with the handler
context's powers (the fenced writes, the record as checked, the re-reads, the idempotency key)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import models

from .compat import TaskContext

if TYPE_CHECKING:
    from ..jobs.context import HandlerContext
    from ..jobs.models import Job


@dataclass(frozen=True, slots=True, kw_only=True)
class TombstoneTaskContext(TaskContext):  # type: ignore[misc]  # frozen in Django, not its stubs
    """``context.task_result`` and ``context.attempt`` as Django documents them, and:

    - ``record``: the record as the worker checked it, live at the job's generation (the same
      instance the task's record argument is);
    - ``update(**fields)``: the conditional write of the record (1, or 0 when its fence failed);
    - ``write(queryset, **fields)``: a write of related rows fenced on the record;
    - ``rereads``: how often the record was read again after a newer version;
    - ``idempotency_key``: for an external call, stable for the job across a manual resend;
    - ``heartbeat()``: renew the lease now, False if the job is no longer this worker's;
    - ``aupdate``, ``awrite``, ``aheartbeat``: the same, for an ``async def`` task.
    """

    handler_context: HandlerContext = field(repr=False, compare=False)

    @property
    def record(self) -> Any:
        return self.handler_context.record

    @property
    def job(self) -> Job:
        return self.handler_context.job

    @property
    def rereads(self) -> int:
        return self.handler_context.rereads

    @property
    def idempotency_key(self) -> str:
        return self.handler_context.idempotency_key

    def update(self, **fields: Any) -> int:
        return self.handler_context.update(**fields)

    def write(self, queryset: models.QuerySet[Any], **fields: Any) -> int:
        return self.handler_context.write(queryset, **fields)

    def heartbeat(self) -> bool:
        return self.handler_context.heartbeat()

    # An async task's: run on the worker's thread (thread_sensitive), in the job's transaction.
    async def aupdate(self, **fields: Any) -> int:
        return await sync_to_async(self.update, thread_sensitive=True)(**fields)

    async def awrite(self, queryset: models.QuerySet[Any], **fields: Any) -> int:
        return await sync_to_async(self.write, thread_sensitive=True)(queryset, **fields)

    async def aheartbeat(self) -> bool:
        return await sync_to_async(self.heartbeat, thread_sensitive=True)()
