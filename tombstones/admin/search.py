"""The job audit's search: job ids, record references and business keys, exact matches only.

No lookup ever touches a job's params or a record's other fields. A business key is resolved to
its records' pks first (one lookup by the key's unique index per TombstoneModel), then the jobs
are found by (content type, object id), the job table's own index. A business key that is also a
personal field (a misconfiguration, tombstones.E004) is never searched: as in
``tombstone_identity()``, the audit neither shows nor answers questions about it.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, cast

from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q, QuerySet

from ..records.mixin import TombstoneModel
from ..records.options import get_options

__all__ = [
    "business_key_match",
    "search_ids",
    "search_jobs",
    "searchable_keys",
    "tombstone_models",
]

# The longest all-digit term tried as a job id (a bigint has 19 digits; beyond, it is no id).
_MAX_ID_DIGITS = 18
# A business key is unique (tombstones.E002): more rows than this is no key lookup.
_MAX_KEY_ROWS = 20


def _id_match(term: str, job_field: str, record_types: list[int] | None = None) -> Q | None:
    """The ids a term names; None when it can name nothing (``#abc``). A bare record pk is
    looked up among ``record_types`` (content type ids) when given, so that the job table's
    (content type, object id) index answers it."""
    if term.startswith("#"):
        digits = term[1:]
        if digits.isdigit() and len(digits) <= _MAX_ID_DIGITS:
            return Q(**{job_field: int(digits)})
        return None
    if ":" in term:
        label, _, pk = term.rpartition(":")
        app_label, _, model = label.lower().partition(".")
        return Q(content_type__app_label=app_label, content_type__model=model, object_id=pk)
    if record_types is None:
        match = Q(object_id=term)
    else:
        match = Q(content_type_id__in=record_types, object_id=term)
    if term.isdigit() and len(term) <= _MAX_ID_DIGITS:
        match |= Q(**{job_field: int(term)})
    return match


def search_ids(queryset: QuerySet[Any], term: str, job_field: str) -> QuerySet[Any]:
    """Search by job id (``42``, ``#42``) or record pk (``7``, ``customers.customer:7``).

    Exact matches on ids only: no lookup ever touches params or the record's fields.
    """
    term = term.strip()
    if not term:
        return queryset
    match = _id_match(term, job_field)
    return queryset.none() if match is None else queryset.filter(match)


def tombstone_models() -> list[type[TombstoneModel]]:
    """The installed TombstoneModels: the only models a job can be for (enqueue refuses others)."""
    return [model for model in apps.get_models() if issubclass(model, TombstoneModel)]


def searchable_keys() -> list[tuple[type[TombstoneModel], models.Field[Any, Any]]]:
    """Each installed TombstoneModel with a business key that is not a personal field."""
    found = []
    for model in tombstone_models():
        options = get_options(model)
        key = options.business_key
        if key is None or key in options.personal_fields:
            continue
        found.append((model, cast("models.Field[Any, Any]", model._meta.get_field(key))))
    return found


def business_key_match(term: str) -> Q | None:
    """The records, live or tombstones, whose business key is ``term``, as (content type,
    object id) conditions on the job table; None when no record has that key."""
    matches = []
    for model, field in searchable_keys():
        try:
            value = field.to_python(term)
            field.run_validators(value)  # too long, out of range: no key of this model
        except ValidationError:
            continue
        if value in field.empty_values:
            continue
        pks = model.all_objects.filter(**{field.name: value}).values_list("pk", flat=True)
        object_ids = [str(pk) for pk in pks[:_MAX_KEY_ROWS]]
        if object_ids:
            content_type = ContentType.objects.get_for_model(model)
            matches.append(Q(content_type=content_type, object_id__in=object_ids))
    return functools.reduce(operator.or_, matches) if matches else None


def search_jobs(queryset: QuerySet[Any], term: str, job_field: str) -> QuerySet[Any]:
    """:func:`search_ids`, and the jobs of the records whose business key is ``term``
    (``C-1001``); ``#42`` names a job id only. Every record condition names its content types:
    the job table has no index on ``object_id`` alone."""
    term = term.strip()
    if not term or term.startswith("#"):
        return search_ids(queryset, term, job_field)
    types = ContentType.objects.get_for_models(*tombstone_models())
    match = _id_match(term, job_field, sorted(ct.pk for ct in types.values()))
    keys = business_key_match(term)
    if keys is not None:
        match = keys if match is None else match | keys
    return queryset.none() if match is None else queryset.filter(match)
