"""libzmq's PGM packetisation (epgm://, pgm://), sans IO: messages to APDUs and APDUs of many senders back.

Rules (libzmq src/pgm_sender.cpp, src/pgm_receiver.cpp; docs/pgm.md):
- An APDU is one PGM packet's payload: a 2-byte big-endian offset to the first message that starts in it
  (NO_MESSAGE_START if none does), then ZMTP/1 frames (`gateway.wire.framing.encode_v1`), a message being its
  frames up to the first without MORE. A message may span APDUs; an APDU may hold several messages.
- `packetise` starts each message in a new APDU (offset 0) and cuts it into APDUs of at most `mss` bytes.
- `Reassembler` keeps one stream per sender (TSI). A stream joins at its first APDU with an offset and, after
  `lose` (the transport gave up on some of that sender's data), waits for the next such APDU. Every offset is
  also a resynchronisation point: the bytes before it must end the message in progress exactly, else the
  sender's framing is broken, the partial message is dropped and `junk` counts it. Frames that cannot be
  ZMTP/1 (a size of 0, or over `max_message_bytes`) count as junk too and unjoin the stream.

| state of the sender's stream | APDU offset | action |
|---|---|---|
| not joined | NO_MESSAGE_START | skip the APDU (inside a message whose start was not seen) |
| not joined | o <= body length | join: parse from o |
| joined | NO_MESSAGE_START | append the body, parse |
| joined | o <= body length | append body[:o], parse; if anything is left over: junk; parse from o |
| any | o > body length, or APDU under 2 bytes | junk; unjoin |
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from gateway.wire.framing import MORE, encode_v1, v1_frame_header

NO_MESSAGE_START = 0xFFFF
_OFFSET = struct.Struct(">H")


def packetise(frames: Sequence[bytes | bytearray | memoryview], mss: int) -> list[bytes]:
    """One message as APDUs of at most `mss` bytes: the first with offset 0, the rest NO_MESSAGE_START."""
    data, chunk = encode_v1(frames), mss - _OFFSET.size
    out = [_OFFSET.pack(0) + data[:chunk]]
    out += [_OFFSET.pack(NO_MESSAGE_START) + data[i : i + chunk] for i in range(chunk, len(data), chunk)]
    return out


class _Stream:
    """One sender's stream: joined at a message start, bytes not yet parsed, the frames of the message so far."""

    __slots__ = ("data", "frames", "joined")

    def __init__(self) -> None:
        self.data = bytearray()
        self.frames: list[bytes] = []
        self.joined = False

    def unjoin(self) -> None:
        self.data.clear()
        self.frames = []
        self.joined = False


class Reassembler:
    """Whole messages from the APDUs of any number of senders, those whose first frame starts with a prefix
    in `subscriptions` (as a ZeroMQ SUB: b"" takes every message, no prefix none)."""

    def __init__(self, subscriptions: Sequence[bytes] = (b"",), max_message_bytes: int = 64 * 1024 * 1024) -> None:
        self.subscriptions = tuple(subscriptions)
        self.max_message_bytes = max_message_bytes
        self.junk = 0
        self._streams: dict[bytes, _Stream] = {}

    def feed(self, sender: bytes, apdu: bytes | memoryview, out: list[list[bytes]]) -> None:
        """Add one APDU of `sender` and append the subscribed messages it completes to `out`."""
        stream = self._streams.get(sender)
        if stream is None:
            stream = self._streams[sender] = _Stream()
        if len(apdu) < _OFFSET.size:
            self.junk += 1
            stream.unjoin()
            return
        offset = _OFFSET.unpack_from(apdu)[0]
        body = memoryview(apdu)[_OFFSET.size :]
        if offset == NO_MESSAGE_START:
            if stream.joined:
                stream.data += body
                self._parse(stream, out)
            return
        if offset > len(body):
            self.junk += 1
            stream.unjoin()
            return
        if stream.joined and offset:
            stream.data += body[:offset]
            self._parse(stream, out)
        if stream.joined and (stream.data or stream.frames):
            self.junk += 1  # the message in progress did not end where the next one starts
        stream.unjoin()
        stream.joined = True
        stream.data += body[offset:]
        self._parse(stream, out)

    def lose(self, sender: bytes) -> None:
        """Some of `sender`'s data is gone for good: resume its stream at its next message start."""
        stream = self._streams.get(sender)
        if stream is not None:
            stream.unjoin()

    def lose_all(self) -> None:
        """Every sender's data may be gone (a new transport session): resume each at its next message start."""
        self._streams.clear()

    def _parse(self, stream: _Stream, out: list[list[bytes]]) -> None:
        data, pos, end = stream.data, 0, len(stream.data)
        while (header := v1_frame_header(data, pos, end)) is not None:
            zflags, size, head = header
            if size < 0 or size > self.max_message_bytes:
                self.junk += 1
                stream.unjoin()  # not libzmq's framing: wait for the next message start
                return
            if end - pos < head + size:
                break
            stream.frames.append(bytes(data[pos + head : pos + head + size]))
            pos += head + size
            if not zflags & MORE:
                frames, stream.frames = stream.frames, []
                if frames[0].startswith(self.subscriptions):
                    out.append(frames)
        del data[:pos]
