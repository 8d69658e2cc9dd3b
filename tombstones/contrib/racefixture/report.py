"""What a run of the race fixture found: one :class:`CaseResult` per case, gathered in a
:class:`Report` that prints as a table and a summary line."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cases import Case

SOURCE_STATE = {"rejected:source_deleted", "rejected:generation_changed"}


@dataclass
class CaseResult:
    case: Case
    actual: dict[str, str]
    writes: int
    error: str = ""

    @property
    def ok(self) -> bool:
        if self.error or self.actual != self.case.expected:
            return False
        return self.case.writes is None or self.case.writes == self.writes

    @property
    def category(self) -> str:
        """How the case counts in the summary line."""
        if not self.ok:
            return "unaccounted"
        outcomes = set(self.actual.values())
        if outcomes <= SOURCE_STATE:
            return "rejected"
        if outcomes == {"reread"}:
            return "reread"
        return "other"


@dataclass
class Report:
    results: list[CaseResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def summary(self) -> str:
        counts = {"rejected": 0, "reread": 0, "other": 0, "unaccounted": 0}
        for result in self.results:
            counts[result.category] += 1
        line = (
            f"{len(self.results)} case{'s' if len(self.results) != 1 else ''}: "
            f"{counts['rejected']} rejected for source state, "
            f"{counts['reread']} re-read for stale version"
        )
        if counts["other"]:
            line += f", {counts['other']} other as expected"
        return line + f", {counts['unaccounted']} unaccounted"

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        def fmt(outcomes: dict[str, str]) -> str:
            return ", ".join(f"{job}={value}" for job, value in outcomes.items())

        return [
            (
                r.case.name,
                " → ".join(r.case.events),
                fmt(r.case.expected)
                + (f" writes={r.case.writes}" if r.case.writes is not None else ""),
                (fmt(r.actual) + f" writes={r.writes}") if not r.error else f"error: {r.error}",
                "ok" if r.ok else "MISMATCH",
            )
            for r in self.results
        ]

    def table(self) -> str:
        header = ("case", "events", "expected", "actual", "verdict")
        rows = [header, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join([*lines, "", self.summary()])
