"""Where to start reading a stream, as people write it: one parser for the Python API, the CLI and Spark.

A start point is a sequence number, the last N records (-N), an ISO-8601 time, or a word (earliest, latest,
snapshot). One time-zone rule everywhere: a time must name its zone (Z or an offset such as +02:00); a time
without one is refused rather than read in some zone the writer did not mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gateway.errors import ConfigError

WORDS = ("earliest", "latest", "snapshot")
EXAMPLE_TIME = "2026-05-01T09:30:00Z"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class StartPoint:
    """One of: a sequence (`seq`), the last `back` records, a time (`time_ns`), or a `word`."""

    seq: int | None = None
    back: int | None = None  # the last N records: -N
    time_ns: int | None = None
    word: str | None = None

    def when(self) -> datetime:
        assert self.time_ns is not None
        return datetime.fromtimestamp(self.time_ns / 1e9, UTC)


def allowed(words: Sequence[str] = WORDS) -> str:
    """The forms a start point may take, for error messages and help texts."""
    return " | ".join((*words, "SEQ", "-N (the last N)", "an ISO-8601 time with a zone"))


def parse_start(value: str | int | datetime, words: Sequence[str] = WORDS, *, hint: str = "") -> StartPoint:
    """`value` as a StartPoint; ConfigError (a ValueError) naming the valid forms otherwise. `hint` is added
    to the message of a value that is none of them (the CLI names its --since there)."""
    if isinstance(value, datetime):
        return StartPoint(time_ns=time_ns(value, str(value)))
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"start {value!r} is a {type(value).__name__}: give {allowed(words)}")
    text = str(value)
    if text in words:
        return StartPoint(word=text)
    if text.isdigit():
        return StartPoint(seq=int(text))
    if text.startswith("-") and text[1:].isdigit():
        if int(text[1:]) < 1:
            raise ConfigError(f"{text!r}: the last N records needs N >= 1, e.g. -10")
        return StartPoint(back=int(text[1:]))
    return StartPoint(time_ns=parse_time(text, f"{allowed(words)} (e.g. {EXAMPLE_TIME}{f'; {hint}' if hint else ''})"))


def parse_time(text: str, expected: str = f"an ISO-8601 time with a zone (e.g. {EXAMPLE_TIME})") -> int:
    """Nanoseconds since the epoch of an ISO-8601 time that names its zone; ConfigError saying what was
    `expected` otherwise."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not {expected}") from None
    return time_ns(when, text)


def time_ns(when: datetime, text: str) -> int:
    """Nanoseconds since the epoch of `when` (written as `text`), which must name its zone."""
    if when.tzinfo is None:
        raise ConfigError(f"{text!r} names no time zone: add Z for UTC, or an offset such as +02:00")
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def ago(seconds: float) -> StartPoint:
    """The time `seconds` ago (--since)."""
    now = datetime.now(UTC)
    return StartPoint(time_ns=time_ns(now - timedelta(seconds=seconds), "now"))
