"""Coalesced wake-ups (TOMBSTONES_COALESCE_WAKES): one message serves the jobs queued meanwhile.

With django-q2's Redis broker the coalescing is a *gate*, a Redis key next to the queue:

- an enqueue sends a message only if it armed the gate (``SET NX``); when the gate is already
  armed, the pump that will open it has not made its last look yet and will see the job, which
  committed before the enqueue looked at the gate;
- a pump (:func:`tombstones.batch.pump`) that finds nothing due opens the gate (``DEL``) and looks
  once more before it stops;
- the gate expires (``GATE_TTL``) so that a pump killed while holding it costs at most that long
  a delay, until the next enqueue sends a message (or the sweep re-dispatches);
- a pump that leaves due lane heads to other workers sends one helper message at a time (a second
  key), so different lanes still run in parallel.

With any other broker (the ORM broker polls, so messages wait a while) the test is the one the
queue itself gives: a message still waiting in the broker will run a pump that sees the job.
That count includes other tasks' messages, hence the setting's "dedicated queue" caveat.

Every failure to ask (a broker error) answers "send the message": unknown never loses a wake-up.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import tombstone_settings

logger = logging.getLogger("tombstones")

# Milliseconds a gate or helper key lives without its pump: the longest a crashed pump delays
# the jobs queued behind its gate (a live pump past it only costs an extra message).
GATE_TTL = 5_000

_brokers: dict[tuple[int, str], Any] = {}


def broker() -> Any:
    """The django-q2 broker of the configured queue, one per process and queue name.

    It holds a connection: django-q2 would open one per message.
    """
    from django_q.brokers import get_broker
    from django_q.conf import Conf

    name = str(tombstone_settings.Q_OPTIONS.get("cluster") or Conf.CLUSTER_NAME)
    key = (os.getpid(), name)
    found = _brokers.get(key)
    if found is None:
        found = _brokers[key] = get_broker(name)
    return found


@receiver(setting_changed)
def _forget_brokers(*, setting: str, **kwargs: Any) -> None:
    if setting in ("Q_CLUSTER", "TOMBSTONES_Q_OPTIONS"):
        _brokers.clear()


def _redis(found: Any) -> Any:
    """The broker's Redis client, or None for any other broker."""
    # Not imported unless django-q2 uses it: the redis package weighs on every worker's memory.
    module = sys.modules.get("django_q.brokers.redis_broker")
    if module is None or not isinstance(found, module.Redis):
        return None
    return found.connection


def _key(found: Any, name: str) -> str:
    return f"{found.list_key}:tombstones:{name}"


def message_waiting(found: Any) -> bool:
    """True if a message is in the broker and not yet taken by a cluster (False when unknown)."""
    try:
        orm = sys.modules.get("django_q.brokers.orm")
        if orm is not None and isinstance(found, orm.ORM):
            # Not the broker's queue_size(): its COUNT goes through close_old_connections(),
            # which closes the caller's connection (CONN_MAX_AGE = 0) on every enqueue.
            from django.utils import timezone
            from django_q.conf import Conf
            from django_q.models import OrmQ

            waiting = OrmQ.objects.using(Conf.ORM).filter(
                key=found.list_key, lock__lte=timezone.now()
            )
            return waiting.exists()
        return int(found.queue_size() or 0) > 0
    except Exception:  # noqa: BLE001 - unknown means "send the message"
        return False


def arm() -> bool:
    """Enqueue side, after commit: True if this enqueue must send a message."""
    return _take("gate")


def open_gate() -> bool:
    """Pump side, when it found nothing due: open the gate; True if the pump must look again."""
    return _release("gate")


def call_helper() -> bool:
    """Pump side, when it left due lane heads to others: True if it should send a helper message.

    One helper message at a time: each helper's pump may call the next, up to the workers.
    """
    return _take("helper")


def helper_arrived() -> None:
    """Pump side, at its start: a helper message is no longer pending."""
    _release("helper")


def _take(name: str) -> bool:
    """Set the key if unset (it expires): True if this process set it, so it sends the message.

    Without Redis: True if no message waits in the broker.
    """
    found = broker()
    client = _redis(found)
    if client is None:
        return not message_waiting(found)
    try:
        return bool(client.set(_key(found, name), "1", nx=True, px=GATE_TTL))
    except Exception:  # noqa: BLE001 - unknown means "send the message"
        return True


def _release(name: str) -> bool:
    """Delete the key; True if there is one (Redis), False with any other broker."""
    found = broker()
    client = _redis(found)
    if client is None:
        return False
    try:
        client.delete(_key(found, name))
    except Exception:  # noqa: BLE001 - the key expires by itself
        logger.warning("could not delete the wake-up %s key; it expires in %s ms", name, GATE_TTL)
    return True
