"""Settings, read lazily at call time with a ``TOMBSTONES_`` prefix.

Every setting has a documented default (see docs/settings.md). A malformed value raises
``ImproperlyConfigured`` naming the setting, at the moment it is used and in ``manage.py check``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured


def _as_timedelta(name: str, value: Any, maximum: _Bound | None = None) -> timedelta:
    # Seconds as a number are accepted because environment-driven settings are often plain ints.
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            result = timedelta(seconds=value)
        except (ValueError, OverflowError):  # NaN, infinity, beyond timedelta.max
            raise ImproperlyConfigured(
                f"TOMBSTONES_{name} must be a finite number of seconds."
            ) from None
    else:
        raise ImproperlyConfigured(
            f"TOMBSTONES_{name} must be a datetime.timedelta or a number of seconds, "
            f"not {type(value).__name__}."
        )
    if result <= timedelta(0):
        raise ImproperlyConfigured(f"TOMBSTONES_{name} must be positive.")
    if maximum is not None and result > maximum.value:
        raise ImproperlyConfigured(
            f"TOMBSTONES_{name} must be at most {maximum.text}, not {result}: {maximum.why}."
        )
    return result


def _as_int(name: str, value: Any, minimum: int, maximum: _Bound | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ImproperlyConfigured(f"TOMBSTONES_{name} must be an integer >= {minimum}.")
    if maximum is not None and value > maximum.value:
        raise ImproperlyConfigured(
            f"TOMBSTONES_{name} must be at most {maximum.text}, not {value}: {maximum.why}."
        )
    return value


def _as_float(name: str, value: Any, minimum: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < minimum:
        raise ImproperlyConfigured(f"TOMBSTONES_{name} must be a number >= {minimum}.")
    return float(value)


def _as_dict(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"TOMBSTONES_{name} must be a dict.")
    return value


# A queue's name: it is part of its lanes' keys ("queue:<name>/<key>"), so no "/".
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _as_queues(name: str, value: Any) -> dict[str, str | None]:
    found = _as_dict(name, value)
    for queue, cluster in found.items():
        if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
            raise ImproperlyConfigured(
                f"TOMBSTONES_{name}: {queue!r} is no queue name (1 to 64 letters, digits, "
                "'_', '-' or '.')."
            )
        if cluster is not None and (not isinstance(cluster, str) or not cluster):
            raise ImproperlyConfigured(
                f"TOMBSTONES_{name}[{queue!r}] must be a django-q2 cluster's name or None."
            )
    return found


# A bearer token: long enough not to be guessed, and sent as-is in an Authorization header.
TOKEN_CHARS = re.compile(r"[\x21-\x7e]{16,}")


def _as_token(name: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and TOKEN_CHARS.fullmatch(value)):
        return value
    raise ImproperlyConfigured(
        f"TOMBSTONES_{name} must be None or a string of at least 16 printable characters, "
        "without spaces (a bearer token)."
    )


@dataclass(frozen=True)
class _Bound:
    """The largest value a setting takes, as the error message names it, and why."""

    value: Any
    text: str
    why: str


@dataclass(frozen=True)
class _Setting:
    default: Any
    kind: str
    minimum: float = 0
    maximum: _Bound | None = None


# Every duration is bounded: the engine adds it to or subtracts it from the database's clock, in
# SQL (a lease's end, a retention's cut-off) and in Python (run_after's limit, a backoff), and
# a result the database cannot hold kills every pump ("timestamp out of range") while the
# checks pass. Python's datetime ends at year 9999 and PostgreSQL's timestamp bigger, SQLite's
# as Django stores it at 9999 too: 100 years either side of now fits them all with thousands of
# years to spare. Durations that time a job's next step are bounded by what they mean, far below.
_KEPT = _Bound(
    timedelta(days=36500),
    "100 years (36500 days)",
    "a retention or an age is subtracted from the database's clock",
)
_LEASE = _Bound(
    timedelta(days=1),
    "1 day",
    "a dead worker's jobs wait that long before they are taken back, and the worker renews "
    "its leases every third of one",
)
_BACKOFF = _Bound(
    timedelta(days=1), "1 day", "the first retry's delay; the cap is TOMBSTONES_RETRY_BACKOFF_MAX"
)
_BACKOFF_MAX = _Bound(
    timedelta(days=30), "30 days", "a job waiting for its retry holds its lane all that time"
)
_SWEEP = _Bound(1440, "1440 (one day)", "the sweep takes back lapsed leases and lost wake-ups")

_SETTINGS: dict[str, _Setting] = {
    # How many times a job re-reads its record after a version conflict before backing off.
    "STALE_REREADS": _Setting(3, "int", 0),
    # Attempts (first run included) before a temporarily failing job ends failed.
    "MAX_ATTEMPTS": _Setting(5, "int", 1),
    # Base delay of the exponential retry backoff, and its cap.
    "RETRY_BACKOFF": _Setting(timedelta(seconds=2), "timedelta", maximum=_BACKOFF),
    "RETRY_BACKOFF_MAX": _Setting(timedelta(minutes=10), "timedelta", maximum=_BACKOFF_MAX),
    # How long a tombstone is kept before purge_tombstones may remove it.
    "RETENTION": _Setting(timedelta(days=30), "timedelta", maximum=_KEPT),
    # How long purge_jobs keeps finished jobs (succeeded, cancelled, expired) and their events,
    # and the audit trail (rejected, failed, uncertain, superseded, escalated) with its events.
    "JOB_RETENTION": _Setting(timedelta(days=30), "timedelta", maximum=_KEPT),
    "AUDIT_RETENTION": _Setting(timedelta(days=365), "timedelta", maximum=_KEPT),
    # A job that waited longer than this is expired without running.
    "JOB_MAX_AGE": _Setting(timedelta(days=7), "timedelta", maximum=_KEPT),
    # How long a claimed job is leased to its worker before the sweep may take it back.
    "LEASE": _Setting(timedelta(seconds=60), "timedelta", maximum=_LEASE),
    # Interval of the periodic sweep, in minutes (a django-q2 schedule).
    "SWEEP_MINUTES": _Setting(1, "int", 1, maximum=_SWEEP),
    # Lane heads a worker claims at once (1: one job per claim), and the most jobs one wake-up
    # runs before it hands the rest to another message. 50: a quick claim fills one group
    # (engine.group.GROUP_JOBS); a claim's fixed statements are shared by that many jobs.
    "BATCH_SIZE": _Setting(50, "int", 1),
    "WAKE_BUDGET": _Setting(500, "int", 1),
    # Extra options passed to django_q.tasks.async_task (e.g. {"cluster": "jobs"}).
    "Q_OPTIONS": _Setting({}, "dict"),
    # Named queues beside "default", each with the django-q2 cluster that serves it (None: the
    # cluster the wake-ups go to, TOMBSTONES_Q_OPTIONS["cluster"] or Q_CLUSTER's name). The
    # queues of a TombstoneBackend's QUEUES are known too, served by that cluster.
    "QUEUES": _Setting({}, "queues"),
    # Largest accepted job params, in bytes of their compact UTF-8 JSON: ids and options fit.
    "PARAMS_MAX_BYTES": _Setting(65536, "int", 2),
    # Defaults of `manage.py racefixture`: {"model": "app.Model", "handler": "name"}.
    "RACE_FIXTURE": _Setting({}, "dict"),
    # Whether the worker log of a failed handler carries the exception's message and the
    # frames' locals (they may hold personal data); None: as DEBUG. The class and the frames'
    # file, line and function are always logged.
    "LOG_ERROR_DETAILS": _Setting(None, "optional_bool"),
    # A bearer token that reads the metrics page (tombstones:metrics) without a login: for
    # Prometheus. None: only users with the view_metrics permission read it.
    "METRICS_TOKEN": _Setting(None, "token"),
}


class TombstoneSettings:
    """Typed, lazy access to the ``TOMBSTONES_*`` settings."""

    def _get(self, name: str) -> Any:
        spec = _SETTINGS[name]
        value = getattr(django_settings, f"TOMBSTONES_{name}", spec.default)
        if spec.kind == "timedelta":
            return _as_timedelta(name, value, spec.maximum)
        if spec.kind == "int":
            return _as_int(name, value, int(spec.minimum), spec.maximum)
        if spec.kind in ("bool", "optional_bool"):
            if value is None and spec.kind == "optional_bool":
                return None
            if not isinstance(value, bool):
                allowed = "True, False or None" if spec.kind == "optional_bool" else "True or False"
                raise ImproperlyConfigured(f"TOMBSTONES_{name} must be {allowed}.")
            return value
        if spec.kind == "float":
            return _as_float(name, value, spec.minimum)
        if spec.kind == "queues":
            return _as_queues(name, value)
        if spec.kind == "token":
            return _as_token(name, value)
        return _as_dict(name, value)

    @property
    def STALE_REREADS(self) -> int:
        return int(self._get("STALE_REREADS"))

    @property
    def MAX_ATTEMPTS(self) -> int:
        return int(self._get("MAX_ATTEMPTS"))

    @property
    def RETRY_BACKOFF(self) -> timedelta:
        return self._get("RETRY_BACKOFF")

    @property
    def RETRY_BACKOFF_MAX(self) -> timedelta:
        return self._get("RETRY_BACKOFF_MAX")

    @property
    def RETENTION(self) -> timedelta:
        return self._get("RETENTION")

    @property
    def JOB_RETENTION(self) -> timedelta:
        return self._get("JOB_RETENTION")

    @property
    def AUDIT_RETENTION(self) -> timedelta:
        return self._get("AUDIT_RETENTION")

    @property
    def JOB_MAX_AGE(self) -> timedelta:
        return self._get("JOB_MAX_AGE")

    @property
    def LEASE(self) -> timedelta:
        return self._get("LEASE")

    @property
    def SWEEP_MINUTES(self) -> int:
        return int(self._get("SWEEP_MINUTES"))

    @property
    def BATCH_SIZE(self) -> int:
        return int(self._get("BATCH_SIZE"))

    @property
    def WAKE_BUDGET(self) -> int:
        return int(self._get("WAKE_BUDGET"))

    @property
    def Q_OPTIONS(self) -> dict[str, Any]:
        return dict(self._get("Q_OPTIONS"))

    @property
    def QUEUES(self) -> dict[str, str | None]:
        return dict(self._get("QUEUES"))

    @property
    def PARAMS_MAX_BYTES(self) -> int:
        return int(self._get("PARAMS_MAX_BYTES"))

    @property
    def RACE_FIXTURE(self) -> dict[str, Any]:
        return dict(self._get("RACE_FIXTURE"))

    @property
    def LOG_ERROR_DETAILS(self) -> bool | None:
        value = self._get("LOG_ERROR_DETAILS")
        return None if value is None else bool(value)

    @property
    def METRICS_TOKEN(self) -> str | None:
        value: str | None = self._get("METRICS_TOKEN")
        return value

    def validate(self) -> list[str]:
        """Return one message per malformed setting (used by the system checks)."""
        errors = []
        for name in _SETTINGS:
            try:
                self._get(name)
            except ImproperlyConfigured as exc:
                errors.append(str(exc))
        return errors

    def unknown(self) -> list[tuple[str, str | None]]:
        """The project's ``TOMBSTONES_*`` settings this library does not read, each with the
        nearest real name (or None): a misspelled name would otherwise be silently ignored."""
        found: list[tuple[str, str | None]] = []
        for name in dir(django_settings):
            suffix = name.removeprefix("TOMBSTONES_")
            if suffix != name and suffix not in _SETTINGS:
                # Compared without the prefix, which every name shares.
                nearest = difflib.get_close_matches(suffix, _SETTINGS, n=1, cutoff=0.6)
                found.append((name, f"TOMBSTONES_{nearest[0]}" if nearest else None))
        return sorted(found)

    def backoff(self, attempts: int) -> timedelta:
        """Delay before attempt ``attempts + 1``: base * 2**(attempts-1), capped."""
        base, cap = self.RETRY_BACKOFF, self.RETRY_BACKOFF_MAX
        doublings = max(attempts - 1, 0)
        # Once 2**doublings passes cap/base the delay is the cap: stop doubling there, before a
        # timedelta overflows (TOMBSTONES_MAX_ATTEMPTS has no upper bound).
        if doublings >= (cap // base).bit_length():
            return cap
        return min(base * 2**doublings, cap)

    def unknown_handler_wait(self, age_seconds: float) -> timedelta:
        """How long a job whose handler this worker lacks waits before a worker looks again:
        a tenth of its age, between the retry backoff's base and its cap (a deploy takes
        seconds to minutes; a handler gone for good is looked for ever more seldom)."""
        wait = timedelta(seconds=age_seconds / 10)
        return min(max(wait, self.RETRY_BACKOFF), self.RETRY_BACKOFF_MAX)


tombstone_settings = TombstoneSettings()
