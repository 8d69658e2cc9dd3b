"""The editor: staff editing, deleting and re-creating records throughout the soak, in a process
of its own (``manage.py soak_editor``), through the record API.

Each change and its :class:`SoakEdit` row commit in one transaction, with the job a real user's
request would enqueue: an edit is synced out (``soak.external``), a delete is propagated
(``soak.forget``, which runs on tombstones), a re-create is synced out. A change that loses a
race with a job (the record moved between the read and the save) raises the library's typed
error and is counted as a conflict, as a form would show it.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable

from django.db import transaction

import tombstones
from tombstones.exceptions import TombstoneError

from ..models import SoakEdit, StressEntity
from . import journal
from .outages import retrying

# Share of live records an editor action deletes (the rest are edited); a tombstone is
# re-created. About a sixth of the records are tombstones at any time.
DELETE_SHARE = 0.2


class Editor:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.tally: Counter[str] = Counter()
        self.record_ids = list(StressEntity.all_objects.values_list("pk", flat=True))

    def step(self) -> None:
        pk = self.rng.choice(self.record_ids)
        try:
            kind, job_id = retrying(lambda: self._change(pk))
        except TombstoneError as exc:
            self.tally[f"conflict_{type(exc).__name__}"] += 1
            return
        if job_id:
            journal.enqueued(job_id)
        self.tally[kind] += 1

    def _change(self, pk: int) -> tuple[str, int]:
        with transaction.atomic():
            record = StressEntity.all_objects.get(pk=pk)
            if record.is_tombstone:
                record = StressEntity.all_objects.recreate(
                    key=record.key, payload="recreated", counter=0
                )
                kind, job = SoakEdit.Kind.RECREATE, "soak.external"
            elif self.rng.random() < DELETE_SHARE:
                if not record.delete()[0]:
                    return "conflict_delete", 0
                kind, job = SoakEdit.Kind.DELETE, "soak.forget"
            else:
                record.payload = f"edited-{self.rng.randrange(10**6)}"
                record.save()
                kind, job = SoakEdit.Kind.EDIT, "soak.external"
            SoakEdit.objects.create(
                entity_id=record.pk, generation=record.generation, version=record.version, kind=kind
            )
            enqueued = tombstones.enqueue(job, record, params={"ms": 40})
        return str(kind), int(enqueued.pk)


def run(rate: float, seed: int, stopped: Callable[[], bool]) -> Counter[str]:
    """Make about ``rate`` changes a second (Poisson) until ``stopped()``; the tally."""
    editor = Editor(random.Random(seed))
    while rate > 0 and not stopped():
        editor.step()
        time.sleep(editor.rng.expovariate(rate))
    return editor.tally
