"""udp:// datagrams: the framing round-trips, anything cut or padded is refused, batches are cut to fit.

Sending and receiving are tested between lab hosts (test_gateway_lab, test_reconcile_lab, test_auth_lab):
multicast only ever leaves a namespace the tests made.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import McastError, UdpError
from gateway.mcast import Tuning
from gateway.transport.udp import DATAGRAM_BYTES, batch_room, decode_message
from gateway.wire import batch as B
from gateway.wire.framing import encode_message
from gateway.wire.streamkey import AUTH

frames = st.lists(st.binary(max_size=600), min_size=1, max_size=4)


@given(frames)
def test_framing_round_trips(message: list[bytes]) -> None:
    got = decode_message(encode_message(message))
    assert [bytes(f) for f in got] == message
    assert isinstance(got[0], bytes)  # the stream name, compared and kept by the caller


@given(frames, st.data())
def test_a_cut_datagram_is_refused(message: list[bytes], data: st.DataObject) -> None:
    raw = encode_message(message)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(UdpError):
        decode_message(raw[:cut])


@given(frames, st.binary(min_size=1, max_size=20))
def test_bytes_after_the_last_frame_are_refused(message: list[bytes], extra: bytes) -> None:
    with pytest.raises(UdpError, match="after the last frame"):
        decode_message(encode_message(message) + extra)


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("stream", [b"s", b"orders.eu." * 20])
def test_batch_room_fills_the_datagram_exactly(stream: bytes, signed: bool) -> None:
    room = batch_room(DATAGRAM_BYTES, stream, AUTH.size if signed else 0)
    message = [stream, b"x" * room] + ([b"a" * AUTH.size] if signed else [])
    assert len(encode_message(message)) == DATAGRAM_BYTES


def test_split_batches_fill_the_room() -> None:
    room = batch_room(DATAGRAM_BYTES, b"feed", AUTH.size)
    published = B.Batch.parse(B.encode(0, [(1, b"k%03d" % i, b"v" * 100) for i in range(500)]))
    whole = B.Batch.parse(B.resequence(published, 1, 5))
    record = (whole.nbytes - B.HEADER_SIZE) // 500  # all records are the same size here
    per_part = (room - B.HEADER_SIZE) // record
    parts = list(whole.split(room))
    assert [last for last, _ in parts] == [*range(per_part, 500, per_part), 500]
    assert all(len(raw) <= room for _, raw in parts)


@pytest.mark.parametrize("size", [255, 65_508])
def test_datagram_size_out_of_range_is_refused(size: int) -> None:
    with pytest.raises(McastError, match="datagram_bytes"):
        Tuning(datagram_bytes=size)
