"""Job handlers, registered by name with ``@tombstones.handler("app.name")``.

Handlers live in any module; modules named ``handlers`` in installed apps are imported the first
time a handler is looked up, so workers find them without extra configuration.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from ..exceptions import UnknownHandler
from .coalescing import Coalescing, KeyFunc, declare

if TYPE_CHECKING:
    from .context import HandlerContext

HandlerFunc = Callable[["HandlerContext"], Any]


@dataclass(frozen=True)
class Handler:
    name: str
    func: HandlerFunc
    external: bool = False
    accepts_tombstones: bool = False
    # Runs jobs for no record too (a task's handler: its plain calls). A plain job of any other
    # handler is escalated (missing_fence): it was written without the record it needs.
    plain: bool = False
    # Only the newest queued job of a record (and key) runs (:mod:`.coalescing`); None: all do.
    coalescing: Coalescing | None = None


_registry: dict[str, Handler] = {}
_discovered = False

# The width of Job.handler: a longer name could not be stored.
MAX_NAME_LENGTH = 200
# Jobs of Django's own tasks (tombstones.tasks) are named after the task's dotted path: a worker
# that does not know one yet imports that path, and the task it finds makes the handler.
TASK_PREFIX = "task:"


def check_name(name: object) -> None:
    """A handler name is stored in every job row: a non-empty str of at most 200 characters,
    without control characters (PostgreSQL refuses NUL) or surrounding whitespace."""
    if not isinstance(name, str) or not name:
        raise ImproperlyConfigured("A job handler needs a non-empty string name.")
    if len(name) > MAX_NAME_LENGTH:
        raise ImproperlyConfigured(
            f"A job handler name has at most {MAX_NAME_LENGTH} characters "
            f"(this one has {len(name)})."
        )
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in name):
        raise ImproperlyConfigured(
            "A job handler name cannot hold control or format characters (NUL included)."
        )
    if name != name.strip():
        raise ImproperlyConfigured("A job handler name cannot start or end with whitespace.")


def handler(
    name: str,
    *,
    external: bool = False,
    accepts_tombstones: bool = False,
    plain: bool = False,
    coalesce: bool | KeyFunc = False,
    debounce: timedelta | None = None,
    max_delay: timedelta | None = None,
    edge: str = "trailing",
) -> Callable[[HandlerFunc], HandlerFunc]:
    """Register ``func`` as the job handler called ``name``.

    ``external=True`` marks a handler that calls another system: its call is bracketed as
    sending/sent and an uncertain outcome is never repeated automatically.

    Registering the same function again with the same options is a no-op; another function under
    the same name, or the same function with other options, raises ImproperlyConfigured.

    ``accepts_tombstones=True`` marks a handler that propagates deletions: it also runs when the
    record is a tombstone *of the job's generation* (``ctx.record.is_tombstone``), and may be
    enqueued for a tombstone. A re-created record (another generation) still rejects it.

    ``plain=True`` lets it run plain jobs too, for no record (``enqueue_plain``): its context's
    ``record`` is then None, and ``update`` / ``write`` raise NoRecord.

    ``coalesce=True`` (or a function of the params returning a key): a new job for a record
    supersedes the handler's earlier jobs for it (and the key) that have not started.
    ``debounce`` and ``max_delay`` (timedeltas) make each job wait for newer ones; ``edge``
    ``"trailing"`` (the default) or ``"leading"``. See :mod:`tombstones.jobs.coalescing`.
    """
    check_name(name)
    coalescing = declare(name, coalesce, debounce, max_delay, edge, plain=plain)

    def register(func: HandlerFunc) -> HandlerFunc:
        wanted = Handler(
            name=name,
            func=func,
            external=external,
            accepts_tombstones=accepts_tombstones,
            plain=plain,
            coalescing=coalescing,
        )
        existing = _registry.get(name)
        if existing is None:
            _registry[name] = wanted
        elif existing.func is not func:
            # Identity, not the qualified name: two closures, two partials or a module imported
            # under two names would otherwise silently replace each other.
            raise ImproperlyConfigured(
                f"Two different functions are registered as the job handler {name!r}."
            )
        elif existing != wanted:
            # Flipping external or accepts_tombstones changes how queued jobs are run.
            raise ImproperlyConfigured(
                f"The job handler {name!r} is registered again with different options "
                f"(external={external}, accepts_tombstones={accepts_tombstones}, plain={plain}, "
                f"coalescing={coalescing}; first external={existing.external}, "
                f"accepts_tombstones={existing.accepts_tombstones}, plain={existing.plain}, "
                f"coalescing={existing.coalescing})."
            )
        return func

    return register


def add(made: Handler, *, replace: bool = False) -> Handler:
    """Register a handler made elsewhere (a task's): the same one again is a no-op, another one
    under the same name raises ImproperlyConfigured, as ``handler()`` does, unless ``replace``
    (a task's name is its dotted path: another function there is the same task redefined, as
    by a module reload)."""
    check_name(made.name)
    if replace:
        _registry[made.name] = made
        return made
    existing = _registry.setdefault(made.name, made)
    if existing != made:
        raise ImproperlyConfigured(
            f"Two different functions or option sets are registered as the job handler "
            f"{made.name!r}."
        )
    return existing


def _discover() -> None:
    global _discovered
    if not _discovered:
        from django.utils.module_loading import autodiscover_modules

        _discovered = True
        autodiscover_modules("handlers")


def get_handler(name: str) -> Handler:
    """The handler registered as ``name``; raises UnknownHandler."""
    found = _registry.get(name)
    if found is None:
        _discover()
        found = _registry.get(name)
    if found is None and name.startswith(TASK_PREFIX):
        found = _import_task(name)
    if found is None:
        raise UnknownHandler(name)
    return found


def imported_task(name: str) -> Any:
    """The object at the dotted path of a task's handler name (``task:<path>``), or None when the
    name is no task's or the path does not import in this process."""
    from django.utils.module_loading import import_string

    if not name.startswith(TASK_PREFIX):
        return None
    try:
        return import_string(name.removeprefix(TASK_PREFIX))
    except ImportError:
        return None


def _import_task(name: str) -> Handler | None:
    """The handler of the ``django.tasks`` task at the dotted path in ``name``, if there is one.

    Only an object that makes a handler for that very name counts (a task of
    ``tombstones.tasks.TombstoneBackend``); a path that does not import is a task this code does
    not have yet (a deploy in progress), like any unknown handler.
    """
    # Defining the task registers its handler (TombstoneBackend.validate_task).
    found = imported_task(name)
    if found is None:
        return None
    if name in _registry:
        return _registry[name]
    make = getattr(found, "tombstone_handler", None)  # a module imported before: ask the task
    if not callable(make):
        return None
    made = make()
    if not isinstance(made, Handler) or made.name != name:
        return None
    return add(made)


def registered_as(name: str) -> Handler | None:
    """The handler registered under ``name`` now, if any (no discovery, no import)."""
    return _registry.get(name)


def registered() -> dict[str, Handler]:
    _discover()
    return dict(_registry)


def unregister(name: str) -> None:
    """Remove a handler (for tests that register throwaway handlers)."""
    _registry.pop(name, None)
