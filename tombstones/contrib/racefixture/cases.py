"""The race fixture's case format: the event verbs, :class:`Case`, the four built-in cases and the
worked example, and :func:`load_cases` for a JSON file of more."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERBS = {"enqueue", "delete", "recreate", "update", "start", "write", "run"}
RECORD_VERBS = {"delete", "recreate", "update"}


class FixtureError(ValueError):
    """A malformed case or event script."""


@dataclass(frozen=True)
class Case:
    name: str
    events: tuple[str, ...]
    expected: dict[str, str]
    writes: int | None = None  # expected committed writes across the case's jobs, if given

    @classmethod
    def parse(cls, data: Any) -> Case:
        if not isinstance(data, dict):
            raise FixtureError("A case must be a JSON object with name, events and expected.")
        name, events, expected = data.get("name"), data.get("events"), data.get("expected")
        if not isinstance(name, str) or not name:
            raise FixtureError("A case needs a non-empty 'name'.")
        if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
            raise FixtureError(f"Case {name!r}: 'events' must be a list of strings.")
        if isinstance(expected, str):
            expected = {"J": expected}
        if not isinstance(expected, dict) or not expected:
            raise FixtureError(f"Case {name!r}: 'expected' must be a string or an object.")
        writes = data.get("writes")
        if writes is not None and not isinstance(writes, int):
            raise FixtureError(f"Case {name!r}: 'writes' must be an integer.")
        case = cls(name, tuple(events), {str(k): str(v) for k, v in expected.items()}, writes)
        case.validate()
        return case

    def validate(self) -> None:
        enqueued: set[str] = set()
        for event in self.events:
            verb, _, target = event.partition(" ")
            if verb not in VERBS or not target:
                raise FixtureError(f"Case {self.name!r}: unknown event {event!r}.")
            if verb in RECORD_VERBS and target != "R":
                raise FixtureError(f"Case {self.name!r}: {verb} applies to R, not {target!r}.")
            if verb == "enqueue":
                enqueued.add(target)
            elif verb not in RECORD_VERBS and target not in enqueued:
                raise FixtureError(f"Case {self.name!r}: {event!r} before 'enqueue {target}'.")
        missing = set(self.expected) - enqueued
        if missing:
            raise FixtureError(
                f"Case {self.name!r}: expected outcome for unknown job(s) {missing}."
            )


# The race fixture's four cases: a job after a delete; a delete between the check and the write;
# a delete and a re-create before an old job; an update between the check and the write.
SEED_CASES: tuple[Case, ...] = (
    Case("1", ("enqueue J", "delete R", "start J"), {"J": "rejected:source_deleted"}),
    Case(
        "2",
        ("enqueue J", "start J", "delete R", "write J"),
        {"J": "rejected:source_deleted"},
    ),
    Case(
        "3",
        ("enqueue J", "delete R", "recreate R", "start J"),
        {"J": "rejected:generation_changed"},
    ),
    Case("4", ("enqueue J", "start J", "update R", "write J"), {"J": "reread"}),
)
# Two jobs across a re-create: the old generation's is rejected, the new one's writes once.
WORKED_EXAMPLE = Case(
    "worked example",
    ("enqueue J2", "delete R", "recreate R", "enqueue J3", "run J2", "run J3"),
    {"J2": "rejected:generation_changed", "J3": "succeeded"},
    writes=1,
)


def load_cases(path: str | Path) -> list[Case]:
    """Cases from a JSON file: a list of {"name", "events", "expected"[, "writes"]}."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FixtureError(f"Cannot read cases from {path}: {exc.strerror or exc}.") from None
    except UnicodeDecodeError as exc:
        raise FixtureError(f"{path}: not UTF-8 text (byte {exc.start}).") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # The position, so the author can find the mistake; never the file's content.
        raise FixtureError(
            f"{path}, line {exc.lineno}, column {exc.colno}: invalid JSON ({exc.msg})."
        ) from None
    if not isinstance(data, list):
        raise FixtureError(f"{path}: a cases file holds a JSON list of cases.")
    cases = []
    for number, item in enumerate(data, start=1):
        try:
            cases.append(Case.parse(item))
        except FixtureError as exc:
            raise FixtureError(f"{path}, case {number}: {exc}") from None
    return cases
