"""Users of the audit admin, shared by the admin tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command

from tests.jobkit import STAFF_CODENAMES
from tombstones.roles import AUDITORS


@pytest.fixture
def staff() -> User:
    """A staff member with the audit's view permissions and every staff decision."""
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="tombstones", codename__in=STAFF_CODENAMES
        )
    )
    return user


@pytest.fixture
def auditor() -> User:
    """A member of the Auditors group (made by ``tombstones_roles``)."""
    call_command("tombstones_roles", verbosity=0)
    user = User.objects.create_user("auditor", password="pw", is_staff=True)
    user.groups.add(Group.objects.get(name=AUDITORS))
    return user


@pytest.fixture
def tasks_forgotten() -> Iterator[None]:
    """What tests.tasks' functions saw (``tasks.seen``), empty before and after the test."""
    from tests import tasks

    tasks.seen.clear()
    yield
    tasks.seen.clear()
