"""ZeroMQ messages in a byte buffer, framed as libzmq frames them on its multicast transports.

norm:// (the NORM stream and udp:// datagrams): each frame is one flag byte (FIRST_FRAME for a message's first
frame, NEXT_FRAME for the next ones) and a ZMTP/2 frame: flags (bit 0 MORE, bit 1 LONG), the size in 1 byte
(or 8 bytes big-endian when LONG), the data.

epgm:// and pgm:// (libzmq's v1 encoder, src/v1_encoder.cpp): each frame is a ZMTP/1 frame: the size of
flags + data in 1 byte (or 0xFF and 8 bytes big-endian when it is 255 or more), the flags byte (bit 0 MORE),
the data. The PGM packetisation around it is `gateway.transport.pgm`'s.
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


def encode_v1(frames: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """One message as ZMTP/1 frames (libzmq's epgm:// encoding)."""
    parts: list[bytes | bytearray | memoryview] = []
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = MORE if i < last else 0
        size = len(frame) + 1
        parts.append(bytes((size, more)) if size < 255 else b"\xff" + _LONG_SIZE.pack(size) + bytes((more,)))
        parts.append(frame)
    return b"".join(parts)


def v1_frame_header(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int, int] | None:
    """(ZMTP flags, data size, header size) of the ZMTP/1 frame at `pos`; None if the header is cut off.

    The data size is -1 for a frame that cannot be ZMTP/1 (a size of 0 leaves no room for its flags byte).
    """
    if end - pos < 2:
        return None
    size = data[pos]
    if size != 0xFF:
        return data[pos + 1], size - 1, 2
    if end - pos < 10:
        return None
    return data[pos + 9], _LONG_SIZE.unpack_from(data, pos + 1)[0] - 1, 10
