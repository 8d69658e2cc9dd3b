from __future__ import annotations

import os

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench.benchapp"
    label = "benchapp"
    verbose_name = "Fencing benchmark"

    def ready(self) -> None:
        # Only in the cluster started by bench/run.py: count every statement per process.
        directory = os.environ.get("BENCH_SQL_DIR")
        if directory:
            from bench import sqlcount

            sqlcount.install(directory)
            sqlcount.connect_role_signals()
            # A process that is a worker by itself (django-tasks-db's db_worker): no django-q2
            # signal names it.
            role = os.environ.get("BENCH_SQL_ROLE")
            if role:
                sqlcount.set_role(role)
