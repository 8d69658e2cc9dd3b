"""A task call's arguments as a job stores them: the record becomes the job's fence, every other
value must be plain JSON, and no value of a record's personal fields is kept.

The job's params are ``{"args": [...], "kwargs": {...}, "fence": slot, "records": {slot: ref}}``,
where a slot is ``"args.0"`` or ``"kwargs.customer"``; the record and other record arguments
leave ``None`` in their slot (a record is never stored, only its model and pk).

A call that passes no record is a plain job (``"fence": None``): no fence, a lane of its own.
Unless the task is fenced: it names its fence (``fence="..."``) or a parameter is typed as a
TombstoneModel; then a call without its record (its pk, say) is refused (UnfencedTask).
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.db import models

from ..exceptions import InvalidParams, UnfencedTask
from ..jobs.validation import check_params
from ..records.mixin import TombstoneModel

if TYPE_CHECKING:
    from ..jobs.models import Job
    from .task import TombstoneTask

Slot = str


@dataclass(frozen=True)
class Encoded:
    record: TombstoneModel | None  # the fence: the job's snapshot is taken from it (None: plain)
    params: dict[str, Any]


def encode(task: TombstoneTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Encoded:
    """What the job stores for ``task(*args, **kwargs)``; raises UnfencedTask or InvalidParams."""
    values: dict[Slot, Any] = {f"args.{i}": value for i, value in enumerate(args)}
    values.update({f"kwargs.{name}": value for name, value in kwargs.items()})
    records: dict[Slot, TombstoneModel] = {}
    for slot, value in values.items():
        if isinstance(value, TombstoneModel):
            records[slot] = value
        elif isinstance(value, models.Model):
            raise InvalidParams(
                f"Argument {_name(slot)} of task {task.module_path} is a "
                f"{value._meta.label} instance, which is not a TombstoneModel: pass its pk."
            )
    fence = _fence_slot(task, args, kwargs, records)
    stored: dict[str, Any] = {
        "args": [
            None if f"args.{i}" in records else _json(task, f"args.{i}", v)
            for i, v in enumerate(args)
        ],
        "kwargs": {
            name: None if f"kwargs.{name}" in records else _json(task, f"kwargs.{name}", v)
            for name, v in kwargs.items()
        },
        "fence": fence,
        "records": {
            slot: {"model": record._meta.label_lower, "pk": str(record.pk)}
            for slot, record in records.items()
            if slot != fence
        },
    }
    for slot, record in records.items():
        # Refuses a personal value of any record argument, naming the field, never the value
        # (the fence's record: enqueue's own check does it, once).
        if slot != fence:
            check_params(stored, record)
    return Encoded(records[fence] if fence is not None else None, stored)


def fenced_parameters(task: TombstoneTask) -> list[str]:
    """The parameters ``task`` declares a record for: its ``fence``, and those typed as a
    TombstoneModel (``customer: Customer``, ``Customer | None``); a call must pass one."""
    if task.fence is not None:
        return [task.fence]
    key = (task.func, task.takes_context)
    if key not in _typed:  # read once per function: each plain call asks
        try:
            hints = typing.get_type_hints(task.func)
        except Exception:  # noqa: BLE001 - an annotation this process cannot resolve
            hints = {}
        if len(_typed) >= SEEN_FUNCTIONS:
            _typed.clear()
        _typed[key] = [
            p.name for p in task.parameters() if p.name in hints and _is_record_type(hints[p.name])
        ]
    return _typed[key]


# The record parameters of the task functions this process saw, by (function, takes_context).
_typed: dict[tuple[Any, bool], list[str]] = {}
SEEN_FUNCTIONS = 1024


def _is_record_type(hint: Any) -> bool:
    if isinstance(hint, type):
        return issubclass(hint, TombstoneModel)
    return any(_is_record_type(arg) for arg in typing.get_args(hint))


def _fence_slot(
    task: TombstoneTask,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    records: dict[Slot, TombstoneModel],
) -> Slot | None:
    if task.fence is not None:
        import inspect

        signature = inspect.Signature(task.parameters())
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError as exc:  # names arguments, never values
            raise UnfencedTask(f"Task {task.module_path}: {exc}.") from exc
        chosen = bound.arguments.get(task.fence)
        for slot, record in records.items():
            if record is chosen:
                return slot
        raise UnfencedTask(
            f"Task {task.module_path} is fenced on its argument {task.fence!r}, which this call "
            f"gives {'no value' if chosen is None else 'no TombstoneModel instance'}."
        )
    if not records:
        declared = fenced_parameters(task)
        if declared:
            raise UnfencedTask(
                f"Task {task.module_path} is fenced on {declared[0]!r} (a TombstoneModel), and "
                "this call passes no record: pass the record itself, not its pk."
            )
        return None  # a plain job: no record, no fence
    if len(records) > 1:
        raise UnfencedTask(
            f"Task {task.module_path} was called with several records "
            f"({', '.join(_name(s) for s in records)}): name the one it is fenced on with "
            '@task(fence="...").'
        )
    return next(iter(records))


def as_json(value: Any) -> Any:
    """``value`` as JSON gives it back, or None when JSON would not give back the same value
    (a tuple reads back as a list: the same)."""
    try:
        back = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return None
    return back if _same(back, value) else None


def _json(task: TombstoneTask, slot: Slot, value: Any) -> Any:
    """``value`` as JSON would give it back, or InvalidParams naming the argument."""
    back = as_json(value)
    if back is None and value is not None:
        raise InvalidParams(
            f"Argument {_name(slot)} of task {task.module_path} is not a JSON value "
            f"(Unsupported type {type(value).__name__}): task arguments are stored as JSON; "
            "pass ids and options."
        )
    return back


def _same(back: Any, value: Any) -> bool:
    """JSON's copy equals the value (tuples read back as lists; no int keys, no NaN)."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, dict):
        return (
            isinstance(back, dict)
            and all(isinstance(k, str) for k in value)
            and back.keys() == value.keys()
            and all(_same(back[k], v) for k, v in value.items())
        )
    if isinstance(value, list):
        return (
            isinstance(back, list)
            and len(back) == len(value)
            and all(_same(b, v) for b, v in zip(back, value, strict=True))
        )
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return type(back) is type(value) and back == value


