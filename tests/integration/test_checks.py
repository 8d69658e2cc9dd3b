"""System checks: TombstoneMeta (E001-E005), settings (E010, E011), retention (E040, E041),
SQLite mode (W001) and django-q2's broker (E020-E022, W020) and its timing (E023, E024)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.apps.registry import Apps
from django.conf import settings
from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import models
from django.test.utils import isolate_apps, override_settings
from django.utils import timezone

import tombstones
from tests.factories import CustomerFactory
from tests.jobkit import run, temp_handler
from tombstones import worker
from tombstones.conf import tombstone_settings
from tombstones.exceptions import TransientError
from tombstones.jobs.checks import (
    check_django_q,
    check_django_q_timing,
    check_settings,
    check_sqlite,
)
from tombstones.models import Job, TombstoneModel
from tombstones.records.checks import check_tombstone_meta

APP = "integration"


@pytest.fixture
def registry() -> Iterator[Apps]:
    """An isolated app registry: throwaway models never reach the project's."""
    with isolate_apps("tests.integration") as apps:
        yield apps


def run_meta_checks(registry: Apps) -> list[checks.CheckMessage]:
    return check_tombstone_meta(app_configs=[registry.get_app_config(APP)])


def ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [m.id for m in messages if m.id is not None]


def make_model(
    name: str,
    fields: dict[str, Any],
    *,
    business_key: str | None = "code",
    personal: tuple[str, ...] = (),
    constraints: list[Any] | None = None,
) -> type[TombstoneModel]:
    meta = type("Meta", (), {"app_label": APP, "constraints": constraints or []})
    tmeta = type("TombstoneMeta", (), {"business_key": business_key, "personal_fields": personal})
    attrs = {"__module__": __name__, "Meta": meta, "TombstoneMeta": tmeta, **fields}
    return type(name, (TombstoneModel,), attrs)


def code_field() -> models.CharField[Any, Any]:
    return models.CharField(max_length=20, unique=True)


# --- TombstoneMeta ---------------------------------------------------------------------------


def test_check_tombstone_meta__project_models_are_clean() -> None:
    assert check_tombstone_meta(app_configs=None) == []


def test_check_tombstone_meta__valid_model_is_clean(registry: Apps) -> None:
    model = make_model(
        "Good",
        {
            "code": code_field(),
            "name": models.CharField(max_length=20),
            "age": models.IntegerField(null=True),
            "email": models.EmailField(unique=True, null=True),
        },
        personal=("name", "age", "email"),
    )

    assert run_meta_checks(registry) == []
    assert registry.get_model(APP, "Good") is model


def test_check_tombstone_meta__only_the_apps_asked_for(registry: Apps) -> None:
    make_model("Broken", {"code": models.CharField(max_length=20)})

    assert ids(run_meta_checks(registry)) == ["tombstones.E002"]
    assert check_tombstone_meta(app_configs=[]) == []


def test_check_tombstone_meta__missing_business_key_field_is_e001(registry: Apps) -> None:
    model = make_model("NoKey", {"code": code_field()}, business_key="reference")

    messages = run_meta_checks(registry)

    assert ids(messages) == ["tombstones.E001"]
    assert messages[0].obj is model
    assert "'reference'" in messages[0].msg
    assert isinstance(messages[0], checks.Error)


def test_check_tombstone_meta__reverse_relation_business_key_is_e001(registry: Apps) -> None:
    parent = make_model("Parent", {"code": code_field()}, business_key="children")
    make_model(
        "Child",
        {
            "code": code_field(),
            "parent": models.ForeignKey(parent, on_delete=models.CASCADE, related_name="children"),
        },
    )

    messages = run_meta_checks(registry)

    assert ids(messages) == ["tombstones.E001"]
    assert messages[0].obj is parent


def test_check_tombstone_meta__missing_personal_field_is_e001(registry: Apps) -> None:
    make_model("NoPersonal", {"code": code_field()}, personal=("nickname",))

    messages = run_meta_checks(registry)

    assert ids(messages) == ["tombstones.E001"]
    assert "'nickname'" in messages[0].msg


def test_check_tombstone_meta__non_unique_business_key_is_e002(registry: Apps) -> None:
    model = make_model("Loose", {"code": models.CharField(max_length=20)})

    messages = run_meta_checks(registry)

    assert ids(messages) == ["tombstones.E002"]
    assert messages[0].obj is model


def test_check_tombstone_meta__unique_constraint_counts_as_unique(registry: Apps) -> None:
    make_model(
        "Constrained",
        {"code": models.CharField(max_length=20)},
        constraints=[models.UniqueConstraint(fields=["code"], name="constrained_code")],
    )

    assert run_meta_checks(registry) == []


