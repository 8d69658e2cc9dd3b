"""The soak's verdict: one JSON document and a table, with every lane-order violation spelled
out (both jobs, their places, starts, finishes and events) for the engine's author."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any, TextIO

# The checks that must all be zero for a run to pass.
CHECKS = (
    "lost_updates",
    "doubled_effects",
    "effects_without_success",
    "successes_without_effect",
    "repeated_external_calls",
    "external_successes_without_call",
    "stuck_jobs",
    "lane_order_violations",
    "rejections_without_reason",
    "blind_checks",  # a check that did not find the fault planted for it (checks.blind_checks)
)
# How many violations the table spells out (the JSON holds all of them).
SHOWN = 40


def failed(summary: dict[str, Any]) -> list[str]:
    return [name for name in CHECKS if summary.get(name)]


def clock(at: int | float | None) -> str:
    if at is None:
        return "never"
    return datetime.fromtimestamp(at / 1e6, tz=UTC).strftime("%H:%M:%S.%f")


def claim(key: str) -> str:
    """``host:pid@micros`` as ``host:pid@HH:MM:SS.ffffff`` (the claim's database time)."""
    owner, _, at = key.rpartition("@")
    return f"{owner}@{clock(int(at))}" if at.isdigit() else key or "-"


def patterns(violations: list[dict[str, Any]], lease_ms: float) -> dict[str, int]:
    """What the violations have in common: how the earlier job ended, where it was when the
    later one started, whether a kill or a take-back came just before."""
    found: Counter[str] = Counter()
    for v in violations:
        earlier = v["earlier"]
        kill = v["last_kill_before_ms"]
        events = {e["reason"] for side in ("job", "earlier") for e in v[side]["events"]}
        if v["headless_follower"]:
            where = "a follower of a claim without its lane's head"
        elif v["earlier_committed_after_claim"]:
            where = "earlier's enqueue committed after the claim"
        elif v["earlier_in_same_claim"]:
            where = "earlier taken in the same claim, not run"
        elif v["same_claim"]:
            where = "earlier ran in the same claim"
        elif v["earlier_started_before"]:
            where = "earlier had started elsewhere"
        else:
            where = "earlier not started"
        traits = [
            f"earlier {earlier['status']}/{earlier['reason'] or '-'}",
            where,
            "take-back events" if events & {"lease_expired", "outcome_unknown", "crashed"} else "",
            # A dead claim's jobs come back a lease after its last renewal (a third of a lease
            # before the kill at most), on the next tick: within two leases.
            "within two leases after a kill"
            if kill is not None and kill <= 2 * lease_ms
            else "no kill in the two leases before",
        ]
        found[", ".join(t for t in traits if t)] += 1
    return dict(found.most_common())


def table(report: dict[str, Any], out: TextIO) -> None:
    s = report["summary"]
    rows = [
        ("jobs", s["jobs"]),
        ("kills (claims hit / mid external call / with >=5 followers)",
         f"{s['kills']} ({s['kills_hit']} / {s['kills_mid_external']} / {s['kills_large']})"),
        ("restarts redis / postgres", f"{s['redis_restarts']} / {s['postgres_restarts']}"),
        *[(name.replace("_", " "), s[name]) for name in CHECKS],
        ("claims with headless followers (diagnostic)", s["claims_with_headless_followers"]),
        ("drain seconds", s["drain_seconds"] if s.get("drained", True) else "timed out"),
        ("jobs/s", s["jobs_per_s"]),
        ("wall seconds", s["wall_seconds"]),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    out.write(f"\n{'chaos soak':<{width}}  {report['form']}\n")
    out.write(f"{'-' * width}  {'-' * 20}\n")
    for name, value in rows:
        out.write(f"{name:<{width}}  {value}\n")
    out.write(f"outcomes: {report['outcomes']}\n")
    bad = failed(s)
    out.write(f"verdict: {'FAIL (' + ', '.join(bad) + ')' if bad else 'pass'}\n")
    for found in report["headless_followers"][:SHOWN]:
        out.write(
            f"headless followers: claim {claim(found['claim'])} reserved {found['followers']} "
            f"({', '.join(found['lanes'])}) with heads {found['heads']} of other lanes\n"
        )
    violations = report["details"]["lane_order_violations"]
    if violations:
        out.write(f"\nlane order violations by pattern: {report['order_patterns']}\n")
        for v in violations[:SHOWN]:
            _violation(v, out)
        if len(violations) > SHOWN:
            out.write(f"... {len(violations) - SHOWN} more in the JSON\n")
    for name in CHECKS:
        detail = report["details"].get(name)
        if name != "lane_order_violations" and detail:
            out.write(f"{name}: {str(detail)[:2000]}\n")


def _violation(v: dict[str, Any], out: TextIO) -> None:
    overtaken = v["overtaken_by_ms"]
    out.write(
        f"\n{v['lane']}: job {v['job']['id']} started {clock(v['start_at'])} "
        f"(claim {claim(v['start_claim'])}, attempt {v['start_attempts']}) before job "
        f"{v['earlier']['id']} ended "
        f"({'never' if overtaken is None else f'{overtaken} ms later'}; last kill "
        f"{v['last_kill_before_ms']} ms before the start)\n"
    )
    for side in ("earlier", "job"):
        job = v[side]
        out.write(
            f"  {side:<7} {job['id']} {job['handler']} {job['status']}/{job['reason'] or '-'} "
            f"attempts={job['attempts']} place={clock(job['place'])} "
            f"enqueue committed={clock(job['enqueue_committed'])} "
            f"finished={clock(job['finished'])}\n"
        )
        claims = ", ".join(f"{c['as']} in {claim(c['claim'])}" for c in job["claims"])
        out.write(f"          claims: {claims or 'none'}\n")
        starts = ", ".join(f"{clock(r['at'])} [{claim(r['claim'])}]" for r in job["starts"])
        out.write(f"          starts: {starts or 'none'}\n")
        events = ", ".join(
            f"{e['event']}{'/' + e['reason'] if e['reason'] else ''}@{clock(e['at'])}"
            f"{' by ' + e['worker'] if e['worker'] else ''}"
            for e in job["events"]
        )
        out.write(f"          events: {events or 'none stored'}\n")
