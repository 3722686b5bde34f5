"""libzmq's PGM packetisation (gateway.wire.apdu): joins, spans, packed APDUs, other senders, broken framing.

Every rule runs on both reassemblers: the Python one and the C one of the native receive loop
(gateway/transport/_pgm_loop.c), and generated streams check that the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.transport import _pgm_loop
from gateway.wire.apdu import NO_MESSAGE_START, Reassembler, packetise
from gateway.wire.framing import encode_v1

Make = Callable[..., Reassembler | _pgm_loop.Reassembler]

A, B = b"sender-A", b"sender-B"


def apdu(offset: int, body: bytes) -> bytes:
    return offset.to_bytes(2, "big") + body


def feed(r: Reassembler | _pgm_loop.Reassembler, sender: bytes, apdus: list[bytes]) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    for a in apdus:
        r.feed(sender, a, out)
    return out


@pytest.fixture(params=[Reassembler, _pgm_loop.Reassembler], ids=["python", "c"])
def make(request: pytest.FixtureRequest) -> Make:
    return request.param


def test_a_message_larger_than_a_packet_spans_apdus_and_comes_back_whole(make: Make) -> None:
    message = [b"s.x", bytes(range(256)) * 40, b"tail"]
    apdus = packetise(message, 1400)
    assert len(apdus) == 8 and all(len(a) <= 1400 for a in apdus)
    assert [a[:2] for a in apdus] == [b"\x00\x00"] + [b"\xff\xff"] * 7
    assert feed(make([b"s."]), A, apdus) == [message]


def test_a_libzmq_packed_apdu_and_a_late_join_at_the_offset(make: Make) -> None:
    first, second, third = [b"s.1", b"x" * 10], [b"s.2", b"y"], [b"s.3", b"z" * 300]
    data = encode_v1(first) + encode_v1(second) + encode_v1(third)
    cut = len(encode_v1(first)) // 2  # the first message started in an earlier APDU
    packed = apdu(len(data[cut:]) - len(data) + len(encode_v1(first)), data[cut:])
    assert feed(make([b"s."]), A, [packed]) == [second, third]


def test_a_receiver_skips_until_a_message_starts_and_filters_by_prefix(make: Make) -> None:
    r = make([b"s."])
    tail = apdu(NO_MESSAGE_START, encode_v1([b"s.lost", b"q"])[3:])
    assert feed(r, A, [tail, *packetise([b"other", b"1"], 1400), *packetise([b"s.a", b"2"], 1400)]) == [[b"s.a", b"2"]]


def test_senders_are_reassembled_apart_and_a_loss_waits_for_the_next_start(make: Make) -> None:
    r, out = make(), list[list[bytes]]()
    big_a, big_b = [b"a", bytes(3000)], [b"b", bytes(2000)]
    pa, pb = packetise(big_a, 1400), packetise(big_b, 1400)
    for x, y in zip(pa, [*pb, b""], strict=False):  # interleaved packets of two senders
        r.feed(A, x, out)
        if y:
            r.feed(B, y, out)
    assert sorted(out) == sorted([big_a, big_b])
    out.clear()
    r.feed(A, pa[0], out)
    r.lose(A)  # the transport gave up on data after pa[0]
    r.feed(A, pa[1], out)  # a continuation: skipped
    r.feed(A, packetise([b"a", b"next"], 1400)[0], out)
    assert out == [[b"a", b"next"]] and r.junk == 0


def test_broken_framing_costs_only_the_messages_it_touches(make: Make) -> None:
    r = make()
    good = packetise([b"s", b"ok"], 1400)[0]
    truncated = apdu(0, encode_v1([b"s", bytes(500)])[:100])  # a frame that never ends
    zero_size = apdu(0, b"\x00\x00")
    bad_offset = apdu(50, b"short")
    out = feed(r, A, [truncated, good, zero_size, good, bad_offset, good, b"\x01"])
    assert out == [[b"s", b"ok"]] * 3
    assert r.junk == 4


_message = st.lists(st.binary(max_size=600), min_size=1, max_size=4).map(lambda f: [b"s" + f[0], *f[1:]])


@st.composite
def _streams(draw: st.DrawFn) -> list[tuple[bytes, bytes]]:
    """APDUs of two senders: whole messages, libzmq-style packed runs, lost packets, junk."""
    out: list[tuple[bytes, bytes]] = []
    for _ in range(draw(st.integers(1, 12))):
        sender = draw(st.sampled_from([A, B]))
        kind = draw(st.sampled_from(["message", "packed", "drop", "junk"]))
        if kind == "junk":
            out.append((sender, draw(st.binary(max_size=40))))
            continue
        messages = draw(st.lists(_message, min_size=1, max_size=3))
        if kind == "packed":
            data = b"".join(encode_v1(m) for m in messages)
            cut = draw(st.integers(0, len(data)))
            offset = draw(st.sampled_from([0, NO_MESSAGE_START, min(cut, len(data) - cut)]))
            out.append((sender, apdu(offset, data[cut:])))
            continue
        apdus = [a for m in messages for a in packetise(m, draw(st.integers(16, 1400)))]
        if kind == "drop" and len(apdus) > 1:
            del apdus[draw(st.integers(0, len(apdus) - 1))]
        out += [(sender, a) for a in apdus]
    return out


@settings(max_examples=300, deadline=None)
@given(_streams(), st.sampled_from([(b"",), (b"s\x00",), (b"s", b"x"), ()]))
def test_the_c_reassembler_agrees_with_the_python_one(stream: list[tuple[bytes, bytes]], subs: Sequence[bytes]) -> None:
    py, c = Reassembler(subs, 300), _pgm_loop.Reassembler(subs, 300)  # some frames are too large
    out_py: list[list[bytes]] = []
    out_c: list[list[bytes]] = []
    for sender, a in stream:
        py.feed(sender, a, out_py)
        c.feed(sender, a, out_c)
    assert out_c == out_py and c.junk == py.junk


# Frames around the ZMTP/1 long-size threshold (255 bytes with the flags byte), empty ones, and views.
_frames = st.lists(st.one_of(st.binary(max_size=300), st.binary(min_size=250, max_size=4000)), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(_frames, st.integers(3, 1500), st.booleans())
def test_the_c_packetise_the_send_loop_queues_agrees_with_the_python_one(
    frames: list[bytes], mss: int, views: bool
) -> None:
    message = [memoryview(f) if views else f for f in frames]
    assert _pgm_loop.packetise(message, mss) == packetise(frames, mss)


def test_the_c_packetise_refuses_what_cannot_be_a_message() -> None:
    with pytest.raises(ValueError, match="at least one frame"):
        _pgm_loop.packetise([], 1400)
    with pytest.raises(ValueError, match="mss"):
        _pgm_loop.packetise([b"s"], 2)
    with pytest.raises(TypeError):
        _pgm_loop.packetise([b"s", "text"], 1400)
