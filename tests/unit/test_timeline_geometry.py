"""A record's timeline drawn from what its jobs saw (tombstones.admin.timeline): the generations
derived from the sightings, and the SVG's geometry on an ordinal axis (one step per distinct
moment, narrower steps for a long history, never narrower than ``MIN_STEP``): labels that never
touch, bars that end at the job's outcome.

No database: unsaved jobs and events, every moment before the picture's ``now`` (the axis's
last).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tombstones.admin import timeline, timeline_svg
from tombstones.admin.timeline import Identity, Sighting
from tombstones.admin.timeline_svg import (
    CHAR,
    FIT_WIDTH,
    FONT,
    GENERATION_COLOURS,
    LABEL_GAP,
    LEFT,
    MIN_STEP,
    RIGHT_LABEL,
    ROW,
    STEP,
    Generation,
)
from tombstones.jobs.models import Job, JobEvent

Status = Job.Status
Reason = Job.Reason
Event = JobEvent.Event


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _start() -> datetime:
    return NOW - timedelta(hours=1)


def _job(pk: int, at: datetime, **fields: Any) -> Job:
    values: dict[str, Any] = {
        "pk": pk,
        "handler": "customers.sync",
        "content_type_id": 1,
        "object_id": "3",
        "generation": 1,
        "version": 1,
        "status": Status.QUEUED,
        "created_at": at,
    }
    values.update(fields)
    return Job(**values)


def _event(job: Job, event: str, at: datetime, **fields: Any) -> JobEvent:
    return JobEvent(job_id=job.pk, event=event, created_at=at, **fields)


def _x(slot: int, step: int = STEP) -> int:
    return LEFT + step // 2 + slot * step


# --- sightings -------------------------------------------------------------------------------


def test_sightings__enqueues_and_the_events_that_read_the_record_in_time_order() -> None:
    t0 = _start()
    at = [t0 + timedelta(seconds=n) for n in range(7)]
    job = _job(1, at[0])
    unfenced = _job(2, at[1], generation=None, version=None)
    events = [
        _event(job, Event.REJECTED, at[6], found_generation=2, found_version=1),
        _event(job, Event.CLAIMED, at[2]),  # found nothing: no sighting
        _event(job, Event.CHECKED, at[3], found_generation=1, found_version=2),
        _event(job, Event.RETRY, at[4], found_generation=1, found_version=2),  # not a read
        _event(
            job,
            Event.REJECTED,
            at[5],
            reason=Reason.SOURCE_DELETED,
            found_generation=1,
            found_version=3,
        ),
    ]
    seen = timeline._sightings([job, unfenced], events)
    assert [(s.at, s.generation, s.version, s.tombstone, s.source) for s in seen] == [
        (at[0], 1, 1, False, "#1"),
        (at[3], 1, 2, False, "#1 checked"),
        (at[5], 1, 3, True, "#1 rejected"),
        (at[6], 2, 1, False, "#1 rejected"),
    ]


# --- generations -----------------------------------------------------------------------------


def test_generations__group_sightings_by_number_with_their_versions_in_order() -> None:
    t0 = _start()
    seen = [
        Sighting(t0, 1, 3, source="#1"),
        Sighting(t0 + timedelta(seconds=1), 1, 1, source="#2"),
        Sighting(t0 + timedelta(seconds=2), 2, 1, source="#3"),
        Sighting(t0 + timedelta(seconds=3), 1, 3, source="#4 checked"),
        Sighting(t0 + timedelta(seconds=4), 2, None, source="#5"),
    ]
    first, second = timeline._generations(seen, Identity("customers.customer", "3"))
    assert (first.number, first.first, first.last, first.versions) == (
        1,
        t0,
        t0 + timedelta(seconds=3),
        [1, 3],
    )
    assert (second.number, second.versions) == (2, [1])
    assert (first.colour, second.colour) == GENERATION_COLOURS[:2]
    assert first.deleted_at is None
    assert first.tombstone_seen_at is None


def test_generations__a_tombstone_seen_by_a_job_or_known_from_the_record() -> None:
    t0 = _start()
    deleted = t0 - timedelta(minutes=5)  # before any job saw generation 2
    seen = [
        Sighting(t0, 1, 1),
        Sighting(t0 + timedelta(seconds=1), 1, 2, tombstone=True, source="#2 rejected"),
        Sighting(t0 + timedelta(seconds=2), 1, 2, tombstone=True, source="#3 rejected"),
        Sighting(t0 + timedelta(seconds=3), 2, 1),
    ]
    identity = Identity(
        "customers.customer", "3", generation=2, version=2, deleted_at=deleted, exists=True
    )
    first, second = timeline._generations(seen, identity)
    assert first.tombstone_seen_at == t0 + timedelta(seconds=1)  # the first job that saw it
    assert first.deleted_at is None  # the record only knows its current generation's
    assert second.tombstone_seen_at is None  # the record itself, not a job's sighting
    assert second.deleted_at == deleted
    assert second.first == deleted  # the band starts no later than the deletion
    assert second.versions == [1, 2]  # the tombstone's own version, as the record has it


def test_generations__the_current_ones_first_and_last_seen_are_moments_of_the_data() -> None:
    # Issue 24: "first/last seen" of the current generation showed the time the page was read.
    t0 = _start()
    job = _job(1, t0, status=Status.SUCCEEDED, finished_at=t0 + timedelta(seconds=2))
    at = [t0 + timedelta(seconds=n) for n in range(3)]
    events = [
        _event(job, Event.CHECKED, at[1], found_generation=1, found_version=1),
        _event(job, Event.SUCCEEDED, at[2], found_generation=1, found_version=2),
    ]
    live = Identity("customers.customer", "3", generation=1, version=3, exists=True)
    (gen,) = timeline.observed([job], events, live)
    assert (gen.first, gen.last) == (t0, t0 + timedelta(seconds=2))  # its jobs' moments
    assert gen.versions == [1, 2, 3]  # v3: the record now, without a time of its own

    deleted = t0 + timedelta(seconds=5)
    tombstone = Identity(
        "customers.customer", "3", generation=1, version=4, deleted_at=deleted, exists=True
    )
    (gen,) = timeline.observed([job], events, tombstone)
    assert (gen.first, gen.last) == (t0, deleted)  # the deletion is its last change


def test_generations__a_current_generation_no_job_saw_has_no_moments() -> None:
    t0 = _start()
    job = _job(1, t0, status=Status.REJECTED, finished_at=t0 + timedelta(seconds=1))
    events = [
        _event(
            job,
            Event.REJECTED,
            t0 + timedelta(seconds=1),
            reason=Reason.SOURCE_DELETED,
            found_generation=1,
            found_version=2,
        )
    ]
    revived = Identity("customers.customer", "3", generation=2, version=1, exists=True)
    old, new = timeline.observed([job], events, revived)
    assert old.tombstone_seen_at == t0 + timedelta(seconds=1)
    assert (new.number, new.first, new.last, new.versions) == (2, None, None, [1])
    # The picture draws it where it was read: now, with no time in its mark's title.
    svg = timeline_svg.picture([job], events, [old, new], NOW)
    assert svg["bands"][-1]["x"] == svg["now_x"] - STEP // 2 + 2
    (recreated,) = [m for m in svg["marks"] if m["kind"] == "recreated"]
    assert recreated["x"] == svg["now_x"]
    assert recreated["title"] == "generation 2: no job saw it; the record is at it now"


def test_generations__colours_cycle_and_an_empty_history_has_none() -> None:
    t0 = _start()
    count = len(GENERATION_COLOURS) + 1
    seen = [Sighting(t0 + timedelta(seconds=n), n, 1) for n in range(count, 0, -1)]
    generations = timeline._generations(seen, Identity("customers.customer", "3"))
    assert [g.number for g in generations] == list(range(1, count + 1))
    assert generations[-1].colour == GENERATION_COLOURS[0]
    assert timeline._generations([], Identity("customers.customer", "3")) == []


# --- the picture -----------------------------------------------------------------------------


def _label_boxes(svg: dict[str, Any]) -> list[tuple[str, tuple[int, int, int, int]]]:
    """Every label of the drawing's top with its box (x1, y1, x2, y2): the template writes each
    at its ``label_x``, a mark's on its baseline ``y``, a band's 16 px below the band's top."""
    boxes = []
    for mark in svg["marks"]:
        x, y = mark["label_x"], mark["y"]
        assert x >= mark["x"] + LABEL_GAP  # right of its own line
        boxes.append((mark["label"], (x, y - FONT, x + len(mark["label"]) * CHAR, y + 4)))
    for band in svg["bands"]:
        if band["label"]:
            x, y = band["label_x"], svg["band_y"] + 16
            assert band["x"] < x
            assert x + len(band["label"]) * CHAR < band["x"] + band["width"]
            boxes.append((band["label"], (x, y - FONT, x + len(band["label"]) * CHAR, y + 4)))
    return boxes


