"""``TombstoneBackend``: Django's tasks framework in front of the fenced-job engine."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router, transaction

from ..conf import QUEUE_NAME
from ..jobs import registry
from ..jobs.cluster import runs_in_sync
from ..signals import job_finished
from . import arguments, running
from .compat import (
    BaseTaskBackend,
    InvalidTask,
    TaskResult,
    TaskResultDoesNotExist,
    task_enqueued,
    task_finished,
)
from .results import result_for
from .task import TombstoneTask

# Keys of OPTIONS this backend reads: none yet (its settings are the TOMBSTONES_* ones).
OPTIONS: frozenset[str] = frozenset()
# Validated tasks an enqueue need not validate again, remembered at most (per backend).
SEEN_TASKS = 256


class TombstoneBackend(BaseTaskBackend):
    """Runs ``@task`` functions as jobs on the django-q2 cluster.

    A task's record argument (a ``TombstoneModel`` instance; ``@task(fence="name")`` picks one of
    several) becomes the job's snapshot, and the job joins the record's lane. A call that passes
    no record is a plain job: no fence, a lane of its own, the same engine (unless the task is
    fenced: its fence named, or a parameter typed as a TombstoneModel). ``run_after`` and
    priorities are honoured (a priority orders due lanes, never the jobs of one), and ``async
    def`` tasks run. ``QUEUES`` names the queues its tasks may use (each served by the
    django-q2 cluster ``TOMBSTONES_QUEUES`` names, see :mod:`tombstones.jobs.queues`); a
    record's lane in a queue is that queue's own. ``QUEUES = []`` (any queue, to Django): the
    queues tombstones knows of, an enqueue into another refused with ``UnknownQueue``.
    """

    task_class = TombstoneTask

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Tasks this backend validated, with the handler their registration made. Bounded: a
        # copy by .using(run_after=...) is a task of its own.
        self._seen: dict[Any, registry.Handler] = {}

    supports_defer = True
    # Django's Task.call runs it with async_to_sync on the worker's thread: its ORM calls (and
    # context.aupdate) run there, in the job's transaction.
    supports_async_task = True
    supports_get_result = True
    # Among due lanes, those with a job of a higher priority first; never within a lane.
    supports_priority = True

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        path = getattr(task, "module_path", "?")
        if not isinstance(task, TombstoneTask):
            raise InvalidTask(
                f"Task {path} is a {type(task).__name__}: TombstoneBackend runs TombstoneTask "
                "(Django's @task makes one for this backend; so does fenced_task)."
            )
        if task.func.__module__ == "__main__":
            raise InvalidTask(
                f"Task {path} is defined in __main__: a worker could not import it. Define it in "
                "a module of your project."
            )
        try:
            registry.check_name(task.handler_name)
            task.coalescing()
        except ImproperlyConfigured as exc:
            raise InvalidTask(f"Task {path}: {exc}") from exc
        params = task.parameters()
        if task.fence is not None:
            found = next((p for p in params if p.name == task.fence), None)
            if found is None or found.kind in (
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ):
                raise InvalidTask(
                    f"Task {path} is fenced on {task.fence!r}, which is not one of its named "
                    "parameters."
                )
        # Defining a task registers its handler, in the web process and in the worker alike.
        made = registry.add(self.handler_for(task), replace=True)
        if len(self._seen) >= SEEN_TASKS:
            self._seen.clear()
        with contextlib.suppress(TypeError):  # unhashable: validated at each enqueue
            self._seen[task] = made

    def handler_for(self, task: TombstoneTask) -> registry.Handler:
        """The job handler that runs ``task`` (:func:`.running.handler_for`)."""
        return running.handler_for(task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> TaskResult:
        """One job in the caller's transaction (a rolled-back request leaves none): fenced on
        the call's record, or plain when it passes none (UnfencedTask when the task is fenced:
        its fence named, or a parameter typed as a TombstoneModel); the refusals of
        ``tombstones.enqueue``."""
        from ..jobs.enqueue import enqueue, enqueue_plain
        from ..jobs.models import Job

        if not self._validated(task):
            self.validate_task(task)
        encoded = arguments.encode(task, args, kwargs)
        db = router.db_for_write(Job)
        announce = _Enqueued(type(self))
        # Outside a transaction, one of its own: task_enqueued goes before the job's wake-up,
        # which runs it at once in sync mode (autocommit runs a callback when it is registered).
        outer = transaction.atomic(using=db) if not connections[db].in_atomic_block else None
        with outer or contextlib.nullcontext():
            # Registered before the enqueue's wake-up, which goes last (.jobs.enqueue): Django's
            # signals come in their order, enqueued before started, on a cluster too.
            transaction.on_commit(announce, using=db)
            if encoded.record is None:  # no record among the arguments: a plain job
                job = enqueue_plain(
                    task.handler_name,
                    params=encoded.params,
                    run_after=task.run_after,
                    using=db,
                    priority=task.priority,
                    queue=task.queue_name,
                )
            else:
                job = enqueue(
                    task.handler_name,
                    encoded.record,
                    params=encoded.params,
                    run_after=task.run_after,
                    using=db,
                    priority=task.priority,
                    queue=task.queue_name,
                )
            result = announce.result = result_for(job, task, self.alias, claims=[])
        if outer is not None and runs_in_sync():
            # django-q2's sync mode ran the job at the commit, in this process: the result as
            # it left it (what Django's immediate backend returns). One read, in sync mode only.
            result.refresh()
        return result

    def _validated(self, task: Any) -> bool:
        """Validated by this backend before (at its definition, or an earlier enqueue), and its
        handler still registered: an enqueue need not do it again (a signature read and a
        registration per job)."""
        made = registry.registered_as(getattr(task, "handler_name", ""))
        try:
            return made is not None and self._seen.get(task) is made
        except TypeError:  # an unhashable task: validated each time
            return False

    def get_result(self, result_id: Any) -> TaskResult:
        """The job's TaskResult, read from the ledger; TaskResultDoesNotExist for an id that
        is no job of a task."""
        from ..jobs.models import Job

        try:
            job = Job.objects.select_related("content_type").get(pk=int(result_id))
        except (Job.DoesNotExist, TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        task = task_of(job.handler)
        if task is None:
            raise TaskResultDoesNotExist(result_id)
        return result_for(job, task, self.alias)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        found: list[checks.CheckMessage] = []
        where = f"TASKS[{self.alias!r}]"
        for app in ("django_q", "tombstones"):
            if not apps.is_installed(app):
                found.append(
                    checks.Error(
                        f"{where} is a TombstoneBackend, but {app!r} is not in INSTALLED_APPS.",
                        hint="Its tasks are jobs of tombstones, run by a django-q2 cluster.",
                        id="tombstones.E030",
                    )
                )
        bad = sorted(name for name in self.queues if not QUEUE_NAME.fullmatch(str(name)))
        if bad:
            found.append(
                checks.Error(
                    f"{where}['QUEUES'] holds {bad}: a queue's name is 1 to 64 letters, digits, "
                    "'_', '-' or '.'.",
                    hint='Leave QUEUES out (["default"]), or name each queue.',
                    id="tombstones.E031",
                )
            )
        unknown = set(self.options) - OPTIONS
        if unknown:
            found.append(
                checks.Error(
                    f"{where}['OPTIONS'] holds keys TombstoneBackend does not read: "
                    f"{', '.join(sorted(map(str, unknown)))}.",
                    hint="Its settings are the TOMBSTONES_* settings.",
                    id="tombstones.E032",
                )
            )
        return found


class _Enqueued:
    """Django's ``task_enqueued`` for one enqueue, once its transaction commits (nothing when
    the enqueue was refused: no result)."""

    def __init__(self, sender: type) -> None:
        self.sender = sender
        self.result: TaskResult | None = None

    def __call__(self) -> None:
        if self.result is not None:
            task_enqueued.send(self.sender, task_result=self.result)


def task_of(handler: str) -> TombstoneTask | None:
    """The task a job's handler name points to, if this process can import it."""
    found = registry.imported_task(handler)
    return found if isinstance(found, TombstoneTask) else None


def _send_task_finished(sender: Any, job: Any, **kwargs: Any) -> None:
    """Django's ``task_finished`` for a task's job, once its outcome has committed."""
    task = task_of(job.handler)
    if task is None:
        return
    from ..jobs.models import Job

    backend = task.get_backend()
    claims = getattr(job, "_task_claims", None)  # read when the task ran in this claim
    if claims is not None and job.trail_in_row:
        # A plain success (most jobs): its outcome wrote no event, so the claims its task saw
        # are all there are, and the instance is its row as the outcome's UPDATE left it (that
        # UPDATE returned what the database set).
        result = result_for(job, task, backend.alias, claims=claims)
    else:  # a trail in events (retries, re-reads, rejections): as get_result() will read it
        stored = Job.objects.using(job._state.db).select_related("content_type").get(pk=job.pk)
        result = result_for(stored, task, backend.alias)
    task_finished.send(type(backend), task_result=result)


job_finished.connect(_send_task_finished, dispatch_uid="tombstones.tasks.task_finished")
