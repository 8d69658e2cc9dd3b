"""Settings of the demo and test project, read from the environment (django-environ)."""

from __future__ import annotations

from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, True),
    ALLOWED_HOSTS=(list, ["127.0.0.1", "localhost"]),
    Q_WORKERS=(int, 2),
    Q_SYNC=(bool, False),
)
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env("DEBUG")
if DEBUG:
    SECRET_KEY = env("SECRET_KEY", default="dev-only-insecure-key-do-not-use-in-production")
else:
    SECRET_KEY = env("SECRET_KEY")  # required outside DEBUG
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "tombstones",
    "project.customers",
    "project.stress",
]
if django.VERSION < (6, 0):
    # Django's tasks framework on 5.2: the django-tasks backport (the [tasks] extra).
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"

# SQLite (the embedded default): WAL, IMMEDIATE transactions and a busy timeout, so the web
# process and the worker processes share one file without "database is locked".
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    # A 64 MB page cache (SQLite's default is 2 MB): the job table's indexes stay in memory as
    # the ledger grows (bench/ledger_scale.py --sqlite).
    "init_command": (
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-65536;"
    ),
}
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
# Lets several test runs share one machine without dropping each other's test database.
TEST_DB_SUFFIX = env("TEST_DB_SUFFIX", default="")
if "sqlite3" in DATABASES["default"]["ENGINE"]:
    DATABASES["default"].setdefault("OPTIONS", {}).update(SQLITE_OPTIONS)
    # A file, not :memory:, so worker processes started by tests see the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / f".test-db{TEST_DB_SUFFIX}.sqlite3")}
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}{TEST_DB_SUFFIX}"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

_MAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.filebased.EmailBackend")
_MAIL_PATH = env("EMAIL_FILE_PATH", default=str(BASE_DIR / ".mail"))
if django.VERSION >= (6, 1):
    # Django 6.1 replaced EMAIL_BACKEND/EMAIL_FILE_PATH with MAILERS.
    _filebased = _MAIL_BACKEND.endswith("filebased.EmailBackend")
    MAILERS = {
        "default": {
            "BACKEND": _MAIL_BACKEND,
            "OPTIONS": {"file_path": _MAIL_PATH} if _filebased else {},
        }
    }
else:
    EMAIL_BACKEND = _MAIL_BACKEND
    EMAIL_FILE_PATH = _MAIL_PATH

# The fake CRM the demo's sync_crm handler posts to: served by this project itself, so by
# default at the demo's own address (DEMO_ADDR, which scripts/demo.sh exports to its processes).
DEMO_ADDR = env("DEMO_ADDR", default="127.0.0.1:8000")
if ":" not in DEMO_ADDR:
    DEMO_ADDR = f"127.0.0.1:{DEMO_ADDR}"  # a bare port, as runserver takes it
CRM_URL = env("CRM_URL", default=f"http://{DEMO_ADDR}/fake-crm/contacts/")

REDIS_URL = env("REDIS_URL", default="")
Q_CLUSTER: dict[str, object] = {
    "name": env("Q_NAME", default="tombstones-demo"),
    "workers": env("Q_WORKERS"),
    "timeout": 50,  # below TOMBSTONES_LEASE (60 s): tombstones.E023
    "retry": 120,
    "ack_failures": True,
    "catch_up": False,
    "save_limit": 1000,
    "poll": 0.05,
    "sync": env("Q_SYNC"),
    "label": "Django Q2",
    # django-q2 (1.11) reads Q_CLUSTER_NAME (`Q_CLUSTER_NAME=jobs manage.py qcluster`) only when
    # this key exists: without it the import of django_q raises KeyError: 'ALT_CLUSTERS'.
    "ALT_CLUSTERS": {},
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "tombstones": {
            "handlers": ["console"],
            "level": env("TOMBSTONES_LOG_LEVEL", default="INFO"),
        },
        "django-q": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}
TOMBSTONES_RACE_FIXTURE = {"model": "customers.Customer", "handler": "customers.update_sheet_row"}

# Django's tasks framework (django.tasks; the backport on 5.2): @task functions whose arguments hold
# a record run as fenced jobs on the django-q2 cluster (project/customers/tasks.py).
TASKS = {"default": {"BACKEND": "tombstones.tasks.TombstoneBackend"}}