def _overlapping(svg: dict[str, Any]) -> list[tuple[str, str]]:
    boxes = _label_boxes(svg)
    return [
        (a, b)
        for i, (a, (ax1, ay1, ax2, ay2)) in enumerate(boxes)
        for b, (bx1, by1, bx2, by2) in boxes[i + 1 :]
        if ax1 < bx2 and bx1 < ax2 and ay1 < by2 and by1 < ay2
    ]


def test_picture__one_step_per_distinct_moment_and_the_axis_ends_now() -> None:
    t0 = _start()
    same = t0 + timedelta(seconds=1)
    jobs = [_job(1, t0), _job(2, same), _job(3, same)]
    svg = timeline_svg.picture(jobs, [], [], NOW)
    assert [row["x1"] for row in svg["rows"]] == [_x(0), _x(1), _x(1)]
    assert svg["now_x"] == _x(2)
    assert [row["x2"] for row in svg["rows"]] == [svg["now_x"]] * 3  # open: they run to now
    first = svg["rows"][0]["y"]
    assert first > svg["axis_y"] > svg["band_y"]
    assert [row["y"] for row in svg["rows"]] == [first, first + ROW, first + 2 * ROW]
    assert svg["width"] == LEFT + 3 * STEP + RIGHT_LABEL
    assert svg["height"] == first + 3 * ROW
    assert svg["outcome_x"] == svg["width"] - RIGHT_LABEL + 2 * LABEL_GAP


