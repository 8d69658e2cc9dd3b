"""The job handler that runs a task: its arguments back, the record in its slot, Django's
``task_started`` sent, the task's function called. Everything else (claim, check, the fenced
writes, re-reads after a newer version, one outcome) is the engine's, as for any handler."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..jobs.registry import Handler
from .arguments import decode
from .compat import TaskResultStatus, task_started
from .context import TombstoneTaskContext
from .results import claims_of, result_for

if TYPE_CHECKING:
    from ..jobs.context import HandlerContext
    from .task import TombstoneTask

# One handler per task path, made once: a task copied by .using() makes the same one again.
_made: dict[str, tuple[Any, bool, bool, Handler]] = {}


def handler_for(task: TombstoneTask) -> Handler:
    name = task.handler_name
    known = _made.get(name)
    if known is not None and known[:3] == (task.func, task.takes_context, task.external):
        return known[3]

    def run_task(ctx: HandlerContext) -> None:
        args, kwargs = decode(ctx.params, ctx.record)
        backend = task.get_backend()
        job = ctx.job
        if job.started_at is None:  # the claim's UPDATE set it in the row, not here
            job.started_at = job.__class__.objects.values_list("started_at", flat=True).get(
                pk=job.pk
            )
        claims = claims_of(job, running=True)
        # For task_finished, sent with this instance once its outcome commits.
        job._task_claims = claims  # type: ignore[attr-defined]
        result = result_for(
            job, task, backend.alias, claims=claims, status=TaskResultStatus.RUNNING
        )
        if not getattr(job, "_task_started", False):  # once per claim, not per re-read
            job._task_started = True  # type: ignore[attr-defined]
            task_started.send(sender=type(backend), task_result=result)
        if task.takes_context:
            context = TombstoneTaskContext(task_result=result, handler_context=ctx)
            task.call(context, *args, **kwargs)
        else:
            task.call(*args, **kwargs)

    made = Handler(name=name, func=run_task, external=task.external)
    _made[name] = (task.func, task.takes_context, task.external, made)
    return made