def test_check_tombstone_meta__conditional_unique_constraint_is_e002(registry: Apps) -> None:
    # Unique among live rows only: a tombstone and a live row could share the key.
    make_model(
        "LiveUnique",
        {"code": models.CharField(max_length=20)},
        constraints=[
            models.UniqueConstraint(
                fields=["code"],
                condition=models.Q(deleted_at__isnull=True),
                name="live_unique_code",
            )
        ],
    )

    assert ids(run_meta_checks(registry)) == ["tombstones.E002"]


@pytest.mark.parametrize(
    "field_factory",
    [
        lambda: models.IntegerField(),
        lambda: models.DateTimeField(),
        lambda: models.BooleanField(default=False),
    ],
)
def test_check_tombstone_meta__personal_field_not_erasable_is_e003(
    registry: Apps, field_factory: Callable[[], models.Field[Any, Any]]
) -> None:
    make_model("Stuck", {"code": code_field(), "secret": field_factory()}, personal=("secret",))

    messages = run_meta_checks(registry)

    assert ids(messages) == ["tombstones.E003"]
    assert "secret" in messages[0].msg


def test_check_tombstone_meta__primary_key_personal_field_is_e003(registry: Apps) -> None:
    make_model("PkPersonal", {"code": code_field()}, personal=("id",))

    assert ids(run_meta_checks(registry)) == ["tombstones.E003"]


def test_check_tombstone_meta__generic_foreign_key_personal_is_e003(registry: Apps) -> None:
    make_model(
        "Generic",
        {
            "code": code_field(),
            "content_type": models.ForeignKey(ContentType, null=True, on_delete=models.CASCADE),
            "object_id": models.PositiveIntegerField(null=True),
            "target": GenericForeignKey("content_type", "object_id"),
        },
        personal=("target",),
    )

    assert ids(run_meta_checks(registry)) == ["tombstones.E003"]


def test_check_tombstone_meta__business_key_also_personal_is_e004(registry: Apps) -> None:
    make_model("KeyPersonal", {"code": code_field()}, personal=("code",))

    assert "tombstones.E004" in ids(run_meta_checks(registry))


def test_check_tombstone_meta__unique_non_null_personal_is_e005(registry: Apps) -> None:
    make_model(
        "UniquePersonal",
        {"code": code_field(), "email": models.EmailField(unique=True)},
        personal=("email",),
    )

    assert ids(run_meta_checks(registry)) == ["tombstones.E005"]


def test_check_tombstone_meta__plain_models_are_ignored(registry: Apps) -> None:
    type(
        "Plain",
        (models.Model,),
        {"__module__": __name__, "Meta": type("Meta", (), {"app_label": APP})},
    )

    assert run_meta_checks(registry) == []


def test_checks__records_and_jobs_checks_are_registered_once_by_ready() -> None:
    ours = [
        c for c in checks.registry.registry.get_checks() if c.__module__.startswith("tombstones")
    ]

    assert sorted(c.__name__ for c in ours) == [
        "check_django_q",
        "check_django_q_timing",
        "check_settings",
        "check_sqlite",
        "check_tombstone_meta",
    ]
    assert check_tombstone_meta.tags == (checks.Tags.models,)  # type: ignore[attr-defined]


# --- settings --------------------------------------------------------------------------------


def test_check_settings__defaults_are_clean() -> None:
    assert check_settings() == []


@pytest.mark.parametrize(
    ("retention", "max_age"),
    [(timedelta(days=1), timedelta(days=7)), (timedelta(days=7), timedelta(days=7))],
)
def test_check_settings__retention_not_longer_than_job_max_age_is_e010(
    retention: timedelta, max_age: timedelta
) -> None:
    with override_settings(TOMBSTONES_RETENTION=retention, TOMBSTONES_JOB_MAX_AGE=max_age):
        messages = check_settings()

    assert ids(messages) == ["tombstones.E010"]
    assert "TOMBSTONES_RETENTION" in messages[0].msg


def test_check_settings__retention_longer_by_a_second_is_clean() -> None:
    with override_settings(TOMBSTONES_RETENTION=7 * 86400 + 1, TOMBSTONES_JOB_MAX_AGE=7 * 86400):
        assert check_settings() == []