def test_picture__a_long_history_gets_narrower_steps_down_to_a_floor() -> None:
    t0 = _start()
    room = FIT_WIDTH - LEFT - RIGHT_LABEL
    for moments, step in ((room // STEP, STEP), (room // STEP + 1, room // (room // STEP + 1))):
        jobs = [_job(n, t0 + timedelta(seconds=n)) for n in range(moments - 1)]
        svg = timeline_svg.picture(jobs, [], [], NOW)
        assert svg["width"] == LEFT + step * moments + RIGHT_LABEL, moments
        assert svg["now_x"] == _x(moments - 1, step)
    jobs = [_job(n, t0 + timedelta(seconds=n)) for n in range(199)]
    svg = timeline_svg.picture(jobs, [], [], NOW)
    assert svg["width"] == LEFT + MIN_STEP * 200 + RIGHT_LABEL
    assert svg["rows"][-1]["x1"] == _x(198, MIN_STEP)


def test_picture__a_finished_jobs_bar_ends_at_its_last_event_with_a_dot_per_event() -> None:
    t0 = _start()
    job = _job(
        1,
        t0,
        status=Status.REJECTED,
        reason=Reason.SOURCE_DELETED,
        finished_at=t0 + timedelta(seconds=2),
    )
    events = [
        _event(job, Event.CLAIMED, t0 + timedelta(seconds=1)),
        _event(
            job,
            Event.REJECTED,
            t0 + timedelta(seconds=2),
            reason=Reason.SOURCE_DELETED,
            found_generation=1,
            found_version=4,
        ),
    ]
    (row,) = timeline_svg.picture([job], events, [], NOW)["rows"]
    assert (row["x1"], row["x2"]) == (_x(0), _x(2))
    assert not row["open"]
    assert row["outcome"] == "Rejected (source_deleted)"  # the label, then the code
    assert row["label"] == "#1 customers.sync g1/v1"
    assert [(d["x"], d["terminal"], d["r"]) for d in row["dots"]] == [
        (_x(1), False, 4),
        (_x(2), True, 7),
    ]
    assert row["dots"][1]["title"].startswith("rejected source_deleted ")
    assert row["dots"][1]["title"].endswith(", found g1/v4")
    assert row["colour"] == timeline_svg.STATUS_COLOURS[Status.REJECTED]


def test_picture__a_succeeded_jobs_bar_ends_at_its_outcome_before_the_deletion() -> None:
    # Issue 24: the deletion erases the params of the record's jobs and writes a params_erased
    # event for each; a succeeded job's bar ran on to it, across the "deleted" line.
    t0 = _start()
    at = [t0 + timedelta(seconds=n) for n in range(6)]
    job = _job(1, at[0], status=Status.SUCCEEDED, finished_at=at[2])
    events = [
        _event(job, Event.CLAIMED, at[1]),
        _event(job, Event.CHECKED, at[1], found_generation=1, found_version=1),
        _event(job, Event.SUCCEEDED, at[2], found_generation=1, found_version=2),
        _event(job, Event.PARAMS_ERASED, at[4]),  # written by the deletion, after it
    ]
    gen = Generation(1, first=at[0], last=at[3], versions=[1, 2, 3], deleted_at=at[3])
    svg = timeline_svg.picture([job], events, [gen], NOW)
    (deleted,) = svg["marks"]
    (row,) = svg["rows"]
    assert row["x2"] == _x(2) < deleted["x"]  # the outcome's moment
    assert [d["x"] for d in row["dots"]] == [_x(1), _x(1), _x(2)]  # no dot for the erasure
    assert all(d["x"] + d["r"] < deleted["x"] for d in row["dots"])


def test_picture__a_bar_ends_at_finished_at_when_no_event_was_stored() -> None:
    t0 = _start()
    job = _job(1, t0, status=Status.SUCCEEDED, finished_at=t0 + timedelta(seconds=3))
    still = _job(2, t0 + timedelta(seconds=1), status=Status.RETRY_WAIT)  # open: to now
    svg = timeline_svg.picture([job, still], [], [], NOW)
    assert [(r["x2"], r["open"]) for r in svg["rows"]] == [(_x(2), False), (_x(3), True)]


def test_picture__dots_stay_within_their_slot_on_a_narrow_step() -> None:
    t0 = _start()
    jobs = [_job(n, t0 + timedelta(seconds=n)) for n in range(150)]
    events = [_event(jobs[0], Event.SUCCEEDED, t0 + timedelta(seconds=0.5))]
    svg = timeline_svg.picture(jobs, events, [], NOW)
    (dot,) = svg["rows"][0]["dots"]
    assert dot["r"] == (MIN_STEP - 2) // 2  # neighbours are MIN_STEP apart


def test_picture__a_deleted_generation_its_tombstone_and_the_re_creation() -> None:
    t0 = _start()
    at = [t0 + timedelta(seconds=n) for n in range(4)]
    old = Generation(1, first=at[0], last=at[1], versions=[1, 2], deleted_at=at[2], colour="c1")
    new = Generation(2, first=at[3], last=at[3], versions=[1], colour="c2")
    svg = timeline_svg.picture([], [], [old, new], NOW)
    # slots: at[0..3] are 0..3, now is 4
    band, tombstone, current = svg["bands"]
    assert band["x"] == _x(0) - STEP // 2 + 2
    assert band["width"] == _x(2) - _x(0) + STEP - 4  # to the deletion
    assert (band["label"], band["colour"]) == ("g1", "c1")  # too narrow for the long label
    assert band["title"] == "generation 1: versions seen v1, v2"
    assert (tombstone["x"], tombstone["width"]) == (_x(2), _x(3) - _x(2))  # until re-created
    assert tombstone["label"] == ""  # "tombstone" does not fit in one step
    assert current["width"] == _x(4) - _x(3) + STEP - 4  # the live generation runs to now
    assert current["label"] == "g2"
    assert [(m["kind"], m["x"]) for m in svg["marks"]] == [
        ("deleted", _x(2)),
        ("recreated", _x(3)),
    ]
    assert svg["marks"][1]["label"] == "re-created as g2"
    assert _overlapping(svg) == []


def test_picture__a_tombstone_nobody_re_created_lasts_until_now() -> None:
    t0 = _start()
    at = [t0 + timedelta(seconds=n) for n in range(5)]
    gone = Generation(1, first=at[0], last=at[1], tombstone_seen_at=at[1], colour="c1")
    jobs = [_job(n, at[n]) for n in (2, 3, 4)]  # moments enough for a wide tombstone band
    svg = timeline_svg.picture(jobs, [], [gone], NOW)
    band, tombstone = svg["bands"]
    assert band["width"] == _x(5) - _x(0) + STEP - 4  # not deleted: the band runs to now
    assert band["label"] == "g1"  # "generation 1" would run under the tombstone's band
    assert (tombstone["x"], tombstone["width"]) == (_x(1), _x(5) - _x(1))
    assert tombstone["label"] == "tombstone"
    assert [(m["kind"], m["label"]) for m in svg["marks"]] == [("deleted", "tombstone seen")]
    assert _overlapping(svg) == []


def test_picture__the_labels_of_a_deletion_and_a_re_creation_a_step_apart_never_touch() -> None:
    # Issue 24: "tombstone seen" / "deleted" and "re-created as g2" printed on top of each other.
    t0 = _start()
    at = [t0 + timedelta(seconds=n) for n in range(8)]
    old = Generation(1, first=at[0], last=at[1], tombstone_seen_at=at[1], colour="c1")
    new = Generation(2, first=at[2], last=at[3], deleted_at=at[3], colour="c2")
    newest = Generation(3, first=at[4], last=at[5], colour="c3")
    svg = timeline_svg.picture([], [], [old, new, newest], NOW)
    marks = [(m["label"], m["x"]) for m in svg["marks"]]
    assert marks == [
        ("tombstone seen", _x(1)),
        ("re-created as g2", _x(2)),
        ("deleted", _x(3)),
        ("re-created as g3", _x(4)),
    ]
    assert sorted({m["lane"] for m in svg["marks"]}) == [0, 1, 2, 3]  # each a step apart
    assert _overlapping(svg) == []
    # Each line of labels has its own height above the band, the lowest one nearest to it.
    assert sorted(m["y"] for m in svg["marks"]) == [m["y"] for m in svg["marks"]][::-1]
    assert min(m["y"] for m in svg["marks"]) - FONT >= 0
    assert max(m["y"] for m in svg["marks"]) + 4 <= svg["band_y"]


def test_picture__labels_far_apart_share_one_line_and_many_close_ones_never_touch() -> None:
    t0 = _start()
    # Far apart: one line.
    at = [t0 + timedelta(seconds=n) for n in range(12)]
    old = Generation(1, first=at[0], last=at[1], tombstone_seen_at=at[1])
    new = Generation(2, first=at[10], last=at[11])
    jobs = [_job(n, at[n]) for n in range(2, 10)]  # eight steps between the marks
    svg = timeline_svg.picture(jobs, [], [old, new], NOW)
    assert [m["lane"] for m in svg["marks"]] == [0, 0]
    # Generations deleted and re-created in quick succession, on a narrow step.
    at = [t0 + timedelta(seconds=n) for n in range(200)]
    gens = [
        Generation(n + 1, first=at[2 * n], last=at[2 * n], deleted_at=at[2 * n + 1])
        for n in range(12)
    ]
    jobs = [_job(n, at[30 + n]) for n in range(150)]
    svg = timeline_svg.picture(jobs, [], gens, NOW)
    assert len(svg["marks"]) == 23
    assert _overlapping(svg) == []


def test_label_bands__a_label_is_kept_only_where_no_later_band_covers_it() -> None:
    wide = {"x": 0, "width": 200, "labels": ("generation 1", "g1")}
    over = {"x": 50, "width": 100, "labels": ("tombstone",)}
    first, second = timeline_svg.label_bands([wide, over])
    assert first["label"] == "g1"  # "generation 1" would run under the tombstone's band
    assert second["label"] == "tombstone"
    (narrow,) = timeline_svg.label_bands([{"x": 0, "width": 20, "labels": ("g12",)}])
    assert narrow["label"] == ""


def test_picture__row_labels_and_outcomes_fit_their_margins() -> None:
    t0 = _start()
    long = "app.handlers." + "x" * 60 + ".sync_row"
    job = _job(
        123456,
        t0,
        handler=long,
        status=Status.REJECTED,
        reason=Reason.TOMBSTONE_UNREADABLE,
        finished_at=t0,
        generation=12,
        version=345,
    )
    (row,) = timeline_svg.picture([job], [], [], NOW)["rows"]
    assert row["label"].startswith("#123456 …")
    assert row["label"].endswith(".sync_row g12/v345")
    assert len(row["label"]) * CHAR <= LEFT - 2 * LABEL_GAP
    assert row["outcome_title"] == "Rejected (tombstone_unreadable)"
    assert len(row["outcome"]) * CHAR <= RIGHT_LABEL - 2 * LABEL_GAP
    assert row["outcome_title"].startswith(row["outcome"].rstrip("…"))


def test_short__long_handler_names_keep_their_end() -> None:
    fits = "h" * 10
    assert timeline_svg._short(fits, 10 * CHAR) == fits
    long = "app.handlers." + "x" * 40 + ".sync_row"
    short = timeline_svg._short(long, 30 * CHAR)
    assert len(short) == 30
    assert short == "…" + long[-29:]
    assert short.endswith(".sync_row")


def test_font__the_stylesheet_draws_the_text_at_the_size_the_geometry_assumes() -> None:
    css = (Path(timeline_svg.__file__).parents[1] / "static/tombstones/admin.css").read_text()
    (rule,) = re.findall(r"\.tg-timeline text \{([^}]*)\}", css)
    assert f"font-size: {FONT}px" in rule
    assert FONT >= 12  # issue 24: the chart's text was 9-10 px
    assert CHAR >= 0.6 * FONT  # a monospace glyph's advance
