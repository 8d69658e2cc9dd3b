"""The race fixture's runner: plays each case's events through the worker's own phases, on the
caller's connection (rolled back) or with the record's events on a second, real connection."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connections, models, transaction

from ...jobs.engine import steps
from ...records.options import PROTECTED_FIELDS, get_options
from .cases import SEED_CASES, WORKED_EXAMPLE, Case, FixtureError
from .report import CaseResult, Report
from .samples import sample_values


class _Rollback(Exception):
    pass


class RaceFixture:
    """Runs cases against ``model`` and ``handler``; each case in a transaction rolled back.

    ``handler`` is a handler's name, or a task of ``tombstones.tasks.TombstoneBackend`` (its jobs
    are then enqueued through ``task.enqueue(record)``, as an application would).

    ``make_record()`` returns a new saved live record (default: sample values). The rollback keeps
    the user's database unchanged and hides the jobs from any running worker. ``rollback=False``
    commits instead, and runs the record's events on a second connection (see
    :mod:`tombstones.contrib.racefixture`).
    """

    def __init__(
        self,
        model: type[models.Model],
        handler: Any,
        *,
        make_record: Callable[[], Any] | None = None,
        using: str | None = None,
        rollback: bool = True,
    ) -> None:
        from ...records.mixin import TombstoneModel

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

    def _enqueue(self, record: Any) -> Any:
        from ... import enqueue
        from ...jobs.models import Job

        if isinstance(self.handler, str):
            return enqueue(self.handler, record, using=self.using)
        # A django.tasks task: the job its TaskResult names.
        return Job.objects.using(self.using).get(pk=self.handler.enqueue(record).id)

    def _play(self, case: Case, result: CaseResult) -> None:
        model: Any = self.model
        record = self.make_record()
        key = get_options(model).business_key
        identity = {f.name: getattr(record, f.name) for f in model._meta.concrete_fields}
        pk = record.pk
        jobs: dict[str, Any] = {}
        attempts: dict[str, steps.Attempt | None] = {}
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
                jobs[name] = self._enqueue(model.all_objects.using(db).get(pk=pk))
            elif verb in changes:
                if self.rollback:
                    changes[verb]()
                else:
                    on_second_connection(changes[verb], using=db)
            elif verb in ("start", "run"):
                attempt = steps.claim(jobs[name].pk, using=self.using)
                attempts[name] = attempt
                if attempt is not None:
                    steps.check(attempt)
                if verb == "run":
                    self._write(attempts, name, result)
            elif verb == "write":
                self._write(attempts, name, result)
        for name in case.expected:
            result.actual[name] = _label(jobs[name], attempts.get(name))

    def _write(
        self, attempts: dict[str, steps.Attempt | None], name: str, result: CaseResult
    ) -> None:
        attempt = attempts.get(name)
        if attempt is None or attempt.done:
            return  # not claimed, or already decided at the check
        outcome = steps.act(attempt)
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


def _label(job: Any, attempt: steps.Attempt | None) -> str:
    job.refresh_from_db()
    if attempt is None:
        return f"not_claimed:{job.status}"
    if job.status == "succeeded":
        return "reread" if job.rereads else "succeeded"
    return f"{job.status}:{job.reason}" if job.reason else str(job.status)


def run_race_fixture(
    model: type[models.Model],
    handler: Any,
    *,
    cases: Sequence[Case] | None = None,
    make_record: Callable[[], Any] | None = None,
    using: str | None = None,
) -> Report:
    """Run the four race cases, the worked example and ``cases`` against a model and handler."""
    fixture = RaceFixture(model, handler, make_record=make_record, using=using)
    return fixture.run([*SEED_CASES, WORKED_EXAMPLE, *(cases or ())])
