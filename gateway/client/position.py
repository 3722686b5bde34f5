"""Positions in a stream as people write them: a sequence number, or an ISO-8601 time (UTC unless zoned)."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_position(text: str) -> tuple[int, int | None]:
    """A position as written on the command line or as a Spark option -> (first sequence, since_ns)."""
    if text.isdigit():
        return int(text), None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--from {text!r} is neither a sequence number nor an ISO-8601 time (e.g. 2024-05-01T09:30:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - datetime(1970, 1, 1, tzinfo=UTC)
    return 0, (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
