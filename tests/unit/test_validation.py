"""Enqueue's checks before any SQL (tombstones.jobs.validation): the record, the ordering key,
run_after and the params, each refused with a typed error that names the problem, never a value.

No database: the records are unsaved ``Customer`` instances of the demo project.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from project.customers.models import Customer
from tombstones.exceptions import (
    InvalidOrderingKey,
    InvalidParams,
    InvalidRunAfter,
    MissingFence,
    NotATombstoneModel,
    RecordDeleted,
)
from tombstones.jobs.models import Job
from tombstones.jobs.validation import (
    MAX_OBJECT_ID_LENGTH,
    MAX_ORDERING_KEY_LENGTH,
    MAX_PARAMS_DEPTH,
    check_ordering_key,
    check_params,
    check_record,
    check_run_after,
)

EMAIL = "ada@example.org"


def _customer(**fields: Any) -> Customer:
    values: dict[str, Any] = {
        "pk": 1,
        "reference": "C-1",
        "name": "Ada Lovelace",
        "email": EMAIL,
        "phone": "12",
        "generation": 2,
        "version": 5,
    }
    values.update(fields)
    return Customer(**values)


def _nested(levels: int) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for _ in range(levels - 1):
        params = {"a": params}
    return params


# --- the record ------------------------------------------------------------------------------


def test_check_record__returns_the_pk_and_the_fence() -> None:
    assert check_record(_customer(), accepts_tombstones=False) == (1, 2, 5)


def test_check_record__only_tombstone_models_are_fenced() -> None:
    with pytest.raises(NotATombstoneModel, match=r"tombstones\.Job pk=7"):
        check_record(Job(pk=7), accepts_tombstones=False)
    with pytest.raises(TypeError):  # NotATombstoneModel is a TypeError too
        check_record(object(), accepts_tombstones=True)


def test_check_record__an_unsaved_or_unfenced_record_has_no_fence() -> None:
    with pytest.raises(MissingFence):
        check_record(_customer(pk=None), accepts_tombstones=False)
    with pytest.raises(MissingFence):
        check_record(_customer(version=None), accepts_tombstones=False)
    deferred = _customer()
    del deferred.__dict__["version"]  # as .defer("version") leaves it: it would be read fresh
    with pytest.raises(MissingFence):
        check_record(deferred, accepts_tombstones=False)


def test_check_record__a_tombstone_only_for_a_handler_that_accepts_it() -> None:
    tombstone = _customer(deleted_at=datetime(2026, 12, 1, tzinfo=UTC))
    with pytest.raises(RecordDeleted) as refused:
        check_record(tombstone, accepts_tombstones=False)
    assert (refused.value.model, refused.value.pk, refused.value.expected_generation) == (
        "customers.Customer",
        1,
        2,
    )
    assert check_record(tombstone, accepts_tombstones=True) == (1, 2, 5)


def test_check_record__a_pk_longer_than_the_object_id_column_is_refused() -> None:
    fits = "k" * MAX_OBJECT_ID_LENGTH
    assert check_record(_customer(pk=fits), accepts_tombstones=False)[0] == fits
    with pytest.raises(MissingFence, match="at most 64 characters"):
        check_record(_customer(pk=fits + "k"), accepts_tombstones=False)


# --- the ordering key ------------------------------------------------------------------------


def test_check_ordering_key__a_non_empty_str_up_to_its_column_width() -> None:
    check_ordering_key("customer:Zürich-1")
    check_ordering_key("k" * MAX_ORDERING_KEY_LENGTH)
    with pytest.raises(InvalidOrderingKey, match="at most 255 characters; this one has 256"):
        check_ordering_key("k" * (MAX_ORDERING_KEY_LENGTH + 1))
    with pytest.raises(InvalidOrderingKey, match="must not be empty"):
        check_ordering_key("")
    with pytest.raises(InvalidOrderingKey, match="must be a str, not int"):
        check_ordering_key(5)


def test_check_ordering_key__control_characters_are_named_by_code_and_position() -> None:
    with pytest.raises(InvalidOrderingKey, match=r"U\+0000 at position 1"):
        check_ordering_key("a\x00b")
    with pytest.raises(InvalidOrderingKey, match=r"U\+0009 at position 0"):
        check_ordering_key("\tlane")
    with pytest.raises(InvalidOrderingKey, match=r"U\+D800 at position 4"):
        check_ordering_key("lane\ud800")


# --- run_after -------------------------------------------------------------------------------


def test_check_run_after__an_aware_datetime_within_the_queue_age(settings: Any) -> None:
    settings.TOMBSTONES_JOB_MAX_AGE = timedelta(days=7)
    now = timezone.now()
    check_run_after(now - timedelta(days=30))  # in the past: due at once
    check_run_after(now + timedelta(days=7) - timedelta(minutes=1))
    with pytest.raises(InvalidRunAfter, match="TOMBSTONES_JOB_MAX_AGE"):
        check_run_after(now + timedelta(days=7, minutes=1))


def test_check_run_after__naive_or_aware_as_use_tz_says(settings: Any) -> None:
    naive = datetime(2026, 12, 1, 12, 0)
    with pytest.raises(InvalidRunAfter, match="aware datetime"):
        check_run_after(naive)
    settings.USE_TZ = False
    check_run_after(naive)
    with pytest.raises(InvalidRunAfter, match="naive datetime"):
        check_run_after(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))


def test_check_run_after__only_a_datetime() -> None:
    with pytest.raises(InvalidRunAfter, match="must be a datetime, not date"):
        check_run_after(date(2026, 12, 1))
    with pytest.raises(InvalidRunAfter, match="not str"):
        check_run_after("2026-12-01T12:00:00Z")


# --- params ----------------------------------------------------------------------------------


def test_check_params__none_is_empty_and_a_plain_object_passes_as_is() -> None:
    assert check_params(None) == {}
    params = {"ids": [1, 2], "force": True, "ratio": 0.5, "note": None, "deep": {"x": "y"}}
    assert check_params(params) is params


def test_check_params__only_an_object_with_str_keys_and_json_values() -> None:
    with pytest.raises(InvalidParams, match=r"must be a dict .*, not list"):
        check_params([1, 2])
    with pytest.raises(InvalidParams, match="keys must be str, not int"):
        check_params({1: "a"})
    for value, kind in ((object(), "object"), ({1, 2}, "set"), (date(2026, 1, 1), "date")):
        with pytest.raises(InvalidParams, match=f"plain JSON values .*not {kind}"):
            check_params({"a": [value]})
    for number in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(InvalidParams, match="NaN or infinite"):
            check_params({"a": number})


def test_check_params__characters_the_database_cannot_store() -> None:
    for params in ({"a": "x\x00y"}, {"x\x00": 1}, {"a": ["\udfff"]}):
        with pytest.raises(InvalidParams, match="NUL characters or lone surrogates"):
            check_params(params)


def test_check_params__depth_is_bounded() -> None:
    check_params(_nested(MAX_PARAMS_DEPTH))
    with pytest.raises(InvalidParams, match="nested deeper than 32 levels"):
        check_params(_nested(MAX_PARAMS_DEPTH + 1))


def test_check_params__size_counts_bytes_of_compact_utf8_json(settings: Any) -> None:
    settings.TOMBSTONES_PARAMS_MAX_BYTES = 20
    check_params({"a": "x" * 12})  # {"a":"xxxxxxxxxxxx"}: 20 bytes
    with pytest.raises(InvalidParams, match=r"TOMBSTONES_PARAMS_MAX_BYTES \(20 bytes"):
        check_params({"a": "x" * 13})
    check_params({"a": "é" * 6})  # two bytes each, not an escape of six
    with pytest.raises(InvalidParams, match="TOMBSTONES_PARAMS_MAX_BYTES"):
        check_params({"a": "é" * 7})


def test_check_params__shared_and_circular_references_are_refused_without_walking_them(
    settings: Any,
) -> None:
    settings.TOMBSTONES_PARAMS_MAX_BYTES = 1000
    row = [0] * 1_000_000
    # A trillion values as JSON: the walk stops once they cannot fit, before json.dumps runs.
    with pytest.raises(InvalidParams, match="TOMBSTONES_PARAMS_MAX_BYTES"):
        check_params({"rows": [row] * 1_000_000})
    looped: dict[str, Any] = {}
    looped["self"] = looped
    with pytest.raises(InvalidParams, match="nested deeper"):  # not a RecursionError
        check_params(looped)


def test_check_params__a_personal_value_is_refused_by_its_field_name_only() -> None:
    for params in (
        {"to": EMAIL},
        {"note": f"mail {EMAIL} today"},  # contained: long enough to mean the person
        {"who": "  ADA LOVELACE "},  # case and surrounding space do not hide it
        {EMAIL: True},  # keys too
        {"n": [12]},  # a short value, equal as a whole
    ):
        with pytest.raises(InvalidParams) as refused:
            check_params(params, _customer())
        assert refused.value.field in ("email", "name", "phone")
        assert refused.value.model == "customers.Customer"
        message = str(refused.value)
        assert repr(refused.value.field) in message
        assert EMAIL not in message
        assert "Lovelace" not in message


PHONE = "+49 1555 0199887"


@pytest.mark.parametrize(
    "params",
    [
        {"user": "grace.hopper"},  # the local part alone
        {"user": "GRACE.HOPPER+NEWS"},  # with its tag, any case
        {"note": "login grace.hopper, then sync"},  # a word of a longer text
        {"to": "grace.hopper@another.example"},  # at another domain
        {"grace.hopper": 1},  # as a key
    ],
)
def test_check_params__an_email_local_part_is_refused(params: dict[str, Any]) -> None:
    record = _customer(email="Grace.Hopper+news@pii.example", phone="")
    with pytest.raises(InvalidParams) as refused:
        check_params(params, record)
    assert refused.value.field == "email"
    assert "hopper" not in str(refused.value).lower()


@pytest.mark.parametrize(
    "params",
    [
        {"tel": "+4915550199887"},
        {"tel": "4915550199887"},  # without +
        {"tel": "0049 1555 0199887"},  # 00 for +
        {"tel": "+49-1555-019-9887"},  # dashes
        {"tel": "(0)1555 / 0199887"},  # the national form: trunk 0, no country code
        {"tel": "+49 (0)1555 0199887"},  # both
        {"tel": 4915550199887},  # a number
        {"note": "call 01555 0199887 after 5"},  # inside a longer text
    ],
)
def test_check_params__a_phone_number_is_refused_however_it_is_written(
    params: dict[str, Any],
) -> None:
    with pytest.raises(InvalidParams) as refused:
        check_params(params, _customer(phone=PHONE))
    assert refused.value.field == "phone"
    assert "0199887" not in str(refused.value)
    # The record may hold it in any of these writings too.
    for stored in ("4915550199887", "+49-1555-0199887", "01555 0199887"):
        with pytest.raises(InvalidParams):
            check_params(params, _customer(phone=stored))


def test_check_params__ids_and_short_options_pass_beside_an_email_and_a_phone() -> None:
    record = _customer(email="ada.lovelace@pii.example", phone=PHONE)
    params = {
        "customer_id": 4915,
        "invoice": 1555,
        "rows": [199887, 1, 2, 3],
        "page": 2,
        "ts": 1733450000,  # ten digits, not the phone's
        "order": 49155501,  # the phone's first eight digits: an id, not its number
        "date": "2026-12-06",
        "format": "html",
        "who": "ada",  # shorter than MIN_CONTAINED_LENGTH: a word, not the address
        "sort": "lovelace-first",  # part of the local part only
        "template": "ada.lovelace2",  # another word
        "ref": "C-1",
    }
    assert check_params(params, record) == params


def test_check_params__ordinary_values_of_a_record_with_personal_fields_pass() -> None:
    customer = _customer(phone="")  # an empty phone matches nothing
    assert check_params({"reference": "C-1", "n": 123, "flag": True}, customer)
    # A short personal value only counts as a whole value: "12" occurs in ordinary text.
    assert check_params({"note": "batch 12 of 40"}, _customer())
    # Without the record, nothing is compared.
    assert check_params({"to": EMAIL}) == {"to": EMAIL}