@pytest.mark.parametrize(
    ("name", "nearest"),
    [
        ("TOMBSTONES_LEASES", "TOMBSTONES_LEASE"),
        ("TOMBSTONES_MAX_ATEMPTS", "TOMBSTONES_MAX_ATTEMPTS"),
        ("TOMBSTONES_RETENTON", "TOMBSTONES_RETENTION"),
        ("TOMBSTONES_COLOUR_SCHEME", None),
    ],
)
def test_check_settings__unknown_setting_is_w011_naming_the_nearest(
    name: str, nearest: str | None
) -> None:
    with override_settings(**{name: 1}):
        messages = check_settings()

    assert ids(messages) == ["tombstones.W011"]
    assert isinstance(messages[0], checks.Warning)
    assert name in messages[0].msg
    if nearest:
        assert messages[0].hint == f"Did you mean {nearest}?"
    else:
        assert "TOMBSTONES_" not in (messages[0].hint or "")


@pytest.mark.parametrize(
    ("name", "value"),
    [("LEASE", "soon"), ("MAX_ATTEMPTS", 0), ("Q_OPTIONS", "sync"), ("RETENTION", -1)],
)
def test_check_settings__malformed_setting_is_e011_and_raises_on_use(name: str, value: Any) -> None:
    with override_settings(**{f"TOMBSTONES_{name}": value}):
        messages = check_settings()
        with pytest.raises(ImproperlyConfigured, match=f"TOMBSTONES_{name}"):
            getattr(tombstone_settings, name)

    assert ids(messages) == ["tombstones.E011"]
    assert f"TOMBSTONES_{name}" in messages[0].msg


@pytest.mark.parametrize(
    ("audit", "tombstones", "expected"),
    [
        (timedelta(days=29), timedelta(days=30), ["tombstones.E040"]),
        (timedelta(days=30), timedelta(days=30), []),
        (timedelta(days=365), timedelta(days=30), []),
    ],
)
def test_check_settings__audit_retention_shorter_than_tombstones_is_e040(
    audit: timedelta, tombstones: timedelta, expected: list[str]
) -> None:
    with override_settings(TOMBSTONES_AUDIT_RETENTION=audit, TOMBSTONES_RETENTION=tombstones):
        messages = check_settings()

    assert ids(messages) == expected
    if expected:
        assert "TOMBSTONES_AUDIT_RETENTION (29 days, 0:00:00)" in messages[0].msg
        assert "rejections must outlive it" in str(messages[0].hint)


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [(3599, ["tombstones.E041"]), (3600, []), (timedelta(days=1), [])],
)
def test_check_settings__job_retention_under_an_hour_is_e041(
    jobs: Any, expected: list[str]
) -> None:
    with override_settings(TOMBSTONES_JOB_RETENTION=jobs):
        assert ids(check_settings()) == expected


@pytest.mark.parametrize("name", ["JOB_RETENTION", "AUDIT_RETENTION"])
@pytest.mark.parametrize("value", ["30 days", 0, -5, float("nan")])
def test_check_settings__a_malformed_retention_is_e011_only(name: str, value: Any) -> None:
    with override_settings(**{f"TOMBSTONES_{name}": value}):
        messages = check_settings()

    assert ids(messages) == ["tombstones.E011"]
    assert messages[0].msg.startswith(f"TOMBSTONES_{name} must be")


@pytest.mark.django_db
def test_check_settings__a_lease_no_database_timestamp_holds_fails_manage_py_check() -> None:
    # Issue 32: it passed the checks, then every pump raised "timestamp out of range".
    with (
        override_settings(TOMBSTONES_LEASE=timedelta(days=10**7)),
        pytest.raises(SystemCheckError) as failed,
    ):
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "tombstones.E011" in str(failed.value)
    assert "TOMBSTONES_LEASE must be at most 1 day" in str(failed.value)


@pytest.mark.django_db
def test_check_settings__every_duration_at_its_bound_passes_and_the_engine_runs() -> None:
    """The bounds are storable: the engine's sums with the database's clock work at each."""
    kept = timedelta(days=36500)
    at_bounds = {
        "TOMBSTONES_RETRY_BACKOFF": timedelta(days=1),
        "TOMBSTONES_RETRY_BACKOFF_MAX": timedelta(days=30),
        "TOMBSTONES_RETENTION": kept,
        "TOMBSTONES_JOB_RETENTION": kept,
        "TOMBSTONES_AUDIT_RETENTION": kept,
        "TOMBSTONES_JOB_MAX_AGE": kept - timedelta(days=1),  # below RETENTION (E010)
        "TOMBSTONES_LEASE": timedelta(days=1),
        "TOMBSTONES_SWEEP_MINUTES": 1440,
    }

    def flaky(ctx: Any) -> None:
        raise TransientError

    with override_settings(**at_bounds), temp_handler("t.flaky", flaky):
        assert check_settings() == []
        customer = CustomerFactory()
        later = timezone.now() + timedelta(days=36000)
        waiting = tombstones.enqueue("t.flaky", customer, run_after=later)
        job = run(tombstones.enqueue("t.flaky", CustomerFactory()))
        assert job.status == Job.Status.RETRY_WAIT
        assert job.run_after is not None
        assert job.run_after - timezone.now() > timedelta(hours=23)
        worker.run_sweep()
        worker.run_purge()
        call_command("purge_tombstones", "--noinput", stdout=StringIO())
        customer.delete()
        waiting.refresh_from_db()
        assert waiting.status == Job.Status.QUEUED


