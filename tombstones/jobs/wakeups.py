"""Wake-ups: the django-q2 messages that start a worker's pump, coalesced.

A message carries no job: the task (:func:`tombstones.worker.run`) runs every due lane head it
finds, so one message serves all the jobs queued meanwhile. An enqueue sends a message only when
no pump is certain to look after the job committed:

- with django-q2's Redis broker, a *gate* (a Redis key next to the queue): the enqueue that arms
  it (``SET NX``) sends the message; a pump that finds nothing due opens it (``DEL``) and looks
  once more before it stops. An enqueue that finds the gate armed committed before that last
  look, so the job is seen. While a pump runs, enqueues send nothing: one worker drains what
  its quick handlers can; a claim that runs long opens the gate and calls a helper for whatever
  is due meanwhile (:mod:`tombstones.jobs.engine.keeper`). The gate expires (``GATE_TTL``): a
  message lost or a pump killed holding it costs at most that long, and a replacement worker
  opens it at its start (:mod:`tombstones.jobs.engine.alarms`);
- with any other broker (the ORM broker polls), one of our messages still waiting in the queue:
  its pump will look after the job committed. Other tasks sharing the queue do not count.

A pump that leaves due lane heads to other workers sends one *helper* message at a time (a
second key), so that different lanes run in parallel.

Each queue's wake-ups go to the django-q2 cluster that serves it (:mod:`.queues`), each
cluster with a gate and a helper key of its own; a pump's own messages (a hand-off, a helper)
go to the cluster it runs in. Every failure to ask the broker answers
"send the message": unknown never loses a wake-up, and a lost message is the sweep's to repair.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils import timezone

from ..conf import tombstone_settings
from ..logfields import jobs_fields
from .cluster import runs_in_sync
from .queues import own_cluster

logger = logging.getLogger("tombstones")

TASK = "tombstones.worker.run"
# Milliseconds a gate or helper key lives without its pump.
GATE_TTL = 5_000
# Waiting ORM-broker messages examined for one of ours (oldest first).
ORM_LOOKAHEAD = 3

_brokers: dict[tuple[int, str], Any] = {}


def broker(cluster: str | None = None) -> Any:
    """The django-q2 broker of ``cluster`` (default: the one this process's pump serves, see
    :func:`.queues.own_cluster`), one per process and cluster.

    It holds a connection: django-q2 would open one per message.
    """
    from django_q.brokers import get_broker

    name = cluster or own_cluster()
    key = (os.getpid(), name)
    found = _brokers.get(key)
    if found is None:
        found = _brokers[key] = get_broker(name)
    return found


@receiver(setting_changed)
def _forget_brokers(*, setting: str, **kwargs: Any) -> None:
    if setting in ("Q_CLUSTER", "TOMBSTONES_Q_OPTIONS", "TOMBSTONES_QUEUES"):
        _brokers.clear()


def wake(reason: int | None = None, *, cluster: str | None = None) -> str | None:
    """Send one wake-up message to ``cluster`` (default: this process's own, see
    :func:`broker`); ``reason`` (a job id) is only shown in django-q2's task name."""
    from django_q.tasks import async_task

    name = cluster or own_cluster()
    options = {"group": "tombstones", "ack_failure": True, **tombstone_settings.Q_OPTIONS}
    options["cluster"] = name
    try:
        return async_task(TASK, reason, broker=broker(name), **options)
    except Exception as exc:  # noqa: BLE001 - any broker failure: the sweep wakes the job later
        missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
        logger.error(
            "wake-up for job %s failed (%s%s); the sweep will pick the job up",
            reason,
            type(exc).__name__,
            f": module {missing!r} is missing" if missing else "",
            extra=jobs_fields([reason], job_id=reason, error_class=type(exc).__name__),
        )
        return None


