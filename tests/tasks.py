"""Tasks of Django's tasks framework that the tests enqueue through TombstoneBackend.

A module of its own so that worker processes import them by path, as they would a project's.
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path
from typing import Any

from django.db.models.signals import post_init
from django.utils import timezone

from project.customers.models import Customer, SheetRow
from project.stress.models import StressEntity
from tombstones.tasks import fenced_task

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

# Django 6.1 (and the backport) pass @task's other keywords to the backend's task class; 6.0 does
# not, and there the companion decorator takes them.
if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(task).parameters.values()):
    with_options: Any = task
else:  # Django 6.0
    with_options = fenced_task

# What a task saw, for the tests to read (in-process runs only).
seen: list[dict[str, Any]] = []


@task(takes_context=True)
def sync_sheet(context: Any, customer: Customer, note: str = "") -> None:
    """The seed's job: mirror the customer into its sheet rows, then stamp the customer."""
    seen.append(
        {
            "record": context.record,
            "customer": customer,
            "version": customer.version,
            "note": note,
            "rereads": context.rereads,
            "attempt": context.attempt,
            "status": context.task_result.status,
            "id": context.task_result.id,
        }
    )
    context.write(SheetRow.objects.filter(customer_id=customer.pk), synced_version=customer.version)
    context.update(synced_at=timezone.now())


@task
def touch(customer: Customer) -> None:
    """No context: the record argument alone."""
    seen.append({"customer": customer})


@with_options(fence="customer", takes_context=True)
def link_row(context: Any, row: SheetRow, customer: Customer, note: str = "") -> None:
    """Two record arguments: fenced on the customer, the row read fresh."""
    seen.append({"row": row, "customer": customer, "record": context.record})
    context.update(synced_at=timezone.now())


@task
def broken(customer: Customer) -> None:
    raise ValueError("a bug in the task")


@task
def broken_personally(customer: Customer) -> None:
    """Its message and a local hold a personal value (the worker logs them only with
    TOMBSTONES_LOG_ERROR_DETAILS, the DEBUG default: in-process tests only)."""
    secret = customer.name
    raise ValueError(f"a bug in the task for {secret}")


@task
def no_record(number: int) -> None:
    """No record argument: a plain job."""


# --- plain tasks: no record, no fence, a lane each ------------------------------------------------


@task
def digest(user_id: int, period: str = "week") -> dict[str, Any]:
    """A plain task: an id and an option; what it returns is kept."""
    seen.append({"user_id": user_id, "period": period})
    return {"sent_to": user_id, "period": period}


@task
def ping() -> str:
    """No argument at all."""
    return "pong"


@task(takes_context=True)
def plain_context(context: Any, number: int) -> None:
    """A plain task's context: no record; the fenced writes refuse (NoRecord)."""
    seen.append({"record": context.record, "attempt": context.attempt, "id": context.job.pk})
    if number < 0:
        context.update(phone="+9")


@with_options(takes_context=True, external=True)
def plain_call_out(context: Any, number: int) -> None:
    """External and plain: sent once; an error after sending leaves it uncertain."""
    from tombstones.models import Job

    sending = Job.objects.values_list("sending_at", flat=True).get(pk=context.job.pk)
    seen.append({"key": context.idempotency_key, "sending": sending})
    if number < 0:
        raise ConnectionResetError("the other side hung up")


@with_options(fence="customer")
def fenced_by_name(customer, note: str = "") -> None:  # type: ignore[no-untyped-def]
    """Fenced by its fence named (no annotation): a call without the record is refused."""


@with_options(takes_context=True, external=True)
def call_out(context: Any, customer: Customer) -> None:
    """External: the key goes to the other system; the bracket is the engine's."""
    from tombstones.models import Job

    sending = Job.objects.values_list("sending_at", flat=True).get(pk=context.job.pk)
    seen.append({"key": context.idempotency_key, "sending": sending})


@task(takes_context=True)
def apply(context: Any, entity: StressEntity, payload: str = "", delay_ms: int = 0) -> None:
    """The stress model's write (lane order in cluster tests): one AppliedWrite per job, after
    ``delay_ms`` (slow enough that a cluster's two workers share the lanes)."""
    from project.stress.models import AppliedWrite

    time.sleep(delay_ms / 1000)
    if context.update(payload=payload or f"applied-by-job-{context.job.pk}"):
        AppliedWrite.objects.create(
            job_id=context.job.pk, key=entity.key, version=entity.version, worker="task"
        )