@pytest.mark.django_db  # Django 6.1's own checks may touch the database
def test_check_settings__registered_with_django() -> None:
    with override_settings(TOMBSTONES_RETENTION=timedelta(days=1)):
        found = ids(checks.run_checks())

    assert "tombstones.E010" in found


# --- SQLite ----------------------------------------------------------------------------------


def databases_with(options: dict[str, Any]) -> dict[str, Any]:
    databases = copy.deepcopy(settings.DATABASES)
    databases["extra"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:", **options}
    return databases


def run_sqlite_check(databases: dict[str, Any]) -> list[checks.CheckMessage]:
    # Overriding DATABASES warns by design; the check only reads the setting.
    with (
        pytest.warns(UserWarning, match="DATABASES"),
        override_settings(DATABASES=databases),
    ):
        return check_sqlite()


@pytest.mark.parametrize(
    "options",
    [{}, {"OPTIONS": {}}, {"OPTIONS": {"transaction_mode": "DEFERRED"}}],
)
def test_check_sqlite__without_immediate_is_w001(options: dict[str, Any]) -> None:
    messages = run_sqlite_check(databases_with(options))

    extra = [m for m in messages if "'extra'" in m.msg]
    assert ids(extra) == ["tombstones.W001"]
    assert isinstance(extra[0], checks.Warning)


@pytest.mark.parametrize("mode", ["IMMEDIATE", "immediate"])
def test_check_sqlite__immediate_is_clean(mode: str) -> None:
    messages = run_sqlite_check(databases_with({"OPTIONS": {"transaction_mode": mode}}))

    assert [m for m in messages if "'extra'" in m.msg] == []


def test_check_sqlite__project_settings_are_clean() -> None:
    assert check_sqlite() == []


def test_check_sqlite__postgres_is_ignored() -> None:
    databases = copy.deepcopy(settings.DATABASES)
    databases["pg"] = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}

    assert [m for m in run_sqlite_check(databases) if "'pg'" in m.msg] == []


# --- django-q2 broker ------------------------------------------------------------------------


