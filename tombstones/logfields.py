"""The fields of the engine's log lines about jobs, for ``logger.log(..., extra=...)``.

Each line about one job carries ``job_id``, ``job_handler``, ``job_status``, ``job_reason`` and
``job_queue`` as attributes of its log record (a JSON formatter writes them as fields); a line
about several jobs carries ``job_ids``. The same fields, and the line's own, are also under
``record.tombstones`` (one dict, for a formatter that takes one key). Ids, names and codes only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


class _Job(Protocol):
    pk: Any
    handler: str
    status: str
    reason: str
    queue: str


def job_fields(
    job: _Job, status: str | None = None, reason: str | None = None, /, **more: Any
) -> dict[str, Any]:
    """``extra=`` for a line about ``job``: its status and reason as the line tells them
    (default: the row's)."""
    fields = {
        "job_id": job.pk,
        "job_handler": job.handler,
        "job_status": str(job.status if status is None else status),
        "job_reason": str(job.reason if reason is None else reason),
        "job_queue": job.queue,
    }
    return {**fields, "tombstones": {**fields, **more}}


def jobs_fields(ids: Iterable[Any], /, **more: Any) -> dict[str, Any]:
    """``extra=`` for a line about several jobs (``job_ids``)."""
    listed = list(ids)
    return {"job_ids": listed, "tombstones": {"job_ids": listed, **more}}


def fence_text(generation: int | None, version: int | None) -> str:
    """``g2/v5``; ``?`` for an unknown half, ``-`` when both are (a plain job has neither):
    never ``gNone``. The log lines' and the admin's one spelling of a fence."""
    if generation is None and version is None:
        return "-"
    g = "?" if generation is None else generation
    v = "?" if version is None else version
    return f"g{g}/v{v}"
