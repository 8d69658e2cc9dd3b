"""The public API, pinned: what users import, and the dotted paths stored outside the code.

A move inside the package must keep every name here where it is. Dotted paths stored in
database rows (django-q2's queue and schedule, the project's ``handler403``, the pytest entry
point) are resolved the way their owner resolves them.
"""

from __future__ import annotations

import inspect
from importlib import import_module
from importlib.metadata import entry_points

import pytest
from django.contrib import admin
from django.core.management import get_commands
from django.db import models
from django.utils.module_loading import import_string

import tombstones
from tombstones import exceptions
from tombstones.conf import tombstone_settings


def test_public_api__the_package_names() -> None:
    assert set(tombstones.__all__) == {
        "TransientError",
        "__version__",
        "enqueue",
        "enqueue_many",
        "enqueue_plain",
        "handler",
    }
    for name in ("enqueue", "enqueue_many"):
        function = getattr(tombstones, name)
        assert inspect.isfunction(function)
        assert inspect.signature(function).parameters["ordering_key"].kind is (
            inspect.Parameter.KEYWORD_ONLY
        )
    for name in ("enqueue", "enqueue_many", "enqueue_plain"):
        keyword = inspect.signature(getattr(tombstones, name)).parameters["priority"]
        assert (keyword.kind, keyword.default) == (inspect.Parameter.KEYWORD_ONLY, 0)
    assert callable(tombstones.handler("tests.public-api-probe"))  # a decorator, not yet applied
    assert tombstones.TransientError is exceptions.TransientError
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        tombstones.missing  # noqa: B018


def test_public_api__the_models_module() -> None:
    from tombstones import models as public

    for name in ("Job", "JobEvent", "Rejection", "Dashboard"):
        model = getattr(public, name)
        assert issubclass(model, models.Model)
        assert model._meta.app_label == "tombstones"
    assert public.TombstoneModel._meta.abstract is True
    assert {"generation", "version", "deleted_at"} <= {
        f.name for f in public.TombstoneModel._meta.get_fields()
    }
    assert set(public.__all__) == {"Dashboard", "Job", "JobEvent", "Rejection", "TombstoneModel"}


def test_public_api__the_exceptions() -> None:
    expected = {
        "TombstoneError",
        "RecordDeleted",
        "GenerationChanged",
        "StaleVersion",
        "AlreadyLive",
        "RecordMissing",
        "MissingFence",
        "NotATombstoneModel",
        "ProtectedField",
        "UnknownHandler",
        "InvalidParams",
        "InvalidOrderingKey",
        "InvalidRunAfter",
        "UnfencedWrite",
        "TransientError",
        "LeaseLost",
        "UnfencedTask",
        "JobFailed",
        "JobExpired",
        "JobCancelled",
        "OutcomeUncertain",
    }
    defined = {
        name
        for name, value in vars(exceptions).items()
        if isinstance(value, type) and issubclass(value, Exception)
    }
    assert expected <= defined
    for name in expected:
        assert issubclass(getattr(exceptions, name), exceptions.TombstoneError) or (
            name == "TombstoneError"
        )


def test_public_api__the_admin() -> None:
    from tombstones import admin as public

    assert issubclass(public.TombstoneAdmin, admin.ModelAdmin)
    for name in ("JobAdmin", "JobEventAdmin", "RejectionAdmin", "DashboardAdmin"):
        assert issubclass(getattr(public, name), admin.ModelAdmin)
    assert callable(public.timeline_url)
    registered = {type(model_admin).__name__ for model_admin in admin.site._registry.values()}
    assert {"JobAdmin", "JobEventAdmin", "RejectionAdmin", "DashboardAdmin"} <= registered


def test_public_api__the_settings() -> None:
    for name in (
        "STALE_REREADS",
        "MAX_ATTEMPTS",
        "RETRY_BACKOFF",
        "RETRY_BACKOFF_MAX",
        "RETENTION",
        "JOB_RETENTION",
        "AUDIT_RETENTION",
        "JOB_MAX_AGE",
        "LEASE",
        "SWEEP_MINUTES",
        "BATCH_SIZE",
        "WAKE_BUDGET",
        "Q_OPTIONS",
        "PARAMS_MAX_BYTES",
        "RACE_FIXTURE",
        "LOG_ERROR_DETAILS",
        "METRICS_TOKEN",
    ):
        getattr(tombstone_settings, name)  # raises if a setting went missing


def test_public_api__the_commands() -> None:
    ours = {name for name, app in get_commands().items() if app == "tombstones"}
    assert ours == {
        "purge_jobs",
        "purge_tombstones",
        "tombstones_health",
        "racefixture",
        "tombstones_doctor",
        "tombstones_roles",
    }


@pytest.mark.parametrize(
    "path",
    [
        # django-q2's queue rows name the wake-up task; its schedule rows the sweep and the
        # purge (whose queue rows name it too, when a run hands what is left to another).
        "tombstones.worker.run",
        "tombstones.worker.run_sweep",
        "tombstones.worker.run_purge",
        # The admin's rejection log says how far back it goes with it.
        "tombstones.jobs.retention.horizon",
        # The project's urls.py sets handler403 to it.
        "tombstones.views.permission_denied",
        # Migration 0003 runs it.
        "tombstones.roles.apply_auditors",
        # Handlers type their argument with it.
        "tombstones.context.HandlerContext",
        # The race fixture, for users' own tests.
        "tombstones.testing.RaceFixture",
        "tombstones.testing.run_race_fixture",
        "tombstones.testing.load_cases",
        "tombstones.testing.SEED_CASES",
        # Settings name the tasks backend: TASKS = {"default": {"BACKEND": ...}}.
        "tombstones.tasks.TombstoneBackend",
        "tombstones.tasks.TombstoneTaskContext",
        "tombstones.tasks.fenced_task",
    ],
)
def test_public_api__dotted_paths_stored_outside_the_code_resolve(path: str) -> None:
    assert import_string(path) is not None


def test_public_api__the_stored_task_paths_are_the_ones_resolved() -> None:
    from tombstones import worker
    from tombstones.jobs.wakeups import TASK

    # What enqueue stores in django-q2's queue is the function the worker runs.
    assert TASK == "tombstones.worker.run"
    assert import_string(TASK) is worker.run
    from tombstones.jobs import retention

    # What the purge's schedule (and its hand-over) stores is the function the worker runs.
    assert retention.PURGE_TASK == "tombstones.worker.run_purge"
    assert import_string(retention.PURGE_TASK) is worker.run_purge


def test_public_api__the_pytest_entry_point() -> None:
    found = [ep for ep in entry_points(group="pytest11") if ep.name == "tombstones"]
    assert len(found) == 1
    plugin = import_module(found[0].value)
    assert found[0].value == "tombstones.contrib.pytest_plugin"
    assert callable(plugin.tombstone_race)
