"""System checks of the settings and of django-q2 (its broker, its timing) and SQLite's mode:
``tombstones.E01x``/``E02x`` errors, the retention's ``E04x`` and ``W0xx`` warnings (``W011``: a
``TOMBSTONES_*`` setting the library does not know). The
records' own are in :mod:`tombstones.records.checks`."""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import checks

from ..conf import tombstone_settings


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    problems = tombstone_settings.validate()
    errors: list[checks.CheckMessage] = [
        checks.Error(message, id="tombstones.E011") for message in problems
    ]
    if not problems and tombstone_settings.RETENTION <= tombstone_settings.JOB_MAX_AGE:
        errors.append(
            checks.Error(
                "TOMBSTONES_RETENTION must be longer than TOMBSTONES_JOB_MAX_AGE.",
                hint="Otherwise a tombstone can be purged while a job that needs it still waits.",
                id="tombstones.E010",
            )
        )
    if not problems:
        errors += _retention_errors()
    return errors + _unknown_settings()


def _unknown_settings() -> list[checks.CheckMessage]:
    warnings: list[checks.CheckMessage] = []
    for name, nearest in tombstone_settings.unknown():
        hint = f"Did you mean {nearest}?" if nearest else "See docs/settings.md for the settings."
        warnings.append(
            checks.Warning(
                f"{name} is not a django-tombstone-guard setting; it has no effect.",
                hint=hint,
                id="tombstones.W011",
            )
        )
    return warnings


# The dashboard's "finished in the last hour" counts the ledger's rows.
JOB_RETENTION_AT_LEAST = timedelta(hours=1)


def _retention_errors() -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    audit, tombstones = tombstone_settings.AUDIT_RETENTION, tombstone_settings.RETENTION
    if audit < tombstones:
        errors.append(
            checks.Error(
                f"TOMBSTONES_AUDIT_RETENTION ({audit}) must not be shorter than "
                f"TOMBSTONES_RETENTION ({tombstones}).",
                hint="A tombstone's rejections must outlive it: purge_jobs would remove the "
                "audit trail of records whose tombstones are still kept.",
                id="tombstones.E040",
            )
        )
    jobs = tombstone_settings.JOB_RETENTION
    if jobs < JOB_RETENTION_AT_LEAST:
        errors.append(
            checks.Error(
                f"TOMBSTONES_JOB_RETENTION ({jobs}) must be at least one hour.",
                hint="The dashboard counts the jobs finished in the last hour from the ledger.",
                id="tombstones.E041",
            )
        )
    return errors


