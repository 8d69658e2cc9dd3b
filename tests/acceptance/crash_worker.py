"""A real worker process for the crash tests: runs one job through ``tombstones.worker.run``.

``CRASH_AT=claimed|checked`` stops it at that phase (through the worker's hook signals): it writes
``CRASH_MARKER`` and then waits, bounded, for ``CRASH_RELEASE`` to exist, so a test can SIGKILL or
SIGSTOP it at that exact point. Prints the task result as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HOLD_SECONDS = 60.0


def _hold(sender: Any, job: Any, **kwargs: Any) -> None:
    Path(os.environ["CRASH_MARKER"]).write_text(str(job.pk))
    release = os.environ.get("CRASH_RELEASE", "")
    deadline = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline and not (release and Path(release).exists()):
        time.sleep(0.01)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from tombstones import signals, worker

    stop_at = os.environ.get("CRASH_AT", "")
    if stop_at == "claimed":
        signals.job_claimed.connect(_hold, weak=False)
    elif stop_at == "checked":
        signals.job_checked.connect(_hold, weak=False)
    result = worker.run(int(sys.argv[1]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
