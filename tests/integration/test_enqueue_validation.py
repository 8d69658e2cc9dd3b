"""enqueue()'s refusals: typed errors raised before any SQL, the caller's transaction intact."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import tombstones
from project.customers.models import CrmContact, Customer
from tests.factories import CustomerFactory
from tests.jobkit import temp_handler
from tombstones.exceptions import (
    InvalidOrderingKey,
    InvalidParams,
    InvalidRunAfter,
    MissingFence,
    NotATombstoneModel,
    TombstoneError,
)
from tombstones.jobs.validation import MAX_PARAMS_DEPTH
from tombstones.models import Job

pytestmark = pytest.mark.django_db

HANDLER = "customers.update_sheet_row"
NAME = "Qwertzuiop Plantedname"
EMAIL = "planted-5521@pii.test"
PHONE = "+4915550199887"


def _nested(depth: int) -> dict[str, Any]:
    params: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        params = {"n": params}
    return params


def _refused(error: type[TombstoneError], record: Any, **kwargs: Any) -> TombstoneError:
    """Enqueue, expect ``error``, and prove that not one statement reached the database."""
    with CaptureQueriesContext(connection) as queries, pytest.raises(error) as info:
        tombstones.enqueue(HANDLER, record, **kwargs)
    assert [q["sql"] for q in queries] == []
    return info.value


# --- ordering key --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["k" * 256, "tenant\x00-7", "line\nbreak", "tab\tkey", "del\x7f", "", 7, b"bytes"],
    ids=["too-long", "nul", "newline", "tab", "del", "empty", "int", "bytes"],
)
def test_ordering_key__malformed_is_refused_before_any_sql(key: object) -> None:
    customer = CustomerFactory()
    error = _refused(InvalidOrderingKey, customer, ordering_key=key)
    assert isinstance(error, ValueError)  # what the old check raised: callers' except still works
    assert not Job.objects.exists()


def test_ordering_key__255_characters_of_text_are_accepted() -> None:
    key = "ü" * 255
    job = tombstones.enqueue(HANDLER, CustomerFactory(), ordering_key=key)
    job.refresh_from_db()
    assert job.lane == key


# --- the caller's transaction stays usable (PostgreSQL aborts it on a failed statement) ---------

REFUSALS: dict[str, tuple[type[TombstoneError], dict[str, Any]]] = {
    "key-too-long": (InvalidOrderingKey, {"ordering_key": "k" * 256}),
    "key-nul": (InvalidOrderingKey, {"ordering_key": "a\x00b"}),
    "params-nul": (InvalidParams, {"params": {"note": "a\x00b"}}),
    "params-lone-surrogate": (InvalidParams, {"params": {"note": "\ud800"}}),
    "params-too-large": (InvalidParams, {"params": {"blob": "x" * 70_000}}),
    "params-too-deep": (InvalidParams, {"params": _nested(MAX_PARAMS_DEPTH + 1)}),
    "run-after-naive": (InvalidRunAfter, {"run_after": datetime(2030, 1, 1)}),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusal__inside_atomic_leaves_the_transaction_usable(case: str) -> None:
    error, kwargs = REFUSALS[case]
    customer = CustomerFactory()
    with transaction.atomic():
        with pytest.raises(error):
            tombstones.enqueue(HANDLER, customer, **kwargs)
        # The same transaction goes on: a query, then a job that is accepted.
        assert Customer.objects.filter(pk=customer.pk).exists()
        job = tombstones.enqueue(HANDLER, customer, params={"n": 1})
    assert list(Job.objects.values_list("pk", flat=True)) == [job.pk]


# --- params: size, depth, plain values -----------------------------------------------------------


def test_params__over_the_size_limit_are_refused(settings: Any) -> None:
    customer = CustomerFactory()
    error = _refused(InvalidParams, customer, params={"blob": "x" * 65_537})
    assert "TOMBSTONES_PARAMS_MAX_BYTES" in str(error)
    tombstones.enqueue(HANDLER, customer, params={"blob": "x" * 65_000})  # under 64 KiB: fine
    settings.TOMBSTONES_PARAMS_MAX_BYTES = 100
    _refused(InvalidParams, customer, params={"ids": list(range(40))})
    assert Job.objects.count() == 1


def test_params__of_twenty_megabytes_are_refused_quickly() -> None:
    import time

    customer = CustomerFactory()
    started = time.monotonic()
    _refused(InvalidParams, customer, params={"rows": ["x" * 1000] * 20_000})
    assert time.monotonic() - started < 1.0  # the walk stops at the limit, it does not encode 20 MB


@pytest.mark.parametrize("depth", [MAX_PARAMS_DEPTH + 1, 5_000, 100_000])
def test_params__nested_too_deep_is_a_clear_error_not_a_recursion_error(depth: int) -> None:
    error = _refused(InvalidParams, CustomerFactory(), params=_nested(depth))
    assert f"deeper than {MAX_PARAMS_DEPTH}" in str(error)


def test_params__at_the_depth_limit_are_accepted() -> None:
    job = tombstones.enqueue(HANDLER, CustomerFactory(), params=_nested(MAX_PARAMS_DEPTH))
    job.refresh_from_db()
    assert job.params == _nested(MAX_PARAMS_DEPTH)


def test_params__circular_and_shared_references_are_refused() -> None:
    circular: dict[str, Any] = {}
    circular["self"] = circular
    _refused(InvalidParams, CustomerFactory(), params=circular)
    shared: list[Any] = [0]
    for _ in range(22):  # 4 million leaves once written out, from 22 small lists
        shared = [shared, shared]
    _refused(InvalidParams, CustomerFactory(), params={"tree": shared})


@pytest.mark.parametrize(
    "params",
    [{1: "int key"}, {"when": datetime(2030, 1, 1)}, {"inf": float("inf")}, {"obj": object()}],
    ids=["int-key", "datetime", "infinity", "object"],
)
def test_params__that_are_not_plain_json_values_are_refused(params: dict[Any, Any]) -> None:
    _refused(InvalidParams, CustomerFactory(), params=params)


# --- params: no personal values ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "params"),
    [
        ("name", {"name": NAME}),
        ("email", {"to": EMAIL.upper()}),  # case-insensitive
        ("email", {"note": f"mail <{EMAIL}> tomorrow"}),  # inside a longer text
        ("phone", {"deep": {"list": [1, {"tel": PHONE}]}}),  # anywhere in the tree
        ("email", {EMAIL: True}),  # as a key
        ("email", {"user": "planted-5521"}),  # the address's local part
        ("phone", {"tel": "4915550199887"}),  # its digits without +
        ("phone", {"tel": "+49 1555 0199 887"}),  # with spaces
        ("phone", {"tel": "0155-5019-9887"}),  # national, with dashes
    ],
    ids=[
        "equal",
        "case",
        "inside-text",
        "nested",
        "key",
        "local-part",
        "no-plus",
        "spaces",
        "dashes",
    ],
)
def test_params__holding_a_personal_value_are_refused_naming_the_field_only(
    field: str, params: dict[str, Any]
) -> None:
    customer = CustomerFactory(name=NAME, email=EMAIL, phone=PHONE)
    error = _refused(InvalidParams, customer, params=params)
    assert isinstance(error, InvalidParams)
    assert error.field == field
    assert repr(field) in str(error)
    for value in (NAME, EMAIL, PHONE, "Qwertzuiop", "planted-5521"):
        assert value.lower() not in str(error).lower()
        assert value.lower() not in repr(error).lower()
    assert not Job.objects.exists()


def test_params__personal_values_of_a_deferred_instance_are_still_compared() -> None:
    CustomerFactory(name=NAME, email=EMAIL)
    customer = Customer.objects.only("reference").get()
    with pytest.raises(InvalidParams, match="'email'"):
        tombstones.enqueue(HANDLER, customer, params={"to": EMAIL})
    assert customer.get_deferred_fields() >= {"email"}  # the caller's instance is left as it was


def test_params__empty_personal_values_and_ids_are_fine() -> None:
    customer = CustomerFactory(name=NAME, email=EMAIL, phone="")
    job = tombstones.enqueue(
        HANDLER, customer, params={"customer_id": customer.pk, "note": "", "dry_run": False}
    )
    assert job.params == {"customer_id": customer.pk, "note": "", "dry_run": False}


def test_params__of_a_tombstone_are_not_compared_with_erased_values() -> None:
    customer = CustomerFactory(name=NAME, email=EMAIL, phone="")
    customer.delete()
    with temp_handler("t.propagate", lambda ctx: None, accepts_tombstones=True):
        job = tombstones.enqueue("t.propagate", customer, params={"note": ""})
    assert job.params == {"note": ""}


# --- the record ----------------------------------------------------------------------------------


def test_record__a_model_without_the_mixin_is_refused_even_with_fence_attributes() -> None:
    contact = CrmContact.objects.create(idempotency_key="k", reference="r")
    contact.generation = 1  # type: ignore[attr-defined]  # duck typing is not a fence
    contact.version = 1  # type: ignore[attr-defined]
    contact.deleted_at = None  # type: ignore[attr-defined]
    error = _refused(NotATombstoneModel, contact)
    assert isinstance(error, MissingFence)  # the old refusal's class still catches it
    assert isinstance(error, TypeError)
    assert "customers.CrmContact" in str(error)
    assert not Job.objects.exists()


def test_record__a_plain_object_is_refused() -> None:
    class Duck:
        pk, generation, version, deleted_at = 1, 1, 1, None

    _refused(NotATombstoneModel, Duck())


def test_record__deferred_fence_fields_are_refused() -> None:
    customer = CustomerFactory()
    stale = Customer.objects.get(pk=customer.pk)
    del stale.version  # as a deferred field: it would be read fresh, matching any later state
    _refused(MissingFence, stale)


def test_record__a_primary_key_longer_than_a_job_can_hold_is_refused() -> None:
    record = Customer(pk="9" * 65, reference="C-long", name="x", email="x@x.test")
    _refused(MissingFence, record)


# --- run_after -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run_after",
    [
        lambda: datetime(2030, 1, 1),
        lambda: timezone.now() + timedelta(days=8),  # beyond TOMBSTONES_JOB_MAX_AGE (7 days)
        lambda: "2030-01-01T00:00:00Z",
        lambda: timezone.now().date(),
    ],
    ids=["naive", "beyond-max-age", "string", "date"],
)
def test_run_after__malformed_or_too_far_ahead_is_refused(
    run_after: Callable[[], object],
) -> None:
    error = _refused(InvalidRunAfter, CustomerFactory(), run_after=run_after())
    assert isinstance(error, ValueError)
    assert not Job.objects.exists()


def test_run_after__within_the_max_age_is_accepted(settings: Any) -> None:
    settings.TOMBSTONES_JOB_MAX_AGE = timedelta(hours=1)
    due = timezone.now() + timedelta(minutes=59)
    job = tombstones.enqueue(HANDLER, CustomerFactory(), run_after=due)
    job.refresh_from_db()
    assert job.run_after == due
    with pytest.raises(InvalidRunAfter, match="TOMBSTONES_JOB_MAX_AGE"):
        tombstones.enqueue(HANDLER, CustomerFactory(), run_after=due + timedelta(minutes=2))
