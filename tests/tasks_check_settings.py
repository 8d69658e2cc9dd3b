"""The project without its own apps, with a TASKS backend its checks refuse: nothing imports a
task at startup (tests/integration/test_tasks.py runs ``manage.py check`` with it)."""

from project.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if not app.startswith("project.")]  # noqa: F405
ROOT_URLCONF = "tests.tasks_check_settings"
urlpatterns: list[object] = []
TOMBSTONES_RACE_FIXTURE: dict[str, str] = {}
TASKS = {
    "default": {
        "BACKEND": "tombstones.tasks.TombstoneBackend",
        "QUEUES": ["default", "e/mails"],  # no queue name: "/" separates a lane's queue
    }
}
