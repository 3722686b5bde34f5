"""The payload of a multicast message: a record batch, or a heartbeat (both wire formats, no sockets).

A heartbeat (magic b"ZH") carries the stream's head sequence and the replay endpoint, so a subscriber detects
tail loss and finds the replay sidecar from the multicast alone (DAFKA's HEAD message does the same).

The leader of a replicated group (docs/ha.md) adds its epoch: flag bit 0 of the second byte (0 until now, and
ignored by readers) says that 8 more bytes follow the replay endpoint. A single gateway sends exactly the
layout it always did, so readers that predate epochs keep working with it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from gateway.errors import BatchError, McastError
from gateway.wire.batch import MAGIC as BATCH_MAGIC
from gateway.wire.batch import Batch

HEARTBEAT_MAGIC = b"ZH"
_HEARTBEAT = struct.Struct("<2sBBIQQ")
_EPOCH = struct.Struct("<Q")
FLAG_EPOCH = 0x01


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The stream's head (last journaled sequence) and where to ask for what the multicast lost."""

    head: int
    ts_ns: int
    replay: str
    gateway_id: int
    epoch: int = 0  # the leader's epoch in a replicated group; 0: a single gateway

    def encode(self) -> bytes:
        replay = self.replay.encode()
        if len(replay) > 255:
            raise McastError(f"replay endpoint {self.replay!r} is over 255 bytes")
        flags = FLAG_EPOCH if self.epoch else 0
        fixed = _HEARTBEAT.pack(HEARTBEAT_MAGIC, 1, flags, self.gateway_id, self.head, self.ts_ns)
        out = fixed + bytes([len(replay)]) + replay
        return out + _EPOCH.pack(self.epoch) if self.epoch else out

    @classmethod
    def decode(cls, data: bytes | memoryview) -> Heartbeat:
        if len(data) < _HEARTBEAT.size + 1:
            raise McastError(f"heartbeat of {len(data)} bytes is truncated")
        _, version, flags, gateway_id, head, ts_ns = _HEARTBEAT.unpack_from(data)
        if version != 1:
            raise McastError(f"unsupported heartbeat version {version}")
        n = data[_HEARTBEAT.size]
        replay = bytes(data[_HEARTBEAT.size + 1 :])
        epoch = 0
        if flags & FLAG_EPOCH and len(replay) == n + _EPOCH.size:
            (epoch,), replay = _EPOCH.unpack_from(replay, n), replay[:n]
        if len(replay) != n:
            raise McastError(f"heartbeat replay endpoint claims {n} bytes, has {len(replay)}")
        try:
            return cls(head, ts_ns, replay.decode("ascii"), gateway_id, epoch)
        except UnicodeDecodeError as exc:
            raise McastError("heartbeat replay endpoint is not ASCII") from exc


def parse_payload(payload: bytes | memoryview) -> Batch | Heartbeat:
    """Decode the second frame of a multicast message; anything else raises McastError (count and drop it)."""
    magic = bytes(payload[:2])
    if magic == BATCH_MAGIC:
        try:
            return Batch.parse(payload)
        except BatchError as exc:
            raise McastError(f"bad batch: {exc.reason}") from exc
    if magic == HEARTBEAT_MAGIC:
        return Heartbeat.decode(payload)
    raise McastError(f"unknown payload magic {magic!r}")
