"""Unit tests of TombstoneMeta parsing, personal-field erasure, the settings object and errors."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from project.customers.models import Customer
from project.stress.models import StressEntity
from tombstones import exceptions
from tombstones.conf import _SETTINGS, tombstone_settings
from tombstones.models import TombstoneModel
from tombstones.records.options import PROTECTED_FIELDS, erased_value, get_options, is_erasable

# --- TombstoneMeta ---------------------------------------------------------------------------


def test_get_options__reads_business_key_and_personal_fields() -> None:
    opts = get_options(Customer)

    assert opts.business_key == "reference"
    assert opts.personal_fields == ("name", "email", "phone")


def test_get_options__accepts_an_instance_and_caches_on_the_class() -> None:
    first = get_options(Customer(reference="C-x"))

    assert get_options(Customer) is first
    assert Customer.__dict__["_tombstone_options"] is first


def test_get_options__single_string_personal_field_becomes_a_tuple() -> None:
    class Plain:
        class TombstoneMeta:
            business_key = "code"
            personal_fields = "name"

    assert get_options(Plain).personal_fields == ("name",)


def test_get_options__no_tombstone_meta_means_no_key_and_no_personal_fields() -> None:
    class Bare:
        pass

    opts = get_options(Bare)

    assert opts.business_key is None
    assert opts.personal_fields == ()


def test_get_options__empty_personal_fields_stay_empty() -> None:
    assert get_options(StressEntity).personal_fields == ()


def test_protected_fields__are_the_mixin_fields() -> None:
    # Read from the mixin, not restated: a field added to either side, or dropped, fails.
    mixin = {f.name for f in TombstoneModel._meta.local_fields}
    assert mixin
    assert mixin == PROTECTED_FIELDS
    # Every fenced model carries them, and a queryset's only() never leaves them out.
    assert {f.name for f in Customer._meta.concrete_fields} >= mixin
    loaded, deferred = Customer.objects.only("name").query.deferred_loading
    assert (set(loaded), deferred) == (mixin | {"name"}, False)


# --- erasure ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["name", "email", "phone"])
def test_erased_value__non_null_text_is_empty_string(name: str) -> None:
    field: Any = Customer._meta.get_field(name)

    assert erased_value(field) == ""
    assert is_erasable(field)


def test_erased_value__nullable_field_is_none() -> None:
    field: Any = Customer._meta.get_field("synced_at")

    assert erased_value(field) is None
    assert is_erasable(field)


def test_erased_value__non_null_non_text_raises_naming_the_field() -> None:
    field: Any = Customer._meta.get_field("generation")

    assert not is_erasable(field)
    with pytest.raises(ValueError, match=r"customers\.Customer\.generation cannot be erased"):
        erased_value(field)


# --- settings --------------------------------------------------------------------------------


def test_settings__documented_defaults(settings: Any) -> None:
    for name in ("RETENTION", "JOB_MAX_AGE", "LEASE", "STALE_REREADS", "MAX_ATTEMPTS"):
        if hasattr(settings, f"TOMBSTONES_{name}"):
            delattr(settings, f"TOMBSTONES_{name}")

    durations = [tombstone_settings.RETENTION, tombstone_settings.JOB_MAX_AGE]
    durations.append(tombstone_settings.LEASE)
    assert durations == [timedelta(days=30), timedelta(days=7), timedelta(seconds=60)]
    assert (tombstone_settings.STALE_REREADS, tombstone_settings.MAX_ATTEMPTS) == (3, 5)
    assert tombstone_settings.validate() == []


def test_settings__read_at_call_time_not_import_time(settings: Any) -> None:
    seen = []
    for seconds in (5, 9):
        settings.TOMBSTONES_LEASE = timedelta(seconds=seconds)
        seen.append(tombstone_settings.LEASE)

    assert seen == [timedelta(seconds=5), timedelta(seconds=9)]


def test_settings__number_of_seconds_is_a_timedelta(settings: Any) -> None:
    settings.TOMBSTONES_RETENTION = 90
    settings.TOMBSTONES_RETRY_BACKOFF = 1.5

    values = (tombstone_settings.RETENTION, tombstone_settings.RETRY_BACKOFF)
    assert values == (timedelta(seconds=90), timedelta(seconds=1.5))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RETENTION", "30 days"),
        ("RETENTION", True),
        ("RETENTION", timedelta(0)),
        ("LEASE", -5),
        ("LEASE", float("nan")),
        ("JOB_MAX_AGE", float("inf")),
        ("JOB_MAX_AGE", 1e20),
        ("MAX_ATTEMPTS", 0),
        ("MAX_ATTEMPTS", "5"),
        ("STALE_REREADS", 2.5),
        ("BATCH_SIZE", 0),
        ("Q_OPTIONS", ["sync"]),
        ("LOG_ERROR_DETAILS", "yes"),
        ("LOG_ERROR_DETAILS", 1),
    ],
)
def test_settings__malformed_value_raises_improperly_configured_naming_it(
    settings: Any, name: str, value: Any
) -> None:
    setattr(settings, f"TOMBSTONES_{name}", value)

    with pytest.raises(ImproperlyConfigured, match=f"TOMBSTONES_{name}"):
        getattr(tombstone_settings, name)
    problems = tombstone_settings.validate()
    assert len(problems) == 1
    assert f"TOMBSTONES_{name}" in problems[0]


def test_settings__backoff_doubles_and_is_capped(settings: Any) -> None:
    settings.TOMBSTONES_RETRY_BACKOFF = timedelta(seconds=2)
    settings.TOMBSTONES_RETRY_BACKOFF_MAX = timedelta(seconds=10)

    delays = [tombstone_settings.backoff(n) for n in range(5)]

    assert delays == [timedelta(seconds=s) for s in (2, 2, 4, 8, 10)]


KEPT = timedelta(days=36500)  # 100 years: what a retention or an age may be at most
BOUNDS = [
    ("RETRY_BACKOFF", timedelta(days=1), "1 day"),
    ("RETRY_BACKOFF_MAX", timedelta(days=30), "30 days"),
    ("RETENTION", KEPT, "100 years"),
    ("JOB_RETENTION", KEPT, "100 years"),
    ("AUDIT_RETENTION", KEPT, "100 years"),
    ("JOB_MAX_AGE", KEPT, "100 years"),
    ("LEASE", timedelta(days=1), "1 day"),
]


def test_settings__every_duration_has_an_upper_bound() -> None:
    durations = {name for name, spec in _SETTINGS.items() if spec.kind == "timedelta"}
    assert durations == {name for name, _, _ in BOUNDS}
    assert _SETTINGS["SWEEP_MINUTES"].maximum is not None  # minutes: a duration too


@pytest.mark.parametrize(("name", "bound", "text"), BOUNDS)
def test_settings__a_duration_past_its_bound_is_refused_naming_the_setting_and_the_bound(
    settings: Any, name: str, bound: timedelta, text: str
) -> None:
    setattr(settings, f"TOMBSTONES_{name}", bound)
    assert getattr(tombstone_settings, name) == bound
    past = bound + timedelta(seconds=1)
    for value in (past, past.total_seconds(), timedelta(days=10**7)):
        setattr(settings, f"TOMBSTONES_{name}", value)
        with pytest.raises(ImproperlyConfigured) as refused:
            getattr(tombstone_settings, name)
        assert str(refused.value).startswith(f"TOMBSTONES_{name} must be at most {text}")
        assert tombstone_settings.validate() == [str(refused.value)]


def test_settings__the_sweep_runs_at_least_daily(settings: Any) -> None:
    settings.TOMBSTONES_SWEEP_MINUTES = 1440
    assert tombstone_settings.SWEEP_MINUTES == 1440
    settings.TOMBSTONES_SWEEP_MINUTES = 1441
    with pytest.raises(ImproperlyConfigured, match="TOMBSTONES_SWEEP_MINUTES must be at most 1440"):
        _ = tombstone_settings.SWEEP_MINUTES


def test_settings__backoff_never_overflows_whatever_the_attempts(settings: Any) -> None:
    settings.TOMBSTONES_RETRY_BACKOFF = timedelta(days=1)
    settings.TOMBSTONES_RETRY_BACKOFF_MAX = timedelta(days=30)
    # TOMBSTONES_MAX_ATTEMPTS has no upper bound: a day * 2**63 is no timedelta.
    delays = [tombstone_settings.backoff(n) for n in (5, 6, 64, 10**6)]
    assert delays == [
        timedelta(days=16),
        timedelta(days=30),
        timedelta(days=30),
        timedelta(days=30),
    ]
    settings.TOMBSTONES_RETRY_BACKOFF_MAX = timedelta(seconds=1)  # a cap below the base
    assert tombstone_settings.backoff(1) == timedelta(seconds=1)


def test_settings__log_error_details_is_true_false_or_none(settings: Any) -> None:
    seen = []
    for value in (None, True, False):
        settings.TOMBSTONES_LOG_ERROR_DETAILS = value
        seen.append(tombstone_settings.LOG_ERROR_DETAILS)
    assert seen == [None, True, False]


def test_settings__unknown_handler_wait_is_a_tenth_of_the_age_within_the_backoff(
    settings: Any,
) -> None:
    settings.TOMBSTONES_RETRY_BACKOFF = timedelta(seconds=2)
    settings.TOMBSTONES_RETRY_BACKOFF_MAX = timedelta(minutes=10)
    waits = [tombstone_settings.unknown_handler_wait(age) for age in (0, 60, 600, 86_400)]
    assert waits == [timedelta(seconds=s) for s in (2, 6, 60, 600)]


def test_settings__q_options_is_a_copy(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {"cluster": "jobs"}

    options = tombstone_settings.Q_OPTIONS
    options["cluster"] = "other"

    assert tombstone_settings.Q_OPTIONS == {"cluster": "jobs"}


# --- exceptions ------------------------------------------------------------------------------

RECORD_ERRORS = [
    exceptions.RecordDeleted,
    exceptions.GenerationChanged,
    exceptions.StaleVersion,
    exceptions.AlreadyLive,
    exceptions.MissingFence,
    exceptions.RecordMissing,
    exceptions.ProtectedField,
]


@pytest.mark.parametrize("cls", RECORD_ERRORS)
def test_exceptions__share_one_root(cls: type[exceptions.TombstoneError]) -> None:
    assert issubclass(cls, exceptions.TombstoneError)
    assert issubclass(exceptions.TombstoneError, Exception)
    with pytest.raises(exceptions.TombstoneError):
        raise cls(model="customers.Customer", pk=1)


@pytest.mark.parametrize("cls", RECORD_ERRORS)
def test_exceptions__carry_ids_and_numbers_on_attributes(
    cls: type[exceptions.TombstoneError],
) -> None:
    exc = cls(
        model="customers.Customer",
        pk=42,
        expected_generation=1,
        found_generation=2,
        expected_version=3,
        found_version=4,
    )

    assert (exc.model, exc.pk) == ("customers.Customer", 42)
    assert (exc.expected_generation, exc.found_generation) == (1, 2)
    assert (exc.expected_version, exc.found_version) == (3, 4)
    first_line = (cls.__doc__ or "").strip().splitlines()[0]
    assert str(exc) == (
        f"{first_line} (customers.Customer pk=42, generation expected=1 found=2, "
        "version expected=3 found=4)"
    )


def test_exceptions__default_message_without_data_is_the_docstring() -> None:
    assert str(exceptions.StaleVersion()) == (
        "The record changed since it was read: reload it and decide again."
    )


def test_exceptions__explicit_message_wins() -> None:
    exc = exceptions.RecordDeleted("custom text", model="customers.Customer", pk=7)

    assert str(exc) == "custom text"
    assert exc.pk == 7
