"""The race fixture: the seed's cases as data, run through the production worker's own phases.

Each case is an ordered event script over one record ``R`` and jobs ``J``, ``J1``, ``J2``…::

    enqueue J    tombstones.enqueue(handler, <R as it is now>)
    delete R     R.delete()                      (a tombstone)
    recreate R   all_objects.recreate(<R's business key>, ...)   (generation + 1)
    update R     all_objects.filter(pk=R).update()   (version + 1)
    start J      phases.claim + phases.check     (the worker's first two phases)
    write J      phases.act                      (act and record, in one transaction)
    run J        start J + write J

and an expected outcome per job: ``succeeded``, ``reread`` (succeeded after re-reading a newer
version), or ``<status>:<reason>`` such as ``rejected:source_deleted``. Nothing here re-implements
the check or the write: :mod:`tombstones.phases` does both, against the real database, and the
worker takes exactly this road: the check reads the record without a lock, and the act writes
against what it read, so a change landing in between is caught by the fenced write itself.

By default each case runs in one transaction of the caller's connection, rolled back (nothing is
left, and no running worker sees the jobs). With ``rollback=False`` the cases commit and the
record's events (delete, recreate, update) run on a second, real connection, as another request
would: use it on a test database (pytest's ``transactional_db``), with no cluster running.

Use it from ``manage.py racefixture`` or from pytest (the ``tombstone_race`` fixture)::

    def test_my_handler_is_fenced(tombstone_race):
        report = tombstone_race(model=Invoice, handler="billing.sync_invoice")
        assert report.ok, report.table()
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.db import connections, models, transaction
from django.utils import timezone

from . import phases
from .options import PROTECTED_FIELDS, get_options

VERBS = {"enqueue", "delete", "recreate", "update", "start", "write", "run"}
RECORD_VERBS = {"delete", "recreate", "update"}
SOURCE_STATE = {"rejected:source_deleted", "rejected:generation_changed"}


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


# The seed's four cases, then its worked example.
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
WORKED_EXAMPLE = Case(
    "worked example",
    ("enqueue J2", "delete R", "recreate R", "enqueue J3", "run J2", "run J3"),
    {"J2": "rejected:generation_changed", "J3": "succeeded"},
    writes=1,
)


@dataclass
class CaseResult:
    case: Case
    actual: dict[str, str]
    writes: int
    error: str = ""

    @property
    def ok(self) -> bool:
        if self.error or self.actual != self.case.expected:
            return False
        return self.case.writes is None or self.case.writes == self.writes

    @property
    def category(self) -> str:
        """How the case counts in the summary line."""
        if not self.ok:
            return "unaccounted"
        outcomes = set(self.actual.values())
        if outcomes <= SOURCE_STATE:
            return "rejected"
        if outcomes == {"reread"}:
            return "reread"
        return "other"


@dataclass
class Report:
    results: list[CaseResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def summary(self) -> str:
        counts = {"rejected": 0, "reread": 0, "other": 0, "unaccounted": 0}
        for result in self.results:
            counts[result.category] += 1
        line = (
            f"{len(self.results)} case{'s' if len(self.results) != 1 else ''}: "
            f"{counts['rejected']} rejected for source state, "
            f"{counts['reread']} re-read for stale version"
        )
        if counts["other"]:
            line += f", {counts['other']} other as expected"
        return line + f", {counts['unaccounted']} unaccounted"

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        def fmt(outcomes: dict[str, str]) -> str:
            return ", ".join(f"{job}={value}" for job, value in outcomes.items())

        return [
            (
                r.case.name,
                " → ".join(r.case.events),
                fmt(r.case.expected)
                + (f" writes={r.case.writes}" if r.case.writes is not None else ""),
                (fmt(r.actual) + f" writes={r.writes}") if not r.error else f"error: {r.error}",
                "ok" if r.ok else "MISMATCH",
            )
            for r in self.results
        ]

    def table(self) -> str:
        header = ("case", "events", "expected", "actual", "verdict")
        rows = [header, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join([*lines, "", self.summary()])


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


def sample_values(model: type[models.Model]) -> dict[str, Any]:
    """Values for a new record of ``model``: every required field, unique where it matters."""
    values: dict[str, Any] = {}
    token = uuid.uuid4().hex[:10]
    for f in model._meta.concrete_fields:
        if f.primary_key or f.name in PROTECTED_FIELDS or f.has_default() or f.null:
            continue
        if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            continue
        if isinstance(f, models.ForeignKey):
            raise FixtureError(
                f"{model._meta.label}.{f.name} is a required foreign key: pass make_record=."
            )
        values[f.name] = _sample(f, token)
    return values


def _sample(f: models.Field[Any, Any], token: str) -> Any:
    if isinstance(f, models.EmailField):
        return f"rf-{token}@example.invalid"
    if isinstance(f, models.CharField | models.TextField | models.SlugField):
        return f"rf-{token}"[: f.max_length or 64]
    if isinstance(f, models.BooleanField):
        return False
    if isinstance(f, models.DecimalField):
        return Decimal(0)
    if isinstance(f, models.IntegerField | models.FloatField):
        return 0
    if isinstance(f, models.DateTimeField):
        return timezone.now()
    if isinstance(f, models.DateField):
        return date.today()
    if isinstance(f, models.UUIDField):
        return uuid.uuid4()
    if isinstance(f, models.JSONField):
        return {}
    raise FixtureError(f"No sample value for {f.model._meta.label}.{f.name}: pass make_record=.")


class _Rollback(Exception):
    pass


class RaceFixture:
    """Runs cases against ``model`` and ``handler``; each case in a transaction rolled back.

    ``make_record()`` returns a new saved live record (default: sample values). The rollback keeps
    the user's database unchanged and hides the jobs from any running worker. ``rollback=False``
    commits instead, and runs the record's events on a second connection (see the module
    docstring).
    """

    def __init__(
        self,
        model: type[models.Model],
        handler: str,
        *,
        make_record: Callable[[], Any] | None = None,
        using: str | None = None,
        rollback: bool = True,
    ) -> None:
        from .records import TombstoneModel

        if not (isinstance(model, type) and issubclass(model, TombstoneModel)):
            raise FixtureError(f"{model!r} is not a TombstoneModel.")
        if get_options(model).business_key is None:
            raise FixtureError(f"{model._meta.label} has no TombstoneMeta.business_key.")
        self.model = model
        self.handler = handler
        self.make_record = make_record or self._default_record
        self.using = using
        self.rollback = rollback

    def _default_record(self) -> Any:
        return self.model.objects.create(**sample_values(self.model))

    def run(self, cases: Iterable[Case] = (*SEED_CASES, WORKED_EXAMPLE)) -> Report:
        report = Report()
        for case in cases:
            report.results.append(self.run_case(case))
        return report

    def run_case(self, case: Case) -> CaseResult:
        case.validate()
        result = CaseResult(case, {}, 0)
        try:
            if self.rollback:
                with transaction.atomic(using=self.using):
                    self._play(case, result)
                    raise _Rollback
            else:
                self._play(case, result)
        except _Rollback:
            pass
        except Exception as exc:  # noqa: BLE001 - a case that errors is reported, not raised
            result.error = type(exc).__name__
        return result

    def _play(self, case: Case, result: CaseResult) -> None:
        from . import enqueue

        model: Any = self.model
        record = self.make_record()
        key = get_options(model).business_key
        identity = {f.name: getattr(record, f.name) for f in model._meta.concrete_fields}
        pk = record.pk
        jobs: dict[str, Any] = {}
        attempts: dict[str, phases.Attempt | None] = {}
        db = self.using
        fields = {
            n: v
            for n, v in identity.items()
            if n not in PROTECTED_FIELDS and n != model._meta.pk.name
        }
        fields[key] = identity[key]
        changes: dict[str, Callable[[], Any]] = {
            "delete": lambda: model.all_objects.using(db).get(pk=pk).delete(),
            "recreate": lambda: model.all_objects.db_manager(db).recreate(**fields),
            "update": lambda: model.all_objects.using(db).filter(pk=pk).update(),
        }
        for event in case.events:
            verb, _, name = event.partition(" ")
            if verb == "enqueue":
                jobs[name] = enqueue(self.handler, model.all_objects.using(db).get(pk=pk), using=db)
            elif verb in changes:
                if self.rollback:
                    changes[verb]()
                else:
                    on_second_connection(changes[verb], using=db)
            elif verb in ("start", "run"):
                attempt = phases.claim(jobs[name].pk, using=self.using)
                attempts[name] = attempt
                if attempt is not None:
                    phases.check(attempt)
                if verb == "run":
                    self._write(attempts, name, result)
            elif verb == "write":
                self._write(attempts, name, result)
        for name in case.expected:
            result.actual[name] = _label(jobs[name], attempts.get(name))

    def _write(
        self, attempts: dict[str, phases.Attempt | None], name: str, result: CaseResult
    ) -> None:
        attempt = attempts.get(name)
        if attempt is None or attempt.done:
            return  # not claimed, or already decided at the check
        outcome = phases.act(attempt)
        if outcome is not None:
            result.writes += outcome.writes


def on_second_connection(action: Callable[[], Any], *, using: str | None = None) -> Any:
    """Run ``action`` in a thread of its own (its own database connection), committed on return,
    as another request would; re-raises what it raised."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            with transaction.atomic(using=using):
                outcome["result"] = action()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="tombstones-race-fixture")
    thread.start()
    thread.join(SECOND_CONNECTION_SECONDS)
    if thread.is_alive():
        raise FixtureError(
            f"The second connection did not finish within {SECOND_CONNECTION_SECONDS} s "
            "(it waits for a lock the job holds)."
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


# The longest a record's event on the second connection may take (a lock wait is a finding).
SECOND_CONNECTION_SECONDS = 30


def _label(job: Any, attempt: phases.Attempt | None) -> str:
    job.refresh_from_db()
    if attempt is None:
        return f"not_claimed:{job.status}"
    if job.status == "succeeded":
        return "reread" if job.rereads else "succeeded"
    return f"{job.status}:{job.reason}" if job.reason else str(job.status)


def run_race_fixture(
    model: type[models.Model],
    handler: str,
    *,
    cases: Sequence[Case] | None = None,
    make_record: Callable[[], Any] | None = None,
    using: str | None = None,
) -> Report:
    """Run the seed's cases (and the worked example) plus ``cases`` against a model and handler."""
    fixture = RaceFixture(model, handler, make_record=make_record, using=using)
    return fixture.run([*SEED_CASES, WORKED_EXAMPLE, *(cases or ())])
