"""Multicast framing, endpoints and pacing (no network: the lab tests exercise real sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import McastError
from gateway.mcast import Endpoint
from gateway.wire import batch as B
from gateway.wire.heartbeat import Heartbeat, parse_payload


def test_endpoint_parse_and_format() -> None:
    ep = Endpoint.parse("epgm://veth1;239.192.1.1:5555")
    assert (ep.transport, ep.interface, ep.group, ep.port) == ("epgm", "veth1", "239.192.1.1", 5555)
    assert str(ep) == "epgm://veth1;239.192.1.1:5555"
    assert Endpoint.parse("norm://10.0.0.1;239.1.2.3:7000").resolve().interface == "10.0.0.1"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("tcp://a;239.1.1.1:1", "expected one of"),
        ("epgm://239.1.1.1:5555", "name the interface"),
        ("epgm://eth9;10.1.1.1:5555", "not a multicast address"),
        ("epgm://eth9;239.1.1.1:0", "outside 1..65535"),
        ("epgm://eth9;239.1.1.1:x", "GROUP:PORT"),
    ],
)
def test_endpoint_errors_say_what_to_write(text: str, reason: str) -> None:
    with pytest.raises(McastError, match=reason):
        Endpoint.parse(text)


@given(
    st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.text("abc:/.0123456789", max_size=60),
    st.integers(0, 2**64 - 1),
)  # fmt: skip
def test_heartbeat_round_trip(head: int, ts: int, replay: str, epoch: int) -> None:
    hb = Heartbeat(head, ts, replay, 42, epoch)
    assert parse_payload(hb.encode()) == hb


def test_a_heartbeat_without_epoch_keeps_the_old_layout() -> None:
    """What a single gateway sends is byte for byte what readers that predate epochs parse."""
    old = bytes.fromhex("5a4801002a000000") + (7).to_bytes(8, "little") + (9).to_bytes(8, "little") + b"\x03a:1"
    assert Heartbeat(7, 9, "a:1", 42).encode() == old
    assert parse_payload(Heartbeat(7, 9, "a:1", 42, epoch=5).encode()) == Heartbeat(7, 9, "a:1", 42, 5)


@given(st.binary(max_size=80))
def test_payload_junk_raises_only_mcast_error(junk: bytes) -> None:
    try:
        parse_payload(junk)
    except McastError:
        return
    # A random string that parses must be a well-formed heartbeat or batch.
    assert junk[:2] in (b"ZH", b"ZB")


def test_payload_distinguishes_batches() -> None:
    raw = B.encode(3, [(1, b"k", b"v")])
    got = parse_payload(raw)
    assert isinstance(got, B.Batch) and got.first_seq == 3
    with pytest.raises(McastError, match="bad batch: CRC32C mismatch"):
        parse_payload(raw[:-1] + b"X")
