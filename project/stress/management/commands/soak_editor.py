"""``manage.py soak_editor``: the chaos soak's editor process (started by bench/soak.py).

Edits, deletes and re-creates records of the soak's database at ``--rate`` changes a second
until SIGTERM, then prints its tally as one JSON line. See project/stress/soak/editor.py.
"""

from __future__ import annotations

import json
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from project.stress.soak import editor


class Command(BaseCommand):
    help = "The chaos soak's editor: edits, deletes and re-creates records until SIGTERM."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rate", type=float, default=5.0, help="Changes per second.")
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args: Any, **options: Any) -> None:
        stop = False

        def on_term(signum: int, frame: Any) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the soak stops it, after its feeder
        tally = editor.run(options["rate"], options["seed"], lambda: stop)
        self.stdout.write(json.dumps(dict(tally)))
