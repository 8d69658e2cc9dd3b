"""How long one wake-up may run (tombstones.jobs.cluster.task_seconds): half of django-q2's
task timeout, so that django-q2 never kills a wake-up in the middle of a job."""

from __future__ import annotations

from typing import Any

import pytest
from django_q.conf import Conf

from tombstones.jobs.cluster import task_seconds


def test_task_seconds__half_of_the_timeout_in_the_q_options(settings: Any) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {"timeout": 90}
    assert task_seconds() == 45.0
    settings.TOMBSTONES_Q_OPTIONS = {"timeout": 0.5}
    assert task_seconds() == 0.25


def test_task_seconds__falls_back_to_the_clusters_timeout(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.TOMBSTONES_Q_OPTIONS = {"cluster": "jobs"}
    monkeypatch.setattr(Conf, "TIMEOUT", 300)
    assert task_seconds() == 150.0
    # The options win over the cluster's own.
    settings.TOMBSTONES_Q_OPTIONS = {"timeout": 20}
    assert task_seconds() == 10.0


def test_task_seconds__no_bound_without_a_usable_timeout(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Conf, "TIMEOUT", None)
    settings.TOMBSTONES_Q_OPTIONS = {}
    assert task_seconds() is None
    for timeout in (0, -5, True, "60", None):
        settings.TOMBSTONES_Q_OPTIONS = {"timeout": timeout}
        assert task_seconds() is None, timeout
