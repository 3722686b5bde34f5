"""libzmq's epgm:// frame encoding (ZMTP/1): sizes around the short/long boundary, MORE flags, cut-off headers."""

from __future__ import annotations

import pytest

from gateway.wire.framing import MORE, encode_v1, v1_frame_header


def decode(data: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while (header := v1_frame_header(data, pos, len(data))) is not None:
        flags, size, head = header
        out.append((flags, data[pos + head : pos + head + size]))
        pos += head + size
    assert pos == len(data)
    return out


@pytest.mark.parametrize("size", [0, 1, 253, 254, 255, 256, 70_000])
def test_frames_round_trip_with_more_on_all_but_the_last(size: int) -> None:
    frames = [b"stream", bytes(range(256)) * (size // 256) + bytes(size % 256), b""]
    assert decode(encode_v1(frames)) == [(MORE, frames[0]), (MORE, frames[1]), (0, frames[2])]


def test_the_size_counts_the_flags_byte_and_255_takes_the_long_form() -> None:
    assert encode_v1([b"abc"]) == b"\x04\x00abc"  # as libzmq's v1_encoder writes it
    assert encode_v1([bytes(254)])[:10] == b"\xff" + (255).to_bytes(8, "big") + b"\x00"


def test_a_cut_off_header_is_none_and_a_zero_size_is_flagged() -> None:
    assert v1_frame_header(b"\x04", 0, 1) is None
    assert v1_frame_header(b"\xff\x00\x00", 0, 3) is None
    assert v1_frame_header(b"\x00\x00", 0, 2) == (0, -1, 2)
