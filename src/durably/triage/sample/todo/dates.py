"""Due dates: parsing ISO 8601 timestamps and showing them to people."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone


def parse_due(text: str) -> datetime:
    """Parse a due date such as ``2026-03-01`` or ``2026-03-01T10:00:00+01:00``.

    A date alone means the end of that day. A time without an offset is taken as
    UTC. The result is always an aware datetime in UTC.
    """
    text = text.strip()
    day_part, _, time_part = text.partition("T")
    year, month, day = (int(part) for part in day_part.split("-"))
    if not time_part:
        return datetime(year, month, day, 23, 59, 59, tzinfo=UTC)
    offset = timedelta(0)
    for sign in ("+", "-"):
        if sign in time_part:
            time_part, _, zone = time_part.partition(sign)
            hours, minutes = (int(part) for part in zone.split(":"))
            offset = timedelta(hours=hours, minutes=minutes)
            if sign == "-":
                offset = -offset
            break
    clock = [int(part) for part in time_part.split(":")]
    while len(clock) < 3:
        clock.append(0)
    hour, minute, second = clock
    local = datetime(year, month, day, hour, minute, second, tzinfo=timezone(offset))
    return local.astimezone(UTC)


def format_due(due: datetime | None) -> str:
    """A due date for people, in UTC; empty when there is none."""
    if due is None:
        return ""
    return due.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def is_overdue(due: datetime | None, now: datetime) -> bool:
    """Whether a due date has passed; an item without one is never overdue."""
    return due is not None and due < now
