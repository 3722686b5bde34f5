"""The last-resort directory: a static file listing each stream's channels, sidecar, ingest and the copy served.

For networks where neither multicast announcements nor etcd reach the client. TOML (any name) or JSON (a name
ending in .json), one table per stream under `streams` (docs/discovery.md):

    [streams.px]
    channels = ["udp://239.192.1.11:5011", "udp://239.192.2.11:5011"]   # A and B; joined on --interface
    sidecar = "tcp://10.1.0.5:5580"
    ingest = "tcp://10.1.0.5:5570"
    copy = "mirror"                      # what the gateway there holds: primary (the default), mirror, promoted
    source = "tcp://10.9.0.5:5580"       # a mirror's (or promoted copy's) source sidecar, at the other site

Every field is optional; unknown fields and malformed values are refused when the file is read (ConfigError,
naming the file, the stream and the field). Each stream is one holder (`StreamInfo.holders`), named after the
file: the primary unless `copy` says otherwise. The file is read once: nothing in it moves, so `fileno()` is an
fd that never becomes readable and `wait()` answers at once.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.client.directory import Holder, StreamInfo
from gateway.errors import ConfigError, DiscoveryError, ProtocolError
from gateway.mcast import Endpoint
from gateway.transport.pollable import PolledByFd
from gateway.wire import announce as A
from gateway.wire.protocol import validate_stream_name

_FIELDS = ("channels", "sidecar", "ingest", "copy", "source")


class FileDirectory(PolledByFd):
    """The streams listed in `path`; see the module docstring."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self.dropped: dict[str, int] = {}
        self._streams = load(self.path)
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # never written: nothing arrives

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> None:
        pass

    def lookup(self, stream: str) -> StreamInfo | None:
        return self._streams.get(stream)

    def streams(self) -> list[StreamInfo]:
        return [self._streams[name] for name in sorted(self._streams)]

    def listen(self, seconds: float) -> list[StreamInfo]:
        return self.streams()

    def wait(self, stream: str, deadline: float, need: Callable[[StreamInfo], bool]) -> StreamInfo:
        info = self._streams.get(stream)
        if info is None:
            listed = ", ".join(sorted(self._streams)) or "nothing"
            raise DiscoveryError(f"stream {stream!r} is not in {self.path} (it lists: {listed}): add it there")
        if not need(info):
            raise DiscoveryError(f"{self.path}: stream {stream!r} lacks what this client needs (sidecar or ingest)")
        return info

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FileDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: Path) -> dict[str, StreamInfo]:
    """The streams listed in the file at `path`; ConfigError naming what is wrong and where."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"directory file {path}: {exc.strerror}: give an existing file (--directory FILE)") from None
    try:
        doc = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise ConfigError(f"directory file {path}: not valid {kind}: {exc}") from None
    streams = doc.get("streams") if isinstance(doc, dict) else None
    if not isinstance(streams, dict) or set(doc) != {"streams"}:
        raise ConfigError(f"directory file {path}: expected one table `streams` of tables, one per stream")
    return {name: _stream(path, name, fields) for name, fields in streams.items()}


def _stream(path: Path, name: str, fields: Any) -> StreamInfo:
    where = f"directory file {path}, stream {name!r}"
    try:
        validate_stream_name(name)
    except ProtocolError as exc:
        raise ConfigError(f"{where}: {exc.reason}") from None
    if not isinstance(fields, dict) or set(fields) - set(_FIELDS):
        raise ConfigError(f"{where}: expected a table of {', '.join(_FIELDS)}")
    channels = fields.get("channels", [])
    if not isinstance(channels, list):
        raise ConfigError(f"{where}: channels is a list of endpoints like udp://239.192.1.11:5011")
    sidecar, ingest = _tcp(where, fields, "sidecar"), _tcp(where, fields, "ingest")
    node = f"file {path.name}"
    return StreamInfo(
        name,
        channels=tuple(_channel(where, text) for text in channels),
        named=(sidecar,) if sidecar else (),
        ingests=(ingest,) if ingest else (),
        nodes=(node,),
        holders=(Holder(node, *_copy(where, fields)),),
    )


def _copy(where: str, fields: dict) -> tuple[str, str]:
    """The copy held (gateway.wire.announce.COPIES) and, for a mirror or promoted copy, its source."""
    copy = fields.get("copy", A.PRIMARY)
    if copy not in A.COPIES:
        raise ConfigError(f"{where}: copy {copy!r}: expected one of {', '.join(A.COPIES)}")
    source = _tcp(where, fields, "source")
    if source and copy == A.PRIMARY:
        raise ConfigError(f"{where}: source names a mirror's source sidecar: add copy = \"mirror\" (or \"promoted\"), "
                          "or leave source out")  # fmt: skip
    if source != A.announceable(source):
        raise ConfigError(f"{where}: source {source!r}: expected tcp://HOST:PORT, printable and at most 255 bytes")
    return copy, source


def _channel(where: str, text: object) -> A.Channel:
    if isinstance(text, str) and "://" in text:
        transport, _, rest = text.partition("://")
        try:
            endpoint = Endpoint.parse(f"{transport}://any;{rest}")
        except ValueError:
            pass
        else:
            if endpoint.transport in A.TRANSPORTS:
                return A.Channel(endpoint.transport, endpoint.group, endpoint.port)
    raise ConfigError(f"{where}: channel {text!r}: expected TRANSPORT://GROUP:PORT, e.g. udp://239.192.1.11:5011")


def _tcp(where: str, fields: dict, name: str) -> str:
    value = fields.get(name, "")
    if not isinstance(value, str) or (value and not value.startswith("tcp://")):
        raise ConfigError(f"{where}: {name} {value!r}: expected tcp://HOST:PORT")
    return value
