"""The audit pages' search (tombstones.admin.audit.search_ids): a job id (``42``, ``#42``) or a
record pk (``7``, ``customers.customer:7``), exact matches on ids only.

No database: each search is compared, by its WHERE clause, with the query it promises to build;
no query runs.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import Q, QuerySet

from tombstones.admin.audit import search_ids
from tombstones.jobs.models import Job, JobEvent

BIGINT_DIGITS = 19


def _where(queryset: QuerySet[Any]) -> Any:
    return queryset.query.where


def test_search_ids__an_empty_term_leaves_the_list_as_it_is() -> None:
    jobs = Job.objects.all()
    assert search_ids(jobs, "", "pk") is jobs
    assert search_ids(jobs, "  \t", "pk") is jobs


def test_search_ids__digits_match_a_job_id_or_a_record_pk() -> None:
    expected = Job.objects.filter(Q(object_id="42") | Q(pk=42))
    assert _where(search_ids(Job.objects.all(), "42", "pk")) == _where(expected)
    assert _where(search_ids(Job.objects.all(), " 42 ", "pk")) == _where(expected)
    events = JobEvent.objects.filter(Q(object_id="42") | Q(job_id=42))
    assert _where(search_ids(JobEvent.objects.all(), "42", "job_id")) == _where(events)


def test_search_ids__a_hash_names_the_job_only() -> None:
    assert _where(search_ids(Job.objects.all(), "#42", "pk")) == _where(Job.objects.filter(pk=42))
    assert _where(search_ids(JobEvent.objects.all(), "#42", "job_id")) == _where(
        JobEvent.objects.filter(job_id=42)
    )


def test_search_ids__a_hash_without_a_plausible_id_finds_nothing() -> None:
    for term in ("#", "#abc", "#-1", "#4 2", "#" + "9" * BIGINT_DIGITS):
        assert search_ids(Job.objects.all(), term, "pk").query.is_empty(), term


def test_search_ids__a_number_too_long_for_an_id_is_only_a_record_pk() -> None:
    longest = "9" * (BIGINT_DIGITS - 1)
    assert _where(search_ids(Job.objects.all(), longest, "pk")) == _where(
        Job.objects.filter(Q(object_id=longest) | Q(pk=int(longest)))
    )
    too_long = "9" * BIGINT_DIGITS  # would overflow a bigint: never compared with the id
    assert _where(search_ids(Job.objects.all(), too_long, "pk")) == _where(
        Job.objects.filter(object_id=too_long)
    )


def test_search_ids__text_is_a_record_pk_only() -> None:
    for term in ("C-1001", "-1", "4 2", "0x2a"):
        assert _where(search_ids(Job.objects.all(), term, "pk")) == _where(
            Job.objects.filter(object_id=term)
        ), term


def test_search_ids__a_record_reference_names_its_model_in_any_case() -> None:
    expected = Job.objects.filter(
        content_type__app_label="customers", content_type__model="customer", object_id="7"
    )
    for term in ("customers.customer:7", "Customers.Customer:7", " customers.customer:7 "):
        assert _where(search_ids(Job.objects.all(), term, "pk")) == _where(expected), term


def test_search_ids__a_record_reference_splits_at_its_last_colon() -> None:
    expected = JobEvent.objects.filter(
        content_type__app_label="customers", content_type__model="customer", object_id=""
    )
    assert _where(search_ids(JobEvent.objects.all(), "customers.customer:", "job_id")) == _where(
        expected
    )


@pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason="str.isdigit() accepts '²' and '①', which int() refuses: the search page fails",
)
def test_search_ids__digit_like_characters_are_no_job_id() -> None:
    for term in ("²", "#²", "①"):
        search_ids(Job.objects.all(), term, "pk")
