"""ZeroMQ messages in a byte buffer, framed as libzmq's norm:// frames them: the NORM stream and udp:// datagrams.

Each frame is one flag byte (FIRST_FRAME for a message's first frame, NEXT_FRAME for the next ones) and a
ZMTP/2 frame: flags (bit 0 MORE, bit 1 LONG), the size in 1 byte (or 8 bytes big-endian when LONG), the data.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

FIRST_FRAME = 0x00
NEXT_FRAME = 0xFF
MORE = 0x01
LONG = 0x02
_LONG_SIZE = struct.Struct(">Q")


def encode_message(frames: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """One message as a byte string."""
    parts: list[bytes | bytearray | memoryview] = []
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = MORE if i < last else 0
        size = len(frame)
        flag = FIRST_FRAME if i == 0 else NEXT_FRAME
        if size < 256:
            parts.append(bytes((flag, more, size)))
        else:
            parts.append(bytes((flag, more | LONG)) + _LONG_SIZE.pack(size))
        parts.append(frame)
    return b"".join(parts)


def frame_header(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int, int, int] | None:
    """(flag byte, ZMTP flags, data size, header size) of the frame at `pos`; None if the header is cut off."""
    if end - pos < 3:
        return None
    flag, zflags = data[pos], data[pos + 1]
    if not zflags & LONG:
        return flag, zflags, data[pos + 2], 3
    if end - pos < 2 + _LONG_SIZE.size:
        return None
    return flag, zflags, _LONG_SIZE.unpack_from(data, pos + 2)[0], 2 + _LONG_SIZE.size