def wake_soon(reason: int | None = None, *, cluster: str | None = None) -> str | None:
    """Wake a pump of ``cluster`` (default: this process's own; an enqueue names its queue's,
    :func:`.queues.cluster_of`) unless one is certain to look after now (see the module
    docstring)."""
    cluster = cluster or own_cluster()
    if runs_in_sync():
        return wake(reason, cluster=cluster)
    if not _take("gate", cluster):
        return None
    sent = wake(reason, cluster=cluster)
    if sent is None:
        _release("gate", cluster)  # nothing will open it: let the next enqueue send its message
    return sent


def hand_off(reason: int | None = None) -> str | None:
    """Pump side, its budget spent with work left: the next message, whatever the gate says.

    This pump's own message armed the gate, so ``wake_soon`` would send nothing: the gate stays
    armed for the new message (its expiry renewed), or opens if the send failed.
    """
    sent = wake(reason)
    if runs_in_sync():
        return sent
    if sent is None:
        _release("gate")
    else:
        _rearm("gate")
    return sent


def open_gate() -> bool:
    """Pump side, when it found nothing due: the next enqueue sends a message again.

    True if there is a gate (Redis): the pump must then look once more.
    """
    return _release("gate")


def call_helper(reason: int | None = None) -> None:
    """Pump side, when it left due lane heads to others: one helper message at a time."""
    if not runs_in_sync() and _take("helper"):
        wake(reason)


def helper_arrived() -> None:
    """Pump side, at its start: a helper message is no longer pending."""
    _release("helper")


def _redis(found: Any) -> Any:
    """The broker's Redis client, or None for any other broker."""
    # Not imported unless django-q2 uses it: the redis package weighs on every worker's memory.
    module = sys.modules.get("django_q.brokers.redis_broker")
    if module is None or not isinstance(found, module.Redis):
        return None
    return found.connection


def _key(found: Any, name: str) -> str:
    return f"{found.list_key}:tombstones:{name}"


def ours_waiting(found: Any) -> bool:
    """True if one of our wake-ups waits in the broker, not yet taken (False when unknown)."""
    try:
        orm = sys.modules.get("django_q.brokers.orm")
        if orm is not None and isinstance(found, orm.ORM):
            # Not the broker's queue_size(): its COUNT goes through close_old_connections(),
            # which closes the caller's connection (CONN_MAX_AGE = 0) on every enqueue.
            from django_q.conf import Conf
            from django_q.models import OrmQ
            from django_q.signing import SignedPackage

            waiting = OrmQ.objects.using(Conf.ORM).filter(
                key=found.list_key, lock__lte=timezone.now()
            )
            for payload in waiting.order_by("id").values_list("payload", flat=True)[:ORM_LOOKAHEAD]:
                if SignedPackage.loads(payload).get("func") == TASK:
                    return True
            return False
        return False  # a broker we cannot look into: always send
    except Exception:  # noqa: BLE001 - unknown means "send the message"
        return False


def _take(name: str, cluster: str | None = None) -> bool:
    """Set ``cluster``'s key if unset (it expires): True if this process set it, so it sends
    the message.

    Without Redis: True unless one of our messages waits in the broker.
    """
    found = broker(cluster)
    client = _redis(found)
    if client is None:
        return not ours_waiting(found)
    try:
        return bool(client.set(_key(found, name), "1", nx=True, px=GATE_TTL))
    except Exception:  # noqa: BLE001 - unknown means "send the message"
        return True


def _rearm(name: str) -> None:
    """Set the key (it expires) whether or not it was set; nothing without Redis."""
    found = broker()
    client = _redis(found)
    if client is None:
        return
    try:
        client.set(_key(found, name), "1", px=GATE_TTL)
    except Exception:  # noqa: BLE001 - an open gate only means more messages
        logger.warning("could not re-arm the wake-up %s key", name)


def _release(name: str, cluster: str | None = None) -> bool:
    """Delete ``cluster``'s key: True with Redis, False with any other broker (nothing to
    do)."""
    if runs_in_sync():
        return False
    found = broker(cluster)
    client = _redis(found)
    if client is None:
        return False
    try:
        client.delete(_key(found, name))
    except Exception:  # noqa: BLE001 - the key expires by itself
        logger.warning("could not delete the wake-up %s key; it expires in %s ms", name, GATE_TTL)
    return True
