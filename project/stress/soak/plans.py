"""The soak's two forms. Importable before Django is set up (bench/soak.py parses with it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """What one soak does. The defaults are the long form (bench/README.md)."""

    form: str = "long"
    jobs: int = 100_000
    records: int = 500
    workers: int = 4
    kills: int = 110
    redis_restarts: int = 3
    postgres_restarts: int = 3
    lease: float = 4.0  # TOMBSTONES_LEASE, seconds
    backlog: int = 1500  # unfinished jobs the feeder allows
    edit_rate: float = 5.0  # editor changes per second
    drain_timeout: float = 300.0
    seed: int = 0


# The CI form: under 4 minutes on 2 cores, still with kills and one restart of each server.
SHORT = Plan(
    form="short", jobs=8_000, kills=16, redis_restarts=1, postgres_restarts=1, drain_timeout=100
)
