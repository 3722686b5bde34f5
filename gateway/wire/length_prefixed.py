"""Frames on a byte stream: a 4-byte big-endian length, then that many bytes (the peer link's framing).

Sans-IO: `Deframer` takes whatever bytes a socket gave and hands back whole frames; `header` is what goes in
front of one. A length over the receiver's limit is refused before any of the frame is buffered, so a peer
cannot make the receiver hold more than one limit's worth of bytes.
"""

from __future__ import annotations

import struct

from gateway.errors import ProtocolError

_LENGTH = struct.Struct(">I")
HEADER_SIZE = _LENGTH.size


def header(size: int) -> bytes:
    """What goes before a frame of `size` bytes."""
    return _LENGTH.pack(size)


class Deframer:
    """Whole frames out of a byte stream fed in pieces of any size."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0  # where the next frame's header starts in _buf

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]  # what was handed out already
            self._pos = 0
        self._buf += data

    def next(self) -> bytes | None:
        """The next whole frame, or None until more bytes come; ProtocolError for a length over the limit (not a
        peer of this protocol, or a hostile one)."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_SIZE:
            return None
        (size,) = _LENGTH.unpack_from(buf, pos)
        if size > self.max_frame:
            raise ProtocolError(f"a frame of {size:,} bytes, over the limit of {self.max_frame:,}")
        start = pos + HEADER_SIZE
        end = start + size
        if len(buf) < end:
            return None
        self._pos = end
        with memoryview(buf) as view:
            return bytes(view[start:end])

    @property
    def partial(self) -> bool:
        """Whether bytes of an unfinished frame are buffered (a stream that ends now was cut mid-frame)."""
        return len(self._buf) > self._pos
