"""Which multicast endpoint carries which streams: the gateway's channel plan.

`--multicast ENDPOINT` carries every stream; `--multicast STREAM=ENDPOINT` carries that stream only (repeat a
stream for A/B feeds; map several streams to one endpoint to share it). A stream on a channel of its own lets
IGMP snooping keep it off the ports of hosts that do not want it: exchanges publish a channel per product group
for the same reason. Every stream must end up on at least one channel when any are given (or none at all: a
journal-only gateway), so no stream is silently left off the multicast.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import ConfigError
from gateway.mcast import Endpoint
from gateway.wire.protocol import validate_stream_name


@dataclass(frozen=True, slots=True)
class Channel:
    """A multicast endpoint and the streams sent there, in the order they were named."""

    endpoint: Endpoint
    streams: tuple[str, ...]


def parse_mapping(text: str) -> tuple[str | None, Endpoint]:
    """`STREAM=ENDPOINT` -> (stream, endpoint); a plain `ENDPOINT` -> (None, endpoint): every stream.

    The stream is what precedes the last '=' before '://' (stream names may hold '=', endpoints do not).
    """
    head, sep, rest = text.partition("://")
    stream, eq, transport = head.rpartition("=")
    if not eq:
        return None, Endpoint.parse(text)
    validate_stream_name(stream)
    return stream, Endpoint.parse(transport + sep + rest)


def plan(texts: list[str], streams: list[str]) -> list[Channel]:
    """The channels for `--multicast` values, one per distinct endpoint, for a gateway serving `streams`."""
    mapped: dict[Endpoint, list[str]] = {}
    for text in texts:
        stream, endpoint = parse_mapping(text)
        if stream is not None and stream not in streams:
            raise ConfigError(f"--multicast {text}: {stream!r} is not one of the gateway's streams (--stream)")
        carried = mapped.setdefault(endpoint, [])
        carried.extend(s for s in ([stream] if stream else streams) if s not in carried)
    orphans = [s for s in streams if mapped and not any(s in carried for carried in mapped.values())]
    if orphans:
        raise ConfigError(
            f"stream(s) {', '.join(orphans)} are on no --multicast channel: map them (STREAM=ENDPOINT) or add a "
            "plain ENDPOINT that carries every stream"
        )
    return [Channel(endpoint, tuple(carried)) for endpoint, carried in mapped.items()]
