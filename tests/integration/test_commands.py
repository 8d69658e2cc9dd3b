"""Management commands: clear errors for user mistakes, and the doctor's orphans."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import BaseCommand, CommandError, call_command
from django.db import transaction
from django_q.models import Task

import tombstones
from project.stress.management.commands import racestress
from tests.factories import CustomerFactory
from tombstones.models import Job
from tombstones.testing import FixtureError, load_cases

ROOT = Path(settings.BASE_DIR)
RACEFIXTURE = ["--model", "customers.Customer", "--handler", "customers.update_sheet_row"]
COMMANDS = [
    ("racefixture", RACEFIXTURE),
    ("purge_tombstones", ["--dry-run"]),
    ("tombstones_doctor", []),
    ("tombstones_roles", []),
]


# --- --database ------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "args"), COMMANDS)
def test_command__unknown_database_is_a_command_error(command: str, args: list[str]) -> None:
    with pytest.raises(CommandError, match=r"Unknown database 'nope' \(--database\)"):
        call_command(command, *args, "--database", "nope", stdout=StringIO())


@pytest.mark.parametrize(("command", "args"), COMMANDS)
def test_command__unknown_database_from_the_shell_has_no_traceback(
    command: str, args: list[str], tmp_path: Path
) -> None:
    # The shape users see: one line naming the alias, exit status 1, no traceback.
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'unused.sqlite3'}"}
    done = subprocess.run(
        [sys.executable, "manage.py", command, *args, "--database", "nope"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "CommandError: Unknown database 'nope' (--database): DATABASES has default." in (
        done.stderr
    )


# --- racefixture --cases ---------------------------------------------------------------------


def test_load_cases__bad_json_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "cases.json"
    path.write_text('[\n  {"name": "a",\n   "events": ["enqueue J"]\n   "expected": "x"}\n]\n')

    with pytest.raises(FixtureError) as caught:
        load_cases(path)

    assert str(caught.value) == (
        f"{path}, line 4, column 4: invalid JSON (Expecting ',' delimiter)."
    )


def test_load_cases__a_bad_case_is_named_by_its_position(tmp_path: Path) -> None:
    path = tmp_path / "cases.json"
    good = {"name": "ok", "events": ["enqueue J", "run J"], "expected": "succeeded"}
    path.write_text(json.dumps([good, {"name": "b", "events": "enqueue J", "expected": "x"}]))

    with pytest.raises(FixtureError, match=r"cases.json, case 2: Case 'b': 'events' must be"):
        load_cases(path)


def test_load_cases__missing_file_says_why(tmp_path: Path) -> None:
    with pytest.raises(FixtureError, match=r"Cannot read cases from .*: No such file"):
        load_cases(tmp_path / "nope.json")


@pytest.mark.django_db
def test_racefixture__bad_cases_json_is_a_command_error_with_the_position(tmp_path: Path) -> None:
    path = tmp_path / "cases.json"
    text = '[{"name": "a",}]'
    path.write_text(text)
    # Where the decoder says it went wrong: at the "}" up to Python 3.12, at the trailing comma
    # from 3.13 (which names it).
    with pytest.raises(json.JSONDecodeError) as decoded:
        json.loads(text)
    column = decoded.value.colno
    assert (decoded.value.lineno, column) in ((1, 14), (1, 15))

    where = rf"cases.json, line 1, column {column}: invalid JSON"
    with pytest.raises(CommandError, match=where):
        call_command("racefixture", *RACEFIXTURE, "--cases", str(path), stdout=StringIO())


# --- tombstones_doctor: orphans apart from contradictions -----------------------------------


def _doctor(*args: str) -> str:
    out = StringIO()
    call_command("tombstones_doctor", *args, stdout=out)
    return out.getvalue()


def _succeeded_job() -> Job:
    # Sync mode (tests/conftest.py): the real worker runs it and django-q2 stores its task.
    with transaction.atomic():
        job = tombstones.enqueue("customers.update_sheet_row", CustomerFactory())
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCEEDED
    assert Task.objects.filter(func="tombstones.worker.run", success=True).exists()
    return job


@pytest.mark.django_db(transaction=True)
def test_doctor__deleted_jobs_are_orphans_not_problems() -> None:
    jobs = [_succeeded_job() for _ in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in jobs]).delete()  # as racestress's reset does

    out = _doctor("--verbosity", "2")  # no CommandError: orphans are not problems

    assert "ok   django-q2 successes" in out
    assert "note orphaned django-q2 tasks: 3 successful task(s)" in out
    assert "job ids: " + ", ".join(str(j.pk) for j in jobs) in out
    assert "the ledger says None" not in out


@pytest.mark.django_db(transaction=True)
def test_doctor__orphan_ids_only_at_verbosity_2() -> None:
    Job.objects.filter(pk=_succeeded_job().pk).delete()

    out = _doctor()

    assert "note orphaned django-q2 tasks: 1 successful task(s)" in out
    assert "job ids" not in out


@pytest.mark.django_db(transaction=True)
def test_doctor__an_existing_job_with_another_status_is_a_contradiction() -> None:
    contradicted, orphaned = _succeeded_job(), _succeeded_job()
    Job.objects.filter(pk=contradicted.pk).update(status=Job.Status.REJECTED)
    Job.objects.filter(pk=orphaned.pk).delete()
    out = StringIO()

    with pytest.raises(CommandError, match="1 problem"):
        call_command("tombstones_doctor", stdout=out)

    text = out.getvalue()
    assert "FAIL django-q2 successes" in text
    assert f"job {contradicted.pk}: django-q2 task says succeeded, the ledger says rejected" in text
    assert "note orphaned django-q2 tasks: 1 successful task(s)" in text


@pytest.mark.django_db(transaction=True)
def test_doctor__no_orphans_no_note(settings: Any) -> None:
    _succeeded_job()

    assert "orphaned" not in _doctor()


# --- racestress: arguments and progress --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timeout", "-1"], "argument --timeout: must be > 0, not -1"),
        (["--timeout", "0"], "argument --timeout: must be > 0, not 0"),
        (["--timeout", "nan"], "argument --timeout: must be > 0, not nan"),
        (["--in-flight", "-3"], "argument --in-flight: must be >= 0, not -3"),
        (["--workers", "2", "0"], "argument --workers: must be >= 1 and <= 64, not 0"),
        (["--workers", "1000"], "argument --workers: must be >= 1 and <= 64, not 1000"),
        (["--entities", "0"], "argument --entities: must be >= 1, not 0"),
        (["--messages", "ten"], "argument --messages: 'ten' is not a whole number"),
        (["--delay-ms", "-5"], "argument --delay-ms: must be >= 0, not -5"),
        (["--recreate-gap-ms", "inf"], "argument --recreate-gap-ms: must be >= 0, not inf"),
        (["--slow-delete-ms", "x"], "argument --slow-delete-ms: 'x' is not a number"),
        (["--seed", "1.5"], "argument --seed: invalid int value"),
    ],
)
def test_racestress__bad_numbers_are_refused_before_anything_runs(
    args: list[str], message: str
) -> None:
    # No database access at all: argparse refuses the value first.
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("racestress", *args, stdout=StringIO(), stderr=StringIO())


@pytest.mark.parametrize(("verbosity", "lines"), [(0, 0), (1, 2)])
def test_racestress__progress_lines_off_a_terminal_by_verbosity(
    monkeypatch: pytest.MonkeyPatch, verbosity: int, lines: int
) -> None:
    monkeypatch.setattr(racestress, "PROGRESS_EVERY", 0.0)
    err = StringIO()
    command = BaseCommand(stderr=err)
    progress = racestress.Progress(command, "ordered x2", 10, verbosity, terminal=False)

    progress.update(3)
    progress.update(10)
    progress.close()

    assert len(err.getvalue().splitlines()) == lines
    if lines:
        assert err.getvalue().startswith("ordered x2: 3/10 jobs ended after ")


def test_racestress__a_signal_inside_a_commit_still_stops_cleanly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal that lands inside a commit breaks the transaction: the atomic block's exit raises
    a database error whose context is the Stopped. It is still a clean stop (a CI run saw it)."""
    import signal

    from django.db import ProgrammingError

    from project.stress import harness

    def other_error(*args: Any, **kwargs: Any) -> None:
        raise ProgrammingError("can't change 'autocommit' now")

    def chained(*args: Any, **kwargs: Any) -> None:
        try:
            raise harness.Stopped(signal.SIGHUP)
        except harness.Stopped:
            raise ProgrammingError("can't change 'autocommit' now")  # noqa: B904 - as Django does

    monkeypatch.setattr(racestress.Command, "run_one", chained)
    with pytest.raises(CommandError) as stopped:
        call_command("racestress", "--workers", "1", "--messages", "1")
    assert stopped.value.returncode == 128 + signal.SIGHUP
    assert "Stopped by SIGHUP" in str(stopped.value)
    # Any other error is not mistaken for a stop.
    monkeypatch.setattr(racestress.Command, "run_one", other_error)
    with pytest.raises(ProgrammingError):
        call_command("racestress", "--workers", "1", "--messages", "1")
