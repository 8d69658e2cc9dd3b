"""Two ``bench/run.py`` JSON files side by side: jobs/s per cell (median of its reps), the ratio
after/before, and the worker's statements per job.

    python bench/results/issue33/compare.py BEFORE.json AFTER.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from typing import Any

Cell = tuple[str, int, str, str]
FENCED = ("ordered", "unordered")


def load(path: str) -> tuple[dict[Cell, float], dict[Cell, Any]]:
    runs = json.load(open(path))["runs"]  # noqa: SIM115 - a script's one read
    rates: dict[Cell, list[float]] = defaultdict(list)
    sql: dict[Cell, Any] = {}
    for run in runs:
        cell = (run["db"], run["workers"], run["mix"], run["variant"])
        rates[cell].append(run["jobs_per_s"])
        sql[cell] = run.get("sql_per_job_worker")
    return {cell: statistics.median(values) for cell, values in rates.items()}, sql


def main(before_path: str, after_path: str) -> None:
    before, before_sql = load(before_path)
    after, after_sql = load(after_path)
    print(f"{'cell':42} {'before':>8} {'after':>8} {'ratio':>6}  sql/job (worker)")
    fenced: list[float] = []
    for cell in sorted(set(before) & set(after)):
        ratio = after[cell] / before[cell]
        if cell[3] in FENCED:
            fenced.append(ratio)
        name = " ".join(map(str, cell))
        print(
            f"{name:42} {before[cell]:8.1f} {after[cell]:8.1f} {ratio:6.2f}"
            f"  {before_sql[cell]} -> {after_sql[cell]}"
        )
    print(
        f"fenced cells: median ratio {statistics.median(fenced):.2f}, "
        f"min {min(fenced):.2f}, max {max(fenced):.2f}"
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