@task
def pair(first: Customer, second: Customer) -> None:
    """Two records and no fence named: refused at enqueue."""


calls: list[int] = []


@task(takes_context=True)
def bump_once(context: Any, customer: Customer) -> None:
    """Another writer moves the record between its check and its write, the first time only:
    the engine reads it again and calls the task a second time."""
    from tombstones.tasks import TombstoneBackend

    calls.append(customer.version)
    live = TombstoneBackend(alias="default", params={}).get_result(context.task_result.id)
    seen.append({"live_status": live.status, "live_workers": live.worker_ids})
    if len(calls) == 1:
        Customer.objects.filter(pk=customer.pk).update()
    context.update(phone="+1")


@task(takes_context=True)
def returns(context: Any, customer: Customer, kind: str) -> Any:
    """Writes the record, then returns what ``kind`` names."""
    context.update(phone="+2")
    values = {
        "counts": {"rows": 2, "ids": [customer.pk]},
        "tuple": (1, "two"),
        "object": object(),
        "personal": {"to": customer.name},
        "none": None,
    }
    return values[kind]


@task(takes_context=True)
async def async_touch(context: Any, customer: Customer) -> Any:
    """An async task: the fenced write and an ORM read, awaited, in the job's transaction."""
    written = await context.aupdate(phone="+4")
    rows = await SheetRow.objects.filter(customer_id=customer.pk).acount()
    return {"written": written, "rows": rows}


@task(takes_context=True)
async def async_bump_once(context: Any, customer: Customer) -> int:
    """bump_once, awaited: the record moves between the check and the write, the first time."""
    calls.append(customer.version)
    if len(calls) == 1:
        await Customer.objects.filter(pk=customer.pk).aupdate()
    return await context.aupdate(phone="+5")


@task
def broken_locally(customer: Customer) -> None:
    """Raises a class defined here: it cannot be imported by its path."""

    class Local(Exception):
        pass

    raise Local


@task
def flaky_once(customer: Customer) -> None:
    """A temporary failure the first time: retried, then it succeeds."""
    import tombstones

    calls.append(customer.pk)
    if len(calls) == 1:
        raise tombstones.TransientError("upstream busy")


@task(takes_context=True)
def held(context: Any, customer: Customer, signal: str, release: str) -> None:
    """Running, stopped inside the task until the test lets it go (file paths; bounded)."""
    from project.stress.handlers import rendezvous

    rendezvous({"signal": signal, "release": release, "hold": 30})
    context.update(synced_at=timezone.now())


# --- a hold between the check and the write, in cluster workers ----------------------------------
# A worker started with TASKS_HOLD_DIR stops right after its check has read customer <pk>, when
# the test wrote <dir>/hold-<pk>: it renames that file to reached-<pk> (so it holds once) and waits,
# bounded, for release-<pk>. The check reads the record outside the act transaction, so the test can
# delete or update the record there on SQLite too (inside the act transaction SQLite's write lock
# would make it wait): the seed's cases 2 and 4 through a real cluster.
HOLD_DIR = os.environ.get("TASKS_HOLD_DIR", "")
HOLD_SECONDS = 30.0


def _hold_after_read(sender: Any, instance: Any, **kwargs: Any) -> None:
    if instance.pk is None:
        return
    folder = Path(HOLD_DIR)
    try:
        (folder / f"hold-{instance.pk}").rename(folder / f"reached-{instance.pk}")
    except FileNotFoundError:
        return
    release = folder / f"release-{instance.pk}"
    deadline = time.monotonic() + HOLD_SECONDS
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


if HOLD_DIR:
    post_init.connect(_hold_after_read, sender=Customer, weak=False)


@with_options(takes_context=True, coalesce=True)
def sync_crm_newest(context: Any, customer: Customer) -> None:
    """A coalescing task: of a record's queued calls, only the newest runs."""
    seen.append({"coalesced_run": context.task_result.id, "version": customer.version})
    context.update(phone="+6")
