"""The `zeps` data source's options, read from Spark's option map: each helper names the option and the fix."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.client.start_point import parse_time

LAST = 2**63 - 1  # Spark's BIGINT holds sequences up to here


def required(options: Mapping[str, str], name: str, what: str) -> str:
    value = options.get(name)
    if not value:
        raise ValueError(f"zeps: option {name} is required ({what})")
    return value


def choice(options: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = options.get(name, default).lower()
    if value not in choices:
        raise ValueError(f"zeps: option {name}={value!r}: use one of {', '.join(choices)}")
    return value


def integer(options: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    text = options.get(name)
    if text is None:
        return default
    if not text.isdigit() or int(text) < minimum:
        raise ValueError(f"zeps: option {name}={text!r}: expected an integer >= {minimum}")
    return min(int(text), LAST)


def seconds(options: Mapping[str, str], name: str, default: float) -> float:
    text = options.get(name)
    try:
        value = default if text is None else float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"zeps: option {name}={text!r}: expected seconds > 0")
    return value


def time_ns(options: Mapping[str, str], name: str) -> int | None:
    """A time option: nanoseconds since the epoch, or an ISO-8601 time with a zone (Z or an offset)."""
    text = options.get(name)
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    try:
        return parse_time(text, "ns since the epoch or an ISO-8601 time with a zone (e.g. 2026-05-01T09:30:00Z)")
    except ValueError as exc:
        raise ValueError(f"zeps: option {name}: {exc}") from None


def flag(options: Mapping[str, str], name: str) -> bool:
    return options.get(name, "false").lower() in ("true", "1", "yes")
