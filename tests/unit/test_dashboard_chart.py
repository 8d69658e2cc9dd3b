"""The dashboard's charts (tombstones.admin.dashboard): bar geometry for the inline SVG, scaled to
the highest bar, stacked by final status in one fixed order."""

from __future__ import annotations

from datetime import UTC, date, datetime

from tombstones.admin.dashboard import chart, stacked_chart
from tombstones.admin.timeline_svg import STATUS_COLOURS
from tombstones.jobs.models import Job

Status = Job.Status

BASE = 140  # the charts' baseline (y grows downwards)
HEIGHT = 120  # the highest bar's height


def _hour(key: datetime) -> str:
    return key.strftime("%H")


def test_chart__bars_scale_to_the_highest_day() -> None:
    days = [date(2026, 12, 1), date(2026, 12, 2), date(2026, 12, 3), date(2026, 12, 4)]
    drawn = chart(list(zip(days, [0, 5, 10, 7], strict=True)))
    bars = drawn["bars"]
    assert [b["h"] for b in bars] == [0, 60, HEIGHT, 84]
    assert [b["y"] for b in bars] == [BASE, BASE - 60, BASE - HEIGHT, BASE - 84]
    assert [b["x"] for b in bars] == [10, 46, 82, 118]  # 28 wide, 8 apart
    assert [b["text_x"] for b in bars] == [24, 60, 96, 132]
    assert [b["label"] for b in bars] == ["12-01", "12-02", "12-03", "12-04"]
    assert bars[1]["title"] == "2026-12-02: 5 rejected"
    assert (drawn["width"], drawn["height"], drawn["base"], drawn["total"]) == (
        20 + 4 * 36,
        BASE + 36,
        BASE,
        22,
    )


def test_chart__rounds_heights_and_draws_no_bar_for_a_quiet_fortnight() -> None:
    days = [date(2026, 12, 1), date(2026, 12, 2)]
    assert [b["h"] for b in chart(list(zip(days, [1, 7], strict=True)))["bars"]] == [17, HEIGHT]
    quiet = chart(list(zip(days, [0, 0], strict=True)))  # no division by a zero peak
    assert [(b["h"], b["y"]) for b in quiet["bars"]] == [(0, BASE), (0, BASE)]
    assert quiet["total"] == 0


def test_chart__an_empty_series_is_an_empty_frame() -> None:
    assert chart([]) == {"width": 20, "height": BASE + 36, "base": BASE, "bars": [], "total": 0}


def test_stacked_chart__segments_stack_up_from_the_base_in_status_order() -> None:
    hours = [datetime(2026, 12, 1, h, tzinfo=UTC) for h in (10, 11, 12)]
    series = [
        (hours[0], {Status.REJECTED: 100, Status.SUCCEEDED: 300}),
        (hours[1], {}),
        (hours[2], {Status.FAILED: 1, Status.SUCCEEDED: 599}),
    ]
    drawn = stacked_chart(series, _hour)
    first, empty, last = drawn["bars"]
    # Succeeded first whatever the counts' order, then rejected: 300 and 100 of a 600 peak.
    assert [(s["status"], s["n"], s["y"], s["h"]) for s in first["segments"]] == [
        (Status.SUCCEEDED, 300, BASE - 60, 60),
        (Status.REJECTED, 100, BASE - 80, 20),
    ]
    assert first["top"] == BASE - 80
    # One failure in 600 still shows: at least a pixel.
    assert [(s["status"], s["h"]) for s in last["segments"]] == [
        (Status.SUCCEEDED, HEIGHT),
        (Status.FAILED, 1),
    ]
    assert (empty["segments"], empty["top"], empty["total"]) == ([], BASE, 0)
    assert [b["x"] for b in drawn["bars"]] == [10, 40, 70]  # 24 wide, 6 apart by default
    assert [b["text_x"] for b in drawn["bars"]] == [22, 52, 82]
    assert [b["label"] for b in drawn["bars"]] == ["10", "11", "12"]
    assert (drawn["width"], drawn["total"]) == (20 + 3 * 30, 1000)
    assert first["segments"][0]["colour"] == STATUS_COLOURS[Status.SUCCEEDED]


def test_stacked_chart__titles_name_the_bucket_and_its_counts() -> None:
    hour = datetime(2026, 12, 1, 9, tzinfo=UTC)
    drawn = stacked_chart(
        [(hour, {Status.EXPIRED: 2, Status.SUCCEEDED: 3}), (hour, {})], _hour, bar=28, gap=8
    )
    assert [b["title"] for b in drawn["bars"]] == [
        "2026-12-01 09:00: 3 succeeded, 2 expired",
        "2026-12-01 09:00: none",
    ]
    by_day = stacked_chart([(date(2026, 12, 1), {Status.CANCELLED: 1})], str)
    assert by_day["bars"][0]["title"] == "2026-12-01: 1 cancelled"
    assert [b["x"] for b in drawn["bars"]] == [10, 46]


def test_stacked_chart__the_legend_lists_every_final_status_in_stacking_order() -> None:
    legend = stacked_chart([], _hour)["legend"]
    assert [status for status, _ in legend] == [
        Status.SUCCEEDED,
        Status.REJECTED,
        Status.UNCERTAIN,
        Status.SUPERSEDED,
        Status.ESCALATED,
        Status.EXPIRED,
        Status.FAILED,
        Status.CANCELLED,
    ]
    assert all(colour == STATUS_COLOURS[status] for status, colour in legend)
    assert stacked_chart([], _hour)["bars"] == []
