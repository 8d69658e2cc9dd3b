"""The admin's one time format: local time, seconds, no microseconds."""

from __future__ import annotations

from datetime import UTC, datetime

from django.test import override_settings

from tombstones.admin.display import format_time, time_html


def test_format_time__seconds_without_microseconds_in_the_current_time_zone() -> None:
    moment = datetime(2026, 12, 1, 4, 12, 48, 123456, tzinfo=UTC)
    with override_settings(TIME_ZONE="UTC"):
        assert format_time(moment) == "2026-12-01 04:12:48"
    with override_settings(TIME_ZONE="Europe/Berlin"):
        assert format_time(moment) == "2026-12-01 05:12:48"
    assert format_time(None) == "-"


def test_time_html__keeps_the_exact_moment_in_its_datetime_attribute() -> None:
    moment = datetime(2026, 12, 1, 4, 12, 48, 123456, tzinfo=UTC)
    with override_settings(TIME_ZONE="UTC"):
        html = str(time_html(moment))
    assert 'datetime="2026-12-01T04:12:48.123456+00:00"' in html
    assert ">2026-12-01</span> <span>04:12:48<" in html
    assert time_html(None) == "-"


def test_format_duration__two_largest_units() -> None:
    from datetime import timedelta

    from tombstones.admin.display import format_duration

    assert format_duration(None) == "-"
    assert format_duration(timedelta(seconds=3.7)) == "3 s"
    assert format_duration(timedelta(minutes=4, seconds=5)) == "4 min 05 s"
    assert format_duration(timedelta(hours=2, minutes=7, seconds=9)) == "2 h 07 min"
    assert format_duration(timedelta(days=3, hours=4, minutes=1)) == "3 d 04 h"
    assert format_duration(timedelta(seconds=-5)) == "0 s"
