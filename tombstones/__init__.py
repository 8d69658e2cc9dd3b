"""django-tombstone-guard: background jobs that never act on deleted or re-created records."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .exceptions import TransientError
from .jobs.registry import handler

if TYPE_CHECKING:
    from .jobs.enqueue import enqueue, enqueue_many, enqueue_plain

try:
    __version__ = version("django-tombstone-guard")
except PackageNotFoundError:  # running from a source checkout
    __version__ = "0.0.0"

__all__ = [
    "TransientError",
    "__version__",
    "enqueue",
    "enqueue_many",
    "enqueue_plain",
    "handler",
]


def __getattr__(name: str) -> Any:
    # enqueue needs the app registry; import it on first use, not with the package.
    if name in ("enqueue", "enqueue_many", "enqueue_plain"):
        from .jobs import enqueue

        return getattr(enqueue, name)
    raise AttributeError(f"module 'tombstones' has no attribute {name!r}")