def _name(slot: Slot) -> str:
    kind, _, key = slot.partition(".")
    return f"{key!r}" if kind == "kwargs" else f"at position {key}"


# --- reading them back ---------------------------------------------------------------------------


def decode(
    params: dict[str, Any], record: TombstoneModel | None, db: str
) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments, the fence slot holding ``record`` (read by the worker's check) and
    other record arguments read fresh (tombstones included: ``is_tombstone`` tells). A plain
    job's have no fence (``record`` None)."""
    if "args" not in params or "fence" not in params:
        raise InvalidParams("This job's task arguments were erased or never stored.")
    args, kwargs = list(params["args"]), dict(params["kwargs"])
    if params["fence"] is not None and record is not None:
        _put(args, kwargs, params["fence"], record)
    for slot, ref in params.get("records", {}).items():
        model = apps.get_model(ref["model"])
        _put(args, kwargs, slot, model._base_manager.using(db).get(pk=ref["pk"]))
    return args, kwargs


def stored(job: Job) -> tuple[list[Any], dict[str, Any]]:
    """The arguments as the ledger keeps them: records as snapshots (model, pk, and for the
    fence its generation and version), never a field value; empty once the params are erased."""
    params = job.params or {}
    if "args" not in params or "fence" not in params:
        return [], {}
    args, kwargs = list(params["args"]), dict(params["kwargs"])
    if params["fence"] is None or job.content_type_id is None:
        return args, kwargs  # a plain job: no record among them
    # Cached per process: no query per job (job.content_type would be one).
    kind = ContentType.objects.db_manager(job._state.db).get_for_id(job.content_type_id)
    label = f"{kind.app_label}.{kind.model}"
    snapshot = {
        "model": label,
        "pk": job.object_id,
        "generation": job.generation,
        "version": job.version,
    }
    _put(args, kwargs, params["fence"], snapshot)
    for slot, ref in params.get("records", {}).items():
        _put(args, kwargs, slot, dict(ref))
    return args, kwargs


def _put(args: list[Any], kwargs: dict[str, Any], slot: Slot, value: Any) -> None:
    kind, _, key = slot.partition(".")
    if kind == "args":
        args[int(key)] = value
    else:
        kwargs[key] = value
