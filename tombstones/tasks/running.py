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
    coalescing = task.coalescing()
    same = (task.func, task.takes_context, task.external)
    if known is not None and known[:3] == same and known[3].coalescing == coalescing:
        return known[3]

    def run_task(ctx: HandlerContext) -> None:
        args, kwargs = decode(ctx.params, ctx.record, ctx.job._state.db or "default")
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
            value = task.call(context, *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        if value is not None:
            keep_return_value(ctx, task, value, [*args, *kwargs.values()])

    # plain: a call that passes no record is a plain job (tasks.arguments).
    made = Handler(
        name=name, func=run_task, external=task.external, plain=True, coalescing=coalescing
    )
    _made[name] = (task.func, task.takes_context, task.external, made)
    return made


def keep_return_value(
    ctx: HandlerContext, task: TombstoneTask, value: Any, arguments: list[Any]
) -> None:
    """Store the task's return value in its job's params (``"return"``), in the job's own
    transaction: kept with a success, erased with the params (the record's tombstone, a purge),
    removed with the job. Refused (InvalidResult: the job fails, its writes rolled back) unless
    it is JSON that reads back as the same value, within the params' size limit, and holds no
    value of a personal field of the task's records."""
    from ..exceptions import InvalidParams, InvalidResult
    from ..jobs.validation import check_params
    from ..records.mixin import TombstoneModel
    from .arguments import as_json

    returned = as_json(value)
    if returned is None:
        raise InvalidResult(
            f"Task {task.module_path} returned a {type(value).__name__}, which is not a JSON "
            "value: a task's return value is stored as JSON; return ids and counts."
        )
    job = ctx.job
    params = {**job.params, "return": returned}
    records: list[TombstoneModel] = [a for a in arguments if isinstance(a, TombstoneModel)]
    try:
        if not records:  # a plain job's: what a plain job's params may hold
            check_params(params, None, plain=True)
        for record in records:
            check_params(params, record)
    except InvalidParams as exc:  # names a field, never a value
        raise InvalidResult(
            f"Task {task.module_path}'s return value cannot be kept: {exc}", field=exc.field
        ) from None
    job.__class__.objects.using(job._state.db).filter(pk=job.pk).update(params=params)
    job.params = params
