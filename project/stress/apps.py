import os
import socket

from django.apps import AppConfig

# A process started with this variable calls its host by that name (see project/stress/hosts.py).
HOST_ENV = "STRESS_HOST"


class StressConfig(AppConfig):
    name = "project.stress"
    label = "stress"
    verbose_name = "Race harness"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tombstones.signals import job_claimed

        from .soak import journal

        # The chaos soak journals every claim (only when SOAK_JOURNAL is set): connected here, not
        # with its handlers, which a worker imports after its first claim.
        job_claimed.connect(journal.trace_claim, dispatch_uid="stress.soak.trace_claim")
        host = os.environ.get(HOST_ENV)
        if host:
            # Several clusters on one machine, each as if on a host of its own: the workers' ids
            # (host:pid, in the ledger and the deliveries) tell the hosts apart.
            socket.gethostname = lambda: host  # type: ignore[assignment]
