"""Load what the checks need from the private database and the journals, as plain data."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db.models import Max, Min

from tombstones.models import Job, JobEvent

from ..models import SoakEdit, SoakEffect, StressEntity
from . import journal
from .checks import Edit, Effect, JobRow, RecordRow
from .journal import Call, Claimed, End, Enqueued, Start

JOB_FIELDS = (
    "id", "lane", "queued_at", "handler", "external", "status", "reason", "attempts",
    "started_at", "finished_at", "owner",
)  # fmt: skip


@dataclass
class Evidence:
    jobs: list[JobRow] = field(default_factory=list)
    records: list[RecordRow] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)
    starts: list[Start] = field(default_factory=list)
    ends: list[End] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    claims: list[Claimed] = field(default_factory=list)
    enqueued: list[Enqueued] = field(default_factory=list)


def _at(value: Any) -> int | None:
    return journal.micros(value) if value is not None else None


def load(journal_dir: Path) -> Evidence:
    found = Evidence()
    for row in Job.objects.order_by().values_list(*JOB_FIELDS).iterator(chunk_size=5000):
        (pk, lane, queued_at, handler, external, status, reason, attempts, started, finished,
         owner) = row  # fmt: skip
        found.jobs.append(
            JobRow(
                id=pk,
                lane=lane,
                place=journal.micros(queued_at),
                handler=handler,
                external=external,
                status=status,
                reason=reason,
                attempts=attempts,
                started=_at(started),
                finished=_at(finished),
                owner=owner,
                claim=journal.claim_key(owner, started),
            )
        )
    for pk, generation, version, counter, deleted_at in StressEntity.all_objects.values_list(
        "pk", "generation", "version", "counter", "deleted_at"
    ):
        found.records.append(RecordRow(pk, generation, version, counter, deleted_at is not None))
    found.effects = [
        Effect(*row)
        for row in SoakEffect.objects.values_list(
            "job_id", "entity_id", "generation", "version", "counter", "claim"
        ).iterator(chunk_size=5000)
    ]
    found.edits = [
        Edit(*row)
        for row in SoakEdit.objects.values_list("entity_id", "generation", "version", "kind")
    ]
    for entry in journal.read(journal_dir):
        if isinstance(entry, Start):
            found.starts.append(entry)
        elif isinstance(entry, End):
            found.ends.append(entry)
        elif isinstance(entry, Call):
            found.calls.append(entry)
        elif isinstance(entry, Claimed):
            found.claims.append(entry)
        else:
            found.enqueued.append(entry)
    return found


def span() -> dict[str, Any]:
    """First enqueue and last finish (database clock) of the soak's jobs."""
    return Job.objects.aggregate(first=Min("created_at"), last=Max("finished_at"))


def add_events(violations: list[dict[str, Any]]) -> None:
    """Each violation's two jobs get their stored events (the JobEvent table), in order."""
    ids = {v[side]["id"] for v in violations for side in ("job", "earlier")}
    events: dict[int, list[dict[str, Any]]] = defaultdict(list)
    rows = JobEvent.objects.filter(job_id__in=ids).order_by("created_at", "id")
    for job_id, event, reason, worker, at in rows.values_list(
        "job_id", "event", "reason", "worker", "created_at"
    ):
        events[job_id].append(
            {"event": event, "reason": reason, "worker": worker, "at": journal.micros(at)}
        )
    for violation in violations:
        for side in ("job", "earlier"):
            violation[side]["events"] = events.get(violation[side]["id"], [])