def check_sqlite(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    warnings: list[checks.CheckMessage] = []
    for alias, conf in settings.DATABASES.items():
        if "sqlite3" not in conf.get("ENGINE", ""):
            continue
        mode = str(conf.get("OPTIONS", {}).get("transaction_mode", "")).upper()
        if mode != "IMMEDIATE":
            warnings.append(
                checks.Warning(
                    f"Database {alias!r} is SQLite without transaction_mode='IMMEDIATE'.",
                    hint="Worker processes will hit 'database is locked'. Set "
                    "OPTIONS={'transaction_mode': 'IMMEDIATE', 'timeout': 20}.",
                    id="tombstones.W001",
                )
            )
    if any("sqlite3" in conf.get("ENGINE", "") for conf in settings.DATABASES.values()):
        import sqlite3

        if sqlite3.sqlite_version_info < MIN_SQLITE:
            warnings.append(
                checks.Error(
                    f"SQLite {sqlite3.sqlite_version} is too old for the job engine.",
                    hint="Its claim is one UPDATE ... RETURNING with a materialized WITH: "
                    "SQLite 3.35 or later (Python's sqlite3 module links it).",
                    id="tombstones.E006",
                )
            )
    return warnings


# The claim's statement (UPDATE ... RETURNING, WITH ... AS MATERIALIZED) needs SQLite 3.35.
MIN_SQLITE = (3, 35, 0)

# A working configuration to copy: the ORM broker needs nothing but the database. django-q2's
# timeout stays below TOMBSTONES_LEASE (60 s) and its retry above its timeout.
ORM_EXAMPLE = (
    'Q_CLUSTER = {"name": "mysite", "orm": "default", "timeout": 30, "retry": 60} '
    "(the ORM broker keeps its queue in the database)"
)
REDIS_INSTALL = 'pip install "django-tombstone-guard[redis]"'
# What to install when a broker's module cannot be imported.
INSTALL_HINTS = {
    "redis": REDIS_INSTALL,
    "django_redis": "pip install django-redis",
    "boto3": "pip install boto3",
    "pymongo": "pip install pymongo",
    "bson": "pip install pymongo",  # pymongo's bson package, imported first
    "iron_mq": "pip install iron-mq",
}
# django-q2's module for each broker: importing it imports the client package it needs.
BROKER_MODULES = {
    "IronMQ": "django_q.brokers.ironmq",
    "SQS": "django_q.brokers.aws_sqs",
    "MongoDB": "django_q.brokers.mongo",
    "Redis": "django_q.brokers.redis_broker",
}


def _missing_module(path: str) -> str | None:
    """The module that stops ``path`` from importing, or None when it imports."""
    try:
        importlib.import_module(path)
    except ImportError as exc:
        return exc.name or path
    return None


def _broker(conf: dict[str, Any]) -> str:
    """The broker django-q2 picks, in its own order (``django_q.brokers.get_broker``)."""
    for name, key in (("custom", "broker_class"), ("IronMQ", "iron_mq")):
        if conf.get(key):
            return name
    if isinstance(conf.get("sqs"), dict):
        return "SQS"
    for name, key in (("ORM", "orm"), ("MongoDB", "mongo")):
        if conf.get(key):
            return name
    return "Redis"


def _unimportable(broker: str, conf: dict[str, Any]) -> str | None:
    """What the broker needs and cannot import (a module name or a dotted path), or None."""
    if broker == "custom":
        path = str(conf["broker_class"])
        module, _, attr = path.rpartition(".")
        missing = _missing_module(module) if module else path
        if missing is None and not hasattr(importlib.import_module(module), attr):
            return path
        return missing
    missing = _missing_module(BROKER_MODULES[broker])
    if missing is None and broker == "Redis" and conf.get("django_redis"):
        # Without django-redis, django-q2 silently uses Q_CLUSTER['redis'] (or localhost).
        missing = _missing_module("django_redis")
    return missing


def check_django_q(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """django-q2 carries the wake-ups: without a broker it can use, no job ever runs.

    Reads settings.Q_CLUSTER, not django_q.conf.Conf (a copy taken at import).
    """
    conf = getattr(settings, "Q_CLUSTER", None)
    if conf is None:
        missing = _missing_module(BROKER_MODULES["Redis"])
        consequence = (
            f"and {missing!r} cannot be imported, so no job can run"
            if missing
            else "so jobs run only if a Redis server listens there"
        )
        message = (
            f"Q_CLUSTER is not set: django-q2 falls back to Redis on localhost, {consequence}."
        )
        hint = f"Add {ORM_EXAMPLE}, or {REDIS_INSTALL} and set Q_CLUSTER['redis']."
        if missing:
            return [checks.Error(message, hint=hint, id="tombstones.E020")]
        return [checks.Warning(message, hint=hint, id="tombstones.W020")]
    if not isinstance(conf, dict):
        return [
            checks.Error(
                f"Q_CLUSTER must be a dict, not {type(conf).__name__}.",
                hint=f"For example {ORM_EXAMPLE}.",
                id="tombstones.E022",
            )
        ]
    broker = _broker(conf)
    if broker == "ORM":
        alias = conf["orm"]
        if isinstance(alias, str) and alias in settings.DATABASES:
            return []
        return [
            checks.Error(
                f"Q_CLUSTER['orm'] names the database {alias!r}, which is not in DATABASES.",
                hint=f"Name one of {', '.join(map(repr, settings.DATABASES))}, "
                'e.g. "orm": "default".',
                id="tombstones.E021",
            )
        ]
    missing = _unimportable(broker, conf)
    if missing is None:
        return []
    install = INSTALL_HINTS.get(missing, f"Install what provides {missing!r}")
    return [
        checks.Error(
            f"Q_CLUSTER selects django-q2's {broker} broker, but {missing!r} cannot be imported, "
            "so no job can run.",
            hint=f"{install}, or use the ORM broker: {ORM_EXAMPLE}.",
            id="tombstones.E020",
        )
    ]


# django-q2's own default when Q_CLUSTER has no "retry".
Q_DEFAULT_RETRY = 60


def _seconds(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def check_django_q_timing(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """django-q2's task timeout below the lease, its retry above the timeout.

    A wake-up killed by the timeout charges the job it was running with a crash; a worker that
    outlives the lease has its jobs taken over; an ORM-broker message redelivered (``retry``)
    while its task still runs starts a second pump for nothing.
    """
    conf = getattr(settings, "Q_CLUSTER", None)
    if not isinstance(conf, dict) or tombstone_settings.validate():
        return []
    timeout = _seconds(conf.get("timeout"))
    if timeout is None:
        return []
    errors: list[checks.CheckMessage] = []
    lease = tombstone_settings.LEASE.total_seconds()
    if timeout >= lease:
        errors.append(
            checks.Error(
                f"Q_CLUSTER['timeout'] ({timeout:g} s) must be shorter than TOMBSTONES_LEASE "
                f"({lease:g} s).",
                hint="Lower the timeout or raise the lease. A wake-up starts no job after half of "
                "the timeout, so a handler must finish within half of it.",
                id="tombstones.E023",
            )
        )
    retry = _seconds(conf.get("retry", Q_DEFAULT_RETRY))
    if retry is not None and retry <= timeout:
        errors.append(
            checks.Error(
                f"Q_CLUSTER['retry'] ({retry:g} s) must be longer than Q_CLUSTER['timeout'] "
                f"({timeout:g} s).",
                hint="django-q2 redelivers a message after 'retry' seconds: a task still running "
                "would get a twin.",
                id="tombstones.E024",
            )
        )
    return errors


def register() -> None:
    checks.register(check_settings)
    checks.register(check_sqlite, checks.Tags.database)
    checks.register(check_django_q)
    checks.register(check_django_q_timing)
