"""Enqueue's checks, all in Python before any SQL.

A refusal raises a typed :class:`~tombstones.exceptions.TombstoneError` before the job's INSERT
is sent, so it never aborts the caller's transaction (on PostgreSQL a failed statement would).
Messages name fields, types and limits, never a value the caller passed.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.db import models
from django.utils import timezone

from ..conf import tombstone_settings
from ..exceptions import (
    InvalidOrderingKey,
    InvalidParams,
    InvalidPriority,
    InvalidRunAfter,
    MissingFence,
    NotATombstoneModel,
    RecordDeleted,
)
from ..records.mixin import TombstoneModel
from ..records.options import PROTECTED_FIELDS, get_options
from . import queues
from .models import PLAIN_LANE_PREFIX
from .registry import Handler, get_handler

# Deeper params are refused: ids and options are flat, and a bounded depth keeps every walk
# (ours, json's, the database's) far from Python's recursion limit.
MAX_PARAMS_DEPTH = 32
# The widths of Job.lane and Job.object_id: longer values would fail in the database.
MAX_ORDERING_KEY_LENGTH = 255
MAX_OBJECT_ID_LENGTH = 64
# A personal value at least this long is also refused inside a longer string ("mail x@y.z");
# shorter ones only when a whole value equals them, since they occur in ordinary words. An
# e-mail address's local part this long is refused too, as a word of its own.
MIN_CONTAINED_LENGTH = 4
# A personal value written like a phone number (digits, spaces and + ( ) . / -) with this many
# digits is refused by its digits, however the params write them: with or without +, 00 or a
# trunk 0, spaces or dashes. Fewer digits are ids and options, compared as text only.
MIN_PHONE_DIGITS = 7
# A country code: what an international number has beyond its national digits.
MAX_COUNTRY_DIGITS = 3
_PHONE = re.compile(r"\+?[\d\s()./-]+")
_NUMBER_IN_TEXT = re.compile(r"\+?\d[\d\s()./-]*\d")

# NUL and lone surrogates: PostgreSQL's text and jsonb refuse both.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SCALARS = (str, int, float, bool, type(None))


class Checked(NamedTuple):
    """What enqueue may write, once every check passed."""

    handler: Handler
    pk: Any
    generation: int
    version: int
    params: dict[str, Any]


def check_enqueue(
    handler: str,
    record: Any,
    *,
    params: Any,
    ordering_key: Any,
    run_after: Any,
) -> Checked:
    """Check everything enqueue() is given; raise the typed error of the first problem."""
    found = get_handler(handler)
    pk, generation, version = check_record(record, accepts_tombstones=found.accepts_tombstones)
    if ordering_key is not None:
        check_ordering_key(ordering_key)
    if run_after is not None:
        check_run_after(run_after)
    clean = check_params(params, record)
    return Checked(found, pk, generation, version, clean)


def check_plain_enqueue(
    handler: str, *, params: Any, run_after: Any
) -> tuple[Handler, dict[str, Any]]:
    """Check what enqueue_plain() is given: a handler that runs plain jobs, the params (no
    record: the size, the types and the text checks only), run_after."""
    found = get_handler(handler)
    if not found.plain:
        raise MissingFence(
            f"Handler {handler!r} acts on a record: enqueue its jobs with enqueue(handler, "
            "record); only a handler registered with plain=True (a task's is) runs for none."
        )
    if found.coalescing is not None:
        raise MissingFence(
            f"Handler {handler!r} coalesces its jobs per record: a call for no record has none "
            "to coalesce on."
        )
    if run_after is not None:
        check_run_after(run_after)
    return found, check_params(params, None, plain=True)


def check_record(record: Any, *, accepts_tombstones: bool) -> tuple[Any, int, int]:
    """A saved TombstoneModel instance with its fence loaded, live unless the handler allows."""
    if not isinstance(record, TombstoneModel):
        # Duck typing is not enough: the worker reads the record through the mixin's managers.
        label = getattr(getattr(record, "_meta", None), "label", type(record).__name__)
        raise NotATombstoneModel(model=label, pk=getattr(record, "pk", None))
    label = record._meta.label
    # A deferred fence field would be read fresh, and the snapshot would match any later state.
    if record.pk is None or PROTECTED_FIELDS & record.get_deferred_fields():
        raise MissingFence(model=label, pk=record.pk)
    generation, version = record.generation, record.version
    if not isinstance(generation, int) or not isinstance(version, int):
        raise MissingFence(model=label, pk=record.pk)
    if record.deleted_at is not None and not accepts_tombstones:
        raise RecordDeleted(model=label, pk=record.pk, expected_generation=generation)
    if len(str(record.pk)) > MAX_OBJECT_ID_LENGTH:
        raise MissingFence(
            f"{label}: a job can reference primary keys of at most {MAX_OBJECT_ID_LENGTH} "
            "characters.",
            model=label,
        )
    return record.pk, generation, version


def check_ordering_key(key: Any) -> None:
    if not isinstance(key, str):
        raise InvalidOrderingKey(f"An ordering key must be a str, not {type(key).__name__}.")
    if not key:
        raise InvalidOrderingKey("An ordering key must not be empty.")
    if len(key) > MAX_ORDERING_KEY_LENGTH:
        raise InvalidOrderingKey(
            f"An ordering key has at most {MAX_ORDERING_KEY_LENGTH} characters; "
            f"this one has {len(key)}."
        )
    if key.startswith(PLAIN_LANE_PREFIX):
        raise InvalidOrderingKey(
            f"An ordering key cannot start with {PLAIN_LANE_PREFIX!r}: the lanes of plain jobs "
            "(tasks for no record) do, one job each."
        )
    if key.startswith(queues.LANE_PREFIX):
        raise InvalidOrderingKey(
            f"An ordering key cannot start with {queues.LANE_PREFIX!r}: the lanes of the named "
            "queues do (give the job its queue instead)."
        )
    for position, char in enumerate(key):
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise InvalidOrderingKey(
                f"An ordering key must not contain control characters "
                f"(U+{ord(char):04X} at position {position})."
            )


def check_lane(queue: Any, key: str) -> str:
    """The lane of ``key`` in ``queue`` (a known queue: UnknownQueue otherwise), if it fits the
    lane's column (InvalidOrderingKey otherwise)."""
    lane = queues.lane(queues.check(queue), key)
    if len(lane) > MAX_ORDERING_KEY_LENGTH:
        raise InvalidOrderingKey(
            f"In queue {queue!r} an ordering key has at most "
            f"{MAX_ORDERING_KEY_LENGTH - len(lane) + len(key)} characters (its lane is "
            f"{queues.LANE_PREFIX!r}, the queue's name and '/' before it); this one has {len(key)}."
        )
    return lane


