"""Tests of due-date parsing and formatting."""

from datetime import UTC, datetime

from todo.dates import format_due, is_overdue, parse_due


def test_a_date_alone_means_the_end_of_that_day() -> None:
    assert parse_due("2026-03-01") == datetime(2026, 3, 1, 23, 59, 59, tzinfo=UTC)


def test_offsets_are_converted_to_utc() -> None:
    assert parse_due("2026-03-01T10:00:00+01:00") == datetime(2026, 3, 1, 9, tzinfo=UTC)
    assert parse_due("2026-03-01T10:00-05:30") == datetime(2026, 3, 1, 15, 30, tzinfo=UTC)


def test_a_time_without_offset_is_utc() -> None:
    assert parse_due("2026-03-01T10:15") == datetime(2026, 3, 1, 10, 15, tzinfo=UTC)


def test_format_and_overdue() -> None:
    due = parse_due("2026-03-01T10:00:00+00:00")
    assert format_due(due) == "2026-03-01 10:00"
    assert format_due(None) == ""
    assert is_overdue(due, datetime(2026, 3, 2, tzinfo=UTC))
    assert not is_overdue(None, datetime(2026, 3, 2, tzinfo=UTC))
