"""A (generation, version) that is not known is written ``-`` (or ``?`` for one half), never
``gNone``/``vNone``: the admin's pages, the timeline's titles, and the task results' error text.

A plain job (a task for no record) has neither; an event that ended before its check read the
record found neither."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.jobkit import temp_handler
from tombstones.admin import timeline_svg
from tombstones.admin.display import generation_version
from tombstones.jobs.enqueue import enqueue_plain
from tombstones.models import Job, JobEvent
from tombstones.tasks.results import errors_of

pytestmark = pytest.mark.django_db

NONE_FENCE = re.compile(r"[gv]None")


def test_generation_version__missing_halves() -> None:
    assert generation_version(2, 5) == "g2/v5"
    assert generation_version(2, None) == "g2/v?"
    assert generation_version(None, 5) == "g?/v5"
    assert generation_version(None, None) == "-"


def _plain_job() -> Job:
    with temp_handler("tests.plain_fence_text", lambda context: None, plain=True):
        return enqueue_plain("tests.plain_fence_text", params={"n": 1})


def test_job_page_and_confirmation__plain_job_has_no_none_fence(admin_client: Client) -> None:
    job = _plain_job()
    assert (job.generation, job.version) == (None, None)

    page = admin_client.get(reverse("admin:tombstones_job_change", args=(job.pk,)))
    confirm = admin_client.get(reverse("admin:tombstones_job_act", args=(job.pk, "cancel")))

    assert page.status_code == confirm.status_code == 200
    for response in (page, confirm):
        # The idempotency key is shown as external services received it (the jobs' own value,
        # tombstones-job-<id>-g<generation>): an identifier, not a fence written for a reader.
        html = response.content.decode().replace(job.idempotency_key, "")
        assert not NONE_FENCE.search(html), NONE_FENCE.search(html)
        assert "g?/v?" not in html  # both halves unknown: "-", as the lists write it
    # The enqueue row of the event table: expected and found are both "-".
    events = page.content.decode().split('id="job-events"')[1]
    assert re.search(r"<td>-</td>\s*<td>-</td>", events)
    assert "snapshot -" in " ".join(confirm.content.decode().split())


def test_task_result_error__plain_job_says_no_fence() -> None:
    job = Job(pk=41, handler="tests.x", status=Job.Status.FAILED, reason=Job.Reason.HANDLER_ERROR)
    [error] = errors_of(job)
    assert not NONE_FENCE.search(error.traceback), error.traceback
    assert "expected" not in error.traceback  # no record: nothing was expected of one


def test_task_result_error__unknown_found_version_is_a_question_mark() -> None:
    job = Job(
        pk=42,
        handler="tests.x",
        status=Job.Status.REJECTED,
        reason=Job.Reason.GENERATION_CHANGED,
        generation=1,
        version=3,
        found_generation=2,
        found_version=None,
    )
    [error] = errors_of(job)
    assert "(expected g1/v3, found g2/v?)" in error.traceback
    assert not NONE_FENCE.search(error.traceback), error.traceback


def test_timeline_titles__unknown_version_is_a_question_mark() -> None:
    now = timezone.now()
    event = JobEvent(
        job_id=1,
        event=JobEvent.Event.REJECTED,
        reason=Job.Reason.SOURCE_DELETED,
        found_generation=2,
        found_version=None,
        created_at=now,
    )
    axis = timeline_svg.Axis.of([now, now + timedelta(seconds=1)])
    dot: dict[str, Any] = timeline_svg._dot(event, axis)
    assert "found g2/v?" in dot["title"]
    assert not NONE_FENCE.search(dot["title"]), dot["title"]


def test_outcome_log_line__plain_job_has_no_none_fence(
    caplog: pytest.LogCaptureFixture, django_capture_on_commit_callbacks: Any
) -> None:
    from tests.jobkit import run

    with temp_handler("tests.plain_fence_log", lambda context: None, plain=True):
        job = enqueue_plain("tests.plain_fence_log", params={"n": 1})
        # The outcome is logged once its transaction commits.
        with (
            caplog.at_level("INFO", logger="tombstones"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            job = run(job)

    assert job.status == Job.Status.SUCCEEDED
    (line,) = [
        r.getMessage() for r in caplog.records if f"job {job.pk} succeeded" in r.getMessage()
    ]
    assert "expected=- found=-" in line
    assert not NONE_FENCE.search(line)