# Django's tasks framework's range (TASK_MIN_PRIORITY, TASK_MAX_PRIORITY).
MIN_PRIORITY, MAX_PRIORITY = -100, 100


def check_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidPriority(f"A priority must be an int, not {type(priority).__name__}.")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidPriority(
            f"A priority must be from {MIN_PRIORITY} to {MAX_PRIORITY}; this one is {priority}."
        )
    return priority


def check_run_after(run_after: Any) -> None:
    if not isinstance(run_after, datetime):
        raise InvalidRunAfter(f"run_after must be a datetime, not {type(run_after).__name__}.")
    if settings.USE_TZ and timezone.is_naive(run_after):
        raise InvalidRunAfter("run_after must be an aware datetime (USE_TZ is on).")
    if not settings.USE_TZ and timezone.is_aware(run_after):
        raise InvalidRunAfter("run_after must be a naive datetime (USE_TZ is off).")
    # A job still waiting after the maximum queue age expires: it would never run.
    limit = tombstone_settings.JOB_MAX_AGE
    if run_after - timezone.now() > limit:
        raise InvalidRunAfter(
            f"run_after is further ahead than TOMBSTONES_JOB_MAX_AGE ({limit}); "
            "the job would expire before it is due."
        )


def check_params(
    params: Any, record: models.Model | None = None, *, plain: bool = False
) -> dict[str, Any]:
    """A JSON object of plain values, within the size and depth limits, free of personal values.

    ``record``'s ``TombstoneMeta.personal_fields`` are compared with every key and value.
    ``plain``: a plain job's (no record to compare with): an e-mail address is refused, the one
    personal value its shape tells.
    """
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidParams(
            f"Job params must be a dict (a JSON object), not {type(params).__name__}."
        )
    limit = tombstone_settings.PARAMS_MAX_BYTES
    texts = _walk(params, limit)
    size = len(
        json.dumps(params, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    )
    if size > limit:
        raise _too_large(limit)
    if record is not None and texts:
        _refuse_personal_values(record, texts)
    if plain:
        _refuse_addresses(texts)
    return params


_ADDRESS = re.compile(r"[^\s@<>()\[\],;:\"']+@[^\s@<>()\[\],;:\"']+\.[^\s@<>()\[\],;:\"'.]{2,}")


def _refuse_addresses(texts: list[str]) -> None:
    """A plain job's params hold no e-mail address (named as such, never shown)."""
    for text in texts:
        if _ADDRESS.search(text):
            raise InvalidParams(
                "The params of a plain job (a task for no record) hold an e-mail address: pass "
                "the id of whom it is for, and read the address in the task.",
                field="e-mail address",
            )


def _too_large(limit: int) -> InvalidParams:
    return InvalidParams(
        f"Job params exceed TOMBSTONES_PARAMS_MAX_BYTES ({limit} bytes of JSON): "
        "pass ids and options, and let the handler read the rest."
    )


def _walk(params: dict[str, Any], limit: int) -> list[str]:
    """Check types, depth and characters without recursion; return every key and scalar as text.

    Every key and value costs at least one byte of JSON, so more than ``limit`` of them (shared
    or circular references included) is too large: the walk stops there.
    """
    texts: list[str] = []
    budget = limit
    stack: list[tuple[Any, int]] = [(params, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list | tuple):
            if depth > MAX_PARAMS_DEPTH:
                raise InvalidParams(
                    f"Job params are nested deeper than {MAX_PARAMS_DEPTH} levels "
                    "(tombstones.validation.MAX_PARAMS_DEPTH)."
                )
            items: Any = node.values() if isinstance(node, dict) else node
            if isinstance(node, dict):
                for key in node:
                    if not isinstance(key, str):
                        raise InvalidParams(
                            f"Job params' keys must be str, not {type(key).__name__}."
                        )
                    budget = _spend(budget, len(key) + 1, limit)
                    texts.append(_text(key))
            for item in items:
                budget = _spend(budget, 1, limit)
                stack.append((item, depth + 1))
        elif isinstance(node, _SCALARS):
            if isinstance(node, float) and (node != node or node in (float("inf"), float("-inf"))):
                raise InvalidParams("Job params must not hold NaN or infinite numbers.")
            if isinstance(node, str):
                budget = _spend(budget, len(node), limit)
                texts.append(_text(node))
            elif node is not None and not isinstance(node, bool):
                texts.append(str(node))
        else:
            raise InvalidParams(
                "Job params must hold plain JSON values (dict, list, str, int, float, bool, "
                f"None), not {type(node).__name__}."
            )
    return texts


def _spend(budget: int, cost: int, limit: int) -> int:
    budget -= cost
    if budget < 0:
        raise _too_large(limit)
    return budget


def _text(value: str) -> str:
    if _UNSTORABLE.search(value):
        raise InvalidParams(
            "Job params must not contain NUL characters or lone surrogates "
            "(the database cannot store them)."
        )
    return value


class _Personal(NamedTuple):
    """One personal value as params may hold it: whole, its e-mail local part, its digits."""

    text: str
    contained: bool  # also inside a longer string
    words: list[re.Pattern[str]]  # an e-mail address's local part, as a word of its own
    digits: str  # a phone number's significant digits, or ""

    def found_in(self, text: str) -> bool:
        if text == self.text or (self.contained and self.text in text):
            return True
        if any(word.search(text) for word in self.words):
            return True
        return bool(self.digits) and any(
            _same_number(_significant(number), self.digits)
            for number in _NUMBER_IN_TEXT.findall(text)
        )


def _personal(value: Any) -> _Personal | None:
    if value is None or isinstance(value, bool):
        return None  # erased, or a yes/no that identifies nobody
    text = str(value).strip().casefold()
    if not text:
        return None
    contained = isinstance(value, str) and len(text) >= MIN_CONTAINED_LENGTH
    local, at, domain = text.rpartition("@")
    words = []
    if at and local and domain:
        # "ada.lovelace+shop@…": the local part, and the part before a "+tag".
        for part in dict.fromkeys((local, local.split("+", 1)[0])):
            if len(part) >= MIN_CONTAINED_LENGTH:
                words.append(re.compile(rf"(?<![^\W_]){re.escape(part)}(?![^\W_])"))
    digits = ""
    if _PHONE.fullmatch(text) and sum(c.isdigit() for c in text) >= MIN_PHONE_DIGITS:
        digits = _significant(text)
    return _Personal(text, contained, words, digits)


def _significant(number: str) -> str:
    # The digits without the leading zeros of an international (00) or a trunk (0) prefix, and
    # without the trunk 0 written in brackets after a country code ("+49 (0)30 …").
    return "".join(c for c in number.replace("(0)", "") if c.isdigit()).lstrip("0")


def _same_number(found: str, personal: str) -> bool:
    """The same phone number, perhaps one with its country code and the other without."""
    short, long = sorted((found, personal), key=len)
    return (
        len(short) >= MIN_PHONE_DIGITS
        and len(long) - len(short) <= MAX_COUNTRY_DIGITS
        and long.endswith(short)
    )


def _refuse_personal_values(record: models.Model, texts: list[str]) -> None:
    """Refuse params holding the value of one of the record's personal fields (named, not shown):
    as text, an e-mail address's local part, or a phone number's digits."""
    names = get_options(record).personal_fields
    if not names:
        return
    values = _personal_values(record, names)
    haystack = [t.strip().casefold() for t in texts]
    for name, value in values.items():
        personal = _personal(value)
        if personal is None:
            continue
        if any(personal.found_in(t) for t in haystack):
            raise InvalidParams(
                f"Job params contain the value of the personal field {name!r} of "
                f"{record._meta.label}: pass ids and options, never personal values.",
                field=name,
                model=record._meta.label,
                pk=record.pk,
            )


def _personal_values(record: models.Model, names: tuple[str, ...]) -> dict[str, Any]:
    attnames = {name: record._meta.get_field(name).attname for name in names}  # type: ignore[union-attr]
    deferred = record.get_deferred_fields()
    values = {
        name: getattr(record, attname)
        for name, attname in attnames.items()
        if attname not in deferred
    }
    missing = [name for name, attname in attnames.items() if attname in deferred]
    if missing and record.pk is not None:
        # One read for the deferred ones, without loading them into the caller's instance.
        row = (
            type(record)
            ._base_manager.using(record._state.db)
            .filter(pk=record.pk)
            .values(*missing)
            .first()
        )
        values.update(row or {})
    return values
