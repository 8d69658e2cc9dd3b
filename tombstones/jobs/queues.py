"""Named queues: which exist, a job's lane in one, the django-q2 cluster that serves each, and the
queues this process's pumps claim from.

A queue is a column of the job and the first key of the hint and priority indexes, so a worker
that serves some queues reads only their hints (:mod:`.ledger.heads`). A record's lane in a queue
other than ``"default"`` is ``queue:<queue>/<key>``: a lane never spans queues, so a worker of
one queue never holds back another's, and the jobs of one record in two queues are two lanes,
each in order, not ordered between them (docs/tasks.md, "Named queues").

The queues are ``"default"``, the keys of ``TOMBSTONES_QUEUES`` and the ``QUEUES`` of every
``TombstoneBackend`` in ``TASKS``. Each is served by one django-q2 cluster: the one
``TOMBSTONES_QUEUES`` names, or the one the wake-ups go to by default
(``TOMBSTONES_Q_OPTIONS["cluster"]``, else ``Q_CLUSTER``'s name). A cluster started with
``Q_CLUSTER_NAME=<name> manage.py qcluster`` serves the queues of that name.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from ..conf import QUEUE_NAME, tombstone_settings
from ..exceptions import UnknownQueue
from .cluster import in_cluster_worker

logger = logging.getLogger("tombstones")

DEFAULT = "default"  # Django's DEFAULT_TASK_QUEUE_NAME
LANE_PREFIX = "queue:"
_BACKEND = "tombstones.tasks.backend.TombstoneBackend"


@cache
def known() -> tuple[str, ...]:
    """Every queue a job may be in: ``"default"`` first, then the others by name."""
    names = {DEFAULT, *tombstone_settings.QUEUES, *_backend_queues()}
    return (DEFAULT, *sorted(names - {DEFAULT}))


def _backend_queues() -> set[str]:
    """The ``QUEUES`` of every TombstoneBackend in ``TASKS`` (read from the setting: no backend
    is built, and nothing is imported for another backend)."""
    found: set[str] = set()
    for entry in (getattr(settings, "TASKS", None) or {}).values():
        if isinstance(entry, dict) and _is_ours(entry.get("BACKEND")):
            names = entry.get("QUEUES", [DEFAULT])
            found.update(name for name in names or () if isinstance(name, str))
    return {name for name in found if QUEUE_NAME.fullmatch(name)}


def _is_ours(path: Any) -> bool:
    """A backend path that names ours, or a subclass of it (a project's own)."""
    if not isinstance(path, str) or not path:
        return False
    if path in (_BACKEND, "tombstones.tasks.TombstoneBackend"):
        return True
    try:
        found = import_string(path)
        ours = import_string(_BACKEND)
    except ImportError:
        return False
    return isinstance(found, type) and issubclass(found, ours)


def check(name: Any) -> str:
    """``name`` if it is a known queue; UnknownQueue (a ValueError) naming the known ones."""
    if not isinstance(name, str) or name not in known():
        raise UnknownQueue(
            f"There is no queue {name!r}: the queues are {', '.join(map(repr, known()))} "
            "(TOMBSTONES_QUEUES, and the QUEUES of a TombstoneBackend)."
        )
    return name


def lane(queue: str, key: str) -> str:
    """The lane of ``key`` (a record's, or an ordering key) in ``queue``."""
    return key if queue == DEFAULT else f"{LANE_PREFIX}{queue}/{key}"


def home_cluster() -> str:
    """The django-q2 cluster a queue that names none is served by: where wake-ups go by
    default. Not django-q2's ``Conf.CLUSTER_NAME``, which ``Q_CLUSTER_NAME`` changes in a named
    cluster's processes: the cluster named in the settings, else the site's (``Q_CLUSTER``'s
    ``name``)."""
    from django_q.conf import Conf

    routed = tombstone_settings.Q_OPTIONS.get("cluster")
    if routed:
        return str(routed)
    named = (getattr(settings, "Q_CLUSTER", None) or {}).get("cluster_name")
    return str(named or Conf.PREFIX)


def cluster_of(queue: str) -> str:
    """The django-q2 cluster whose workers run ``queue``'s jobs (its wake-ups go there)."""
    return tombstone_settings.QUEUES.get(queue) or home_cluster()


def clusters() -> list[str]:
    """The django-q2 clusters that serve a queue, by name."""
    return sorted({cluster_of(queue) for queue in known()})


def own_cluster() -> str:
    """The cluster this process's pump serves: the one it runs in, in a cluster's worker, else
    the home cluster (a test, a command, sync mode)."""
    if not in_cluster_worker():
        return home_cluster()
    from django_q.conf import Conf

    return str(Conf.CLUSTER_NAME)


def served() -> tuple[str, ...]:
    """The queues this process's pumps claim from: those of its own cluster; every queue
    outside a cluster's worker (a test, a command, sync mode)."""
    if not in_cluster_worker():
        return known()
    return _served_by(own_cluster())


@cache
def _served_by(cluster: str) -> tuple[str, ...]:
    found = tuple(queue for queue in known() if cluster_of(queue) == cluster)
    if not found:
        logger.warning(
            "this django-q2 cluster (%r) serves no queue of tombstones: the queues go to %s",
            cluster,
            ", ".join(sorted({cluster_of(queue) for queue in known()})),
        )
    return found


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting in ("TOMBSTONES_QUEUES", "TASKS", "TOMBSTONES_Q_OPTIONS", "Q_CLUSTER"):
        known.cache_clear()
        _served_by.cache_clear()
