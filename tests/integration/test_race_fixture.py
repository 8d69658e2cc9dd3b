"""The race fixture: as a library, as a command, and as a pytest fixture for users."""

from __future__ import annotations

import json
import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from project.customers.models import Customer
from tests.factories import CustomerFactory, SheetRowFactory
from tombstones.models import Job
from tombstones.testing import SEED_CASES, WORKED_EXAMPLE, Case, FixtureError, RaceFixture

pytestmark = pytest.mark.django_db


def test_fixture__seed_cases_match_and_summarise() -> None:
    report = RaceFixture(Customer, "customers.update_sheet_row").run(SEED_CASES)
    assert report.ok, report.table()
    assert [r.actual["J"] for r in report.results] == [
        "rejected:source_deleted",
        "rejected:source_deleted",
        "rejected:generation_changed",
        "reread",
    ]
    assert report.summary() == (
        "4 cases: 3 rejected for source state, 1 re-read for stale version, 0 unaccounted"
    )


def test_fixture__worked_example_gives_exactly_one_write() -> None:
    report = RaceFixture(Customer, "customers.update_sheet_row").run([WORKED_EXAMPLE])
    result = report.results[0]
    assert result.ok, report.table()
    assert result.actual == {"J2": "rejected:generation_changed", "J3": "succeeded"}
    assert result.writes == 1


def test_fixture__rolls_back_every_case() -> None:
    RaceFixture(Customer, "customers.update_sheet_row").run([*SEED_CASES, WORKED_EXAMPLE])
    assert not Customer.all_objects.exists()
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("handler", ["customers.update_sheet_row", "t.write_only"])
def test_fixture__committed_the_record_changes_on_a_second_real_connection(
    settings: Any, handler: str
) -> None:
    """The worker's own road (a check without a lock, the fence at the write), with every delete,
    re-create and update made by another connection, as another request would: case 2's delete
    lands at once between the check and the write, and the write fails."""
    from project.customers.models import SheetRow
    from tests.jobkit import temp_handler

    settings.TOMBSTONES_Q_OPTIONS = {}  # no worker runs here: the fixture drives the phases

    def write_only(ctx: Any) -> None:
        ctx.write(SheetRow.objects.filter(customer_id=ctx.record.pk), synced_version=1)

    def with_a_sheet_row() -> Customer:
        return SheetRowFactory().customer  # the write-only handler's one write

    make = with_a_sheet_row if handler == "t.write_only" else None
    with temp_handler("t.write_only", write_only):
        fixture = RaceFixture(Customer, handler, rollback=False, make_record=make)
        report = fixture.run([*SEED_CASES, WORKED_EXAMPLE])
    assert report.ok, report.table()
    assert report.summary().startswith(
        "5 cases: 3 rejected for source state, 1 re-read for stale version"
    )
    assert Job.objects.count() == 6  # committed: what ran is in the ledger


def test_fixture__a_wrong_expectation_is_a_mismatch() -> None:
    wrong = Case("wrong", ("enqueue J", "delete R", "start J"), {"J": "succeeded"})
    report = RaceFixture(Customer, "customers.update_sheet_row").run([wrong])
    assert not report.ok
    assert report.summary().endswith("1 unaccounted")
    assert "MISMATCH" in report.table()


def test_fixture__an_unfenced_handler_would_be_caught() -> None:
    """A handler that writes with a plain update (no fence) fails case 2: the fixture sees it."""
    from tests.jobkit import temp_handler

    def unfenced(ctx: Any) -> None:
        Customer.all_objects.filter(pk=ctx.record.pk).update(phone="+0")  # ignores the fence
        ctx.writes += 1

    with temp_handler("t.unfenced", unfenced):
        report = RaceFixture(Customer, "t.unfenced").run(SEED_CASES)
    assert not report.ok
    assert report.results[1].actual["J"] == "succeeded"  # wrote after the delete: caught


def test_fixture__with_a_custom_record_factory() -> None:
    report = RaceFixture(
        Customer, "customers.update_sheet_row", make_record=lambda: CustomerFactory()
    ).run(SEED_CASES)
    assert report.ok, report.table()


@pytest.mark.parametrize(
    "bad",
    [
        {"events": ["enqueue J"], "expected": "succeeded"},
        {"name": "x", "events": ["enqueue J", "explode R"], "expected": "succeeded"},
        {"name": "x", "events": ["start J"], "expected": "succeeded"},
        {"name": "x", "events": ["enqueue J", "delete J"], "expected": "succeeded"},
        {"name": "x", "events": ["enqueue J"], "expected": {"K": "succeeded"}},
        ["not", "an", "object"],
    ],
)
def test_case__malformed_scripts_are_refused(bad: Any) -> None:
    with pytest.raises(FixtureError):
        Case.parse(bad)


FOUR_CASES = "4 cases: 3 rejected for source state, 1 re-read for stale version, 0 unaccounted"


def _demo_fixture() -> str:
    """The command's output for the demo's model and handler."""
    out = StringIO()
    call_command(
        "racefixture",
        "--model",
        "customers.Customer",
        "--handler",
        "customers.update_sheet_row",
        stdout=out,
    )
    return out.getvalue()


def test_command__prints_the_table_and_the_summary_line() -> None:
    text = _demo_fixture()
    assert "case" in text
    assert "verdict" in text
    assert FOUR_CASES in text
    assert "MISMATCH" not in text


def test_command__prints_each_summary_once() -> None:
    text = _demo_fixture()
    assert text.count(FOUR_CASES) == 1, text
    # Every "N cases: ..." line (the four cases' and the worked example's) appears once.
    summaries = re.findall(r"^\d+ cases?: .*$", text, flags=re.MULTILINE)
    assert len(summaries) == 2, text
    assert len(set(summaries)) == len(summaries), text
    assert text.rstrip().endswith("all 5 cases as expected."), text


def test_command__adds_cases_from_a_file_and_fails_on_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "cases.json"
    path.write_text(
        json.dumps(
            [
                {
                    "name": "mine",
                    "events": ["enqueue J", "update R", "run J"],
                    "expected": "succeeded",
                },
                {
                    "name": "wrong",
                    "events": ["enqueue J", "delete R", "run J"],
                    "expected": "succeeded",
                },
            ]
        )
    )
    out = StringIO()
    with pytest.raises(CommandError, match="mismatch"):
        call_command(
            "racefixture",
            "--model",
            "customers.Customer",
            "--handler",
            "customers.update_sheet_row",
            "--cases",
            str(path),
            stdout=out,
        )
    assert "mine" in out.getvalue()
    assert "MISMATCH" in out.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "customers.Nope", "--handler", "customers.update_sheet_row"], "Unknown model"),
        (["--model", "customers.Customer", "--handler", "nope"], "nope"),
        (["--model", "customers.CrmContact", "--handler", "customers.update_sheet_row"], "not a"),
    ],
)
def test_command__bad_input_is_a_command_error(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("racefixture", *args, stdout=StringIO())


def test_plugin__tombstone_race_fixture_runs_the_seed_cases(tombstone_race: Any) -> None:
    report = tombstone_race(model=Customer, handler="customers.update_sheet_row")
    assert report.ok, report.table()
    assert len(report.results) == 5
