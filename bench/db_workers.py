"""N django-tasks-db workers (``manage.py db_worker``) as children of one process.

    python bench/db_workers.py N [db_worker options ...]

bench/run.py starts this in a session of its own, so one process group holds every worker (its
``--backlog`` SIGSTOPs and SIGCONTs the group) and one process is the root of the RSS sampler's
tree. SIGTERM or SIGINT is passed on to every worker (db_worker exits at once when idle, after its
task otherwise); this process exits when they all have, with the first non-zero exit status.
It imports no Django: the workers read the environment (DJANGO_SETTINGS_MODULE, DATABASE_URL).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit() or int(argv[0]) < 1:
        print(__doc__, file=sys.stderr)
        return 2
    count, options = int(argv[0]), argv[1:]
    procs = [
        subprocess.Popen([sys.executable, str(MANAGE), "db_worker", *options]) for _ in range(count)
    ]

    def forward(signum: int, frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [proc.wait() for proc in procs]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
