"""django-q2's task table kept honest (tombstones.worker): a wake-up is stored only when every job
it carried succeeded; a rejection is neither a worker error nor a success there."""

from __future__ import annotations

from typing import Any

from tombstones import worker
from tombstones.jobs.engine import runner
from tombstones.jobs.ledger import Outcome
from tombstones.jobs.models import Job
from tombstones.jobs.wakeups import TASK

Status = Job.Status
Reason = Job.Reason


def _result(*outcomes: tuple[int, str, str]) -> dict[str, Any]:
    """A wake-up's return value, built as the runner builds it."""
    return runner.result(
        outcomes[0][0] if outcomes else None,
        [Outcome(Job(pk=pk), status, reason) for pk, status, reason in outcomes],
    )


def _task(result: Any, *, func: Any = TASK, success: bool = True) -> dict[str, Any]:
    return {"func": func, "success": success, "result": result}


def test_carried__reads_back_what_the_runner_returned() -> None:
    result = _result(
        (4, Status.SUCCEEDED, Reason.NONE), (5, Status.REJECTED, Reason.SOURCE_DELETED)
    )
    assert result == {
        "job": 4,
        "carried": [[4, "succeeded", ""], [5, "rejected", "source_deleted"]],
    }
    assert worker.carried(result) == [(4, "succeeded"), (5, "rejected")]


def test_carried__nothing_from_a_result_that_is_not_a_wake_ups() -> None:
    assert worker.carried(None) == []
    assert worker.carried("Traceback ...") == []  # django-q2 stores a failed task's error text
    assert worker.carried([[4, "succeeded"]]) == []
    assert worker.carried({"job": 4}) == []
    assert worker.carried({"carried": []}) == []


def test_carried__skips_rows_too_short_and_reads_statuses_as_text() -> None:
    assert worker.carried({"carried": [[4], [], [5, Status.FAILED, "x", "extra"]]}) == [
        (5, "failed")
    ]


def test_mark_q_task__a_wake_up_that_only_succeeded_is_stored() -> None:
    for func in (TASK, worker.run):  # the dotted path as queued, or the function itself
        task = _task(_result((1, Status.SUCCEEDED, ""), (2, Status.SUCCEEDED, "")), func=func)
        worker.mark_q_task(sender=None, task=task)
        assert "save" not in task


def test_mark_q_task__anything_else_carried_is_not_stored() -> None:
    for status in (Status.REJECTED, Status.RETRY_WAIT, Status.ESCALATED, Status.QUEUED):
        task = _task(_result((1, Status.SUCCEEDED, ""), (2, status, "")))
        worker.mark_q_task(sender=None, task=task)
        assert task["save"] is False, status


def test_mark_q_task__a_wake_up_that_carried_nothing_is_not_stored() -> None:
    task = _task(_result())
    worker.mark_q_task(sender=None, task=task)
    assert task["save"] is False


def test_mark_q_task__worker_errors_and_other_tasks_are_left_to_django_q2() -> None:
    failed = _task("TimeoutError", success=False)
    worker.mark_q_task(sender=None, task=failed)
    assert "save" not in failed
    other = _task(None, func="myapp.tasks.report")
    worker.mark_q_task(sender=None, task=other)
    assert "save" not in other
    sweep = _task({"taken_back": 0}, func="tombstones.worker.run_sweep")
    worker.mark_q_task(sender=None, task=sweep)
    assert "save" not in sweep
