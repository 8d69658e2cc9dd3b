"""The race fixture: race cases as data, run through the production worker's own phases.

Each case is an ordered event script over one record ``R`` and jobs ``J``, ``J1``, ``J2``…::

    enqueue J    tombstones.enqueue(handler, <R as it is now>)
    delete R     R.delete()                      (a tombstone)
    recreate R   all_objects.recreate(<R's business key>, ...)   (generation + 1)
    update R     all_objects.filter(pk=R).update()   (version + 1)
    start J      steps.claim + steps.check       (the worker's first two phases)
    write J      steps.act                       (act and record, in one transaction)
    run J        start J + write J

and an expected outcome per job: ``succeeded``, ``reread`` (succeeded after re-reading a newer
version), or ``<status>:<reason>`` such as ``rejected:source_deleted``. Nothing here re-implements
the check or the write: :mod:`tombstones.jobs.engine.steps` does both, against the real database,
and the worker takes exactly this road: the check reads the record without a lock, and the act
writes against what it read, so a change landing in between is caught by the fenced write itself.

By default each case runs in one transaction of the caller's connection, rolled back (nothing is
left, and no running worker sees the jobs). With ``rollback=False`` the cases commit and the
record's events (delete, recreate, update) run on a second, real connection, as another request
would: use it on a test database (pytest's ``transactional_db``), with no cluster running.

Use it from ``manage.py racefixture`` or from pytest (the ``tombstone_race`` fixture)::

    def test_my_handler_is_fenced(tombstone_race):
        report = tombstone_race(model=Invoice, handler="billing.sync_invoice")
        assert report.ok, report.table()
"""

from .cases import SEED_CASES, WORKED_EXAMPLE, Case, FixtureError, load_cases
from .report import CaseResult, Report
from .runner import RaceFixture, on_second_connection, run_race_fixture
from .samples import sample_values

__all__ = [
    "SEED_CASES",
    "WORKED_EXAMPLE",
    "Case",
    "CaseResult",
    "FixtureError",
    "RaceFixture",
    "Report",
    "load_cases",
    "on_second_connection",
    "run_race_fixture",
    "sample_values",
]