@pytest.fixture
def without_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import redis`` fail as it does where the package is not installed."""
    monkeypatch.setitem(sys.modules, "redis", None)  # None in sys.modules: ImportError
    monkeypatch.delitem(sys.modules, "django_q.brokers.redis_broker", raising=False)


def test_check_django_q__project_settings_are_clean() -> None:
    assert check_django_q() == []


def test_check_django_q__no_q_cluster_without_redis_is_e020(
    settings: Any, without_redis: None
) -> None:
    del settings.Q_CLUSTER

    messages = check_django_q()

    assert ids(messages) == ["tombstones.E020"]
    assert isinstance(messages[0], checks.Error)
    assert "Q_CLUSTER is not set" in messages[0].msg
    assert "'redis'" in messages[0].msg
    assert '"orm": "default"' in (messages[0].hint or "")


def test_check_django_q__no_q_cluster_with_redis_is_w020(settings: Any) -> None:
    del settings.Q_CLUSTER

    messages = check_django_q()

    assert ids(messages) == ["tombstones.W020"]
    assert isinstance(messages[0], checks.Warning)
    assert "localhost" in messages[0].msg


def test_check_django_q__redis_broker_without_redis_is_e020(
    settings: Any, without_redis: None
) -> None:
    settings.Q_CLUSTER = {"name": "site", "redis": "redis://127.0.0.1:6379/0"}

    messages = check_django_q()

    assert ids(messages) == ["tombstones.E020"]
    assert "Redis broker" in messages[0].msg
    assert "'redis' cannot be imported" in messages[0].msg
    assert 'pip install "django-tombstone-guard[redis]"' in (messages[0].hint or "")


def test_check_django_q__redis_broker_with_redis_is_clean(settings: Any) -> None:
    settings.Q_CLUSTER = {"name": "site", "redis": "redis://127.0.0.1:6379/0"}

    assert check_django_q() == []


def test_check_django_q__orm_alias_not_in_databases_is_e021(settings: Any) -> None:
    settings.Q_CLUSTER = {"name": "site", "orm": "queue"}

    messages = check_django_q()

    assert ids(messages) == ["tombstones.E021"]
    assert "'queue'" in messages[0].msg
    assert "'default'" in (messages[0].hint or "")


def test_check_django_q__orm_broker_wins_over_a_missing_redis(
    settings: Any, without_redis: None
) -> None:
    # django-q2 picks the ORM broker before Redis: a leftover "redis" key is not used.
    settings.Q_CLUSTER = {"name": "site", "orm": "default", "redis": {"host": "x"}}

    assert check_django_q() == []


@pytest.mark.parametrize("value", ["orm", ["orm", "default"]])
def test_check_django_q__q_cluster_not_a_dict_is_e022(settings: Any, value: Any) -> None:
    settings.Q_CLUSTER = value

    assert ids(check_django_q()) == ["tombstones.E022"]


@pytest.mark.parametrize(
    ("conf", "missing", "install"),
    [
        ({"sqs": {"aws_region": "eu-west-1"}}, "'boto3'", "pip install boto3"),
        ({"mongo": {"host": "127.0.0.1"}}, "'bson'", "pip install pymongo"),
        ({"redis": {}, "django_redis": "default"}, "'django_redis'", "pip install django-redis"),
        ({"broker_class": "no_such_package.Broker"}, "'no_such_package'", "Install what"),
        (
            {"broker_class": "django_q.brokers.orm.NoSuchBroker"},
            "'django_q.brokers.orm.NoSuchBroker'",
            "Install what",
        ),
    ],
)
def test_check_django_q__broker_that_cannot_be_imported_is_e020(
    settings: Any, conf: dict[str, Any], missing: str, install: str
) -> None:
    settings.Q_CLUSTER = {"name": "site", **conf}

    messages = check_django_q()

    assert ids(messages) == ["tombstones.E020"]
    assert f"{missing} cannot be imported" in messages[0].msg
    assert (messages[0].hint or "").startswith(install)


def test_check_django_q__custom_broker_class_that_imports_is_clean(settings: Any) -> None:
    settings.Q_CLUSTER = {"name": "site", "broker_class": "django_q.brokers.orm.ORM"}

    assert check_django_q() == []


@pytest.mark.django_db  # Django 6.1's own checks may touch the database
def test_check_django_q__registered_with_django(settings: Any) -> None:
    settings.Q_CLUSTER = {"name": "site", "orm": "queue"}

    assert "tombstones.E021" in ids(checks.run_checks())


# --- django-q2's timeout, retry and the lease (E023, E024) -----------------------------------


@pytest.mark.parametrize(
    ("timeout", "retry", "lease", "expected"),
    [
        (30, 60, 60, []),
        (None, 60, 60, []),  # no timeout: nothing to compare
        (60, 120, 60, ["tombstones.E023"]),  # a timeout equal to the lease
        (90, 120, 60, ["tombstones.E023"]),
        (30, 30, 60, ["tombstones.E024"]),  # a retry equal to the timeout
        (30, None, 60, []),  # django-q2's default retry (60) is above 30
        (61, None, 120, ["tombstones.E024"]),  # ... and not above 61
        (70, 50, 60, ["tombstones.E023", "tombstones.E024"]),
    ],
)
def test_django_q_timing__timeout_below_the_lease_and_retry_above_the_timeout(
    timeout: Any, retry: Any, lease: int, expected: list[str]
) -> None:
    conf: dict[str, Any] = {"name": "t", "orm": "default"}
    if timeout is not None:
        conf["timeout"] = timeout
    if retry is not None:
        conf["retry"] = retry
    with override_settings(Q_CLUSTER=conf, TOMBSTONES_LEASE=timedelta(seconds=lease)):
        assert ids(check_django_q_timing()) == expected


def test_django_q_timing__the_project_settings_pass() -> None:
    assert check_django_q_timing() == []


def test_check_sqlite__a_sqlite_older_than_the_claim_needs_is_e006(monkeypatch: Any) -> None:
    import sqlite3

    immediate = databases_with({"OPTIONS": {"transaction_mode": "IMMEDIATE"}})
    assert "tombstones.E006" not in ids(run_sqlite_check(immediate))
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.34.1")
    messages = [m for m in run_sqlite_check(immediate) if m.id == "tombstones.E006"]
    assert len(messages) == 1
    assert "3.34.1" in messages[0].msg
    assert isinstance(messages[0], checks.Error)
