"""A record's timeline drawn from what its jobs saw (tombstones.admin.timeline): the generations
derived from the sightings, and the SVG's geometry on an ordinal axis (one step per distinct
moment, narrower steps for a long history, never narrower than ``MIN_STEP``).

No database: unsaved jobs and events, every moment before the picture's ``now`` (the axis's
last).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tombstones.admin import timeline, timeline_svg
from tombstones.admin.timeline import Identity, Sighting
from tombstones.admin.timeline_svg import (
    FIT_WIDTH,
    GENERATION_COLOURS,
    HANDLER_CHARS,
    LEFT,
    MIN_STEP,
    RIGHT_LABEL,
    ROW,
    STEP,
    TOP,
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
    seen = timeline._sightings([job, unfenced], events, Identity("customers.customer", "3"))
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
        Sighting(t0 + timedelta(seconds=4), 2, 1, tombstone=True, source="now"),
    ]
    identity = Identity("customers.customer", "3", generation=2, deleted_at=deleted, exists=True)
    first, second = timeline._generations(seen, identity)
    assert first.tombstone_seen_at == t0 + timedelta(seconds=1)  # the first job that saw it
    assert first.deleted_at is None  # the record only knows its current generation's
    assert second.tombstone_seen_at is None  # "now" is the record itself, not a job's sighting
    assert second.deleted_at == deleted
    assert second.first == deleted  # the band starts no later than the deletion


def test_generations__colours_cycle_and_an_empty_history_has_none() -> None:
    t0 = _start()
    count = len(GENERATION_COLOURS) + 1
    seen = [Sighting(t0 + timedelta(seconds=n), n, 1) for n in range(count, 0, -1)]
    generations = timeline._generations(seen, Identity("customers.customer", "3"))
    assert [g.number for g in generations] == list(range(1, count + 1))
    assert generations[-1].colour == GENERATION_COLOURS[0]
    assert timeline._generations([], Identity("customers.customer", "3")) == []


# --- the picture -----------------------------------------------------------------------------


def test_picture__one_step_per_distinct_moment_and_the_axis_ends_now() -> None:
    t0 = _start()
    same = t0 + timedelta(seconds=1)
    jobs = [_job(1, t0), _job(2, same), _job(3, same)]
    svg = timeline_svg.picture(jobs, [], [], NOW)
    assert [row["x1"] for row in svg["rows"]] == [_x(0), _x(1), _x(1)]
    assert svg["now_x"] == _x(2)
    assert [row["x2"] for row in svg["rows"]] == [svg["now_x"]] * 3  # open: they run to now
    assert [row["y"] for row in svg["rows"]] == [TOP + 44, TOP + 44 + ROW, TOP + 44 + 2 * ROW]
    assert svg["width"] == LEFT + 3 * STEP + RIGHT_LABEL
    assert svg["height"] == TOP + 64 + 3 * ROW
    assert svg["outcome_x"] == svg["width"] - RIGHT_LABEL + 8


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
        finished_at=t0 + timedelta(seconds=9),  # its row's stamp, not a moment of the axis
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
    assert [(d["x"], d["terminal"]) for d in row["dots"]] == [(_x(1), False), (_x(2), True)]
    assert row["dots"][1]["title"].startswith("rejected source_deleted ")
    assert row["dots"][1]["title"].endswith(", found g1/v4")
    assert row["colour"] == timeline_svg.STATUS_COLOURS[Status.REJECTED]


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
    assert tombstone["label"] == ""  # under 80 px
    assert current["width"] == _x(4) - _x(3) + STEP - 4  # the live generation runs to now
    assert [(m["kind"], m["x"]) for m in svg["marks"]] == [
        ("deleted", _x(2)),
        ("recreated", _x(3)),
    ]
    assert svg["marks"][1]["label"] == "re-created as g2"


def test_picture__a_tombstone_nobody_re_created_lasts_until_now() -> None:
    t0 = _start()
    at = [t0 + timedelta(seconds=n) for n in range(5)]
    gone = Generation(1, first=at[0], last=at[1], tombstone_seen_at=at[1], colour="c1")
    jobs = [_job(n, at[n]) for n in (2, 3, 4)]  # moments enough for a wide tombstone band
    svg = timeline_svg.picture(jobs, [], [gone], NOW)
    band, tombstone = svg["bands"]
    assert band["width"] == _x(5) - _x(0) + STEP - 4  # not deleted: the band runs to now
    assert band["label"] == "generation 1"  # wide enough for the long label
    assert (tombstone["x"], tombstone["width"]) == (_x(1), _x(5) - _x(1))
    assert tombstone["label"] == "tombstone"
    assert [(m["kind"], m["label"]) for m in svg["marks"]] == [("deleted", "tombstone seen")]


def test_short__long_handler_names_keep_their_end() -> None:
    fits = "h" * HANDLER_CHARS
    assert timeline_svg._short(fits) == fits
    long = "app.handlers." + "x" * HANDLER_CHARS + ".sync_row"
    short = timeline_svg._short(long)
    assert len(short) == HANDLER_CHARS
    assert short == "…" + long[-(HANDLER_CHARS - 1) :]
    assert short.endswith(".sync_row")
