"""The discovery announcement codec: round trips, every truncation refused, junk, signatures."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import McastError, Unauthenticated
from gateway.wire import announce as A
from gateway.wire.streamkey import AUTH, StreamKey

KEY = StreamKey(b"k" * 32)


def sample(**changes: object) -> A.Announcement:
    fields: dict[str, object] = {
        "role": A.GATEWAY,
        "node_id": 0xDEADBEEF,
        "node": "gw-1",
        "streams": (
            A.StreamAd("px", 42, 1000, (A.Channel("udp", "239.192.1.1", 5001), A.Channel("epgm", "239.192.1.2", 5002))),
            A.StreamAd("tr", 7, 0, (A.Channel("norm", "239.192.2.1", 5003),)),
        ),
        "ingest": "tcp://10.0.0.1:5570",
        "sidecar": "tcp://10.0.0.1:5580",
        "sent_ns": 1_700_000_000_000_000_000,
        "epoch": 3,
        "leader": True,
    }
    fields.update(changes)
    return A.Announcement(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", [None, KEY])
def test_round_trip(key: StreamKey | None) -> None:
    ann = sample()
    assert A.decode(ann.encode(key), [KEY] if key else []) == ann


def test_a_sidecar_announces_streams_without_channels() -> None:
    ann = A.Announcement(A.SIDECAR, 1, "replay-1", (A.StreamAd("px"),), sidecar="tcp://10.0.0.2:5580")
    assert A.decode(ann.encode()) == ann


@pytest.mark.parametrize("key", [None, KEY])
def test_every_truncation_is_refused(key: StreamKey | None) -> None:
    data = sample().encode(key)
    for n in range(len(data)):
        if key is None and n == len(data) - AUTH.size:
            continue
        with pytest.raises(McastError):
            A.decode(data[:n], [KEY] if key else [])


def test_trailing_bytes_are_refused() -> None:
    data = sample().encode()
    for extra in (b"\0", b"\0" * (AUTH.size - 1), b"\0" * (AUTH.size + 1)):
        with pytest.raises(McastError):
            A.decode(data + extra)


def test_a_body_length_that_lies_is_refused() -> None:
    data = bytearray(sample().encode())
    struct.pack_into("<H", data, 28, len(data) - 30 - 1)  # the body length field
    with pytest.raises(McastError):
        A.decode(bytes(data))


@pytest.mark.parametrize(
    ("offset", "value"),
    [(0, ord("X")), (2, 2), (3, 9)],  # magic, version, role
)
def test_bad_header_fields_are_refused(offset: int, value: int) -> None:
    data = bytearray(sample().encode())
    data[offset] = value
    with pytest.raises(McastError):
        A.decode(bytes(data))


def test_with_a_key_unsigned_forged_and_foreign_announcements_are_refused() -> None:
    with pytest.raises(Unauthenticated) as unsigned:
        A.decode(sample().encode(), [KEY])
    assert unsigned.value.kind == "unsigned"
    forged = bytearray(sample().encode(KEY))
    forged[40] ^= 1  # the payload changed under the tag (a redirected endpoint)
    with pytest.raises(Unauthenticated) as bad:
        A.decode(bytes(forged), [KEY])
    assert bad.value.kind == "bad-tag"
    with pytest.raises(Unauthenticated) as foreign:
        A.decode(sample().encode(StreamKey(b"r" * 32)), [KEY])
    assert foreign.value.kind == "unknown-key"


def test_a_multicast_signature_does_not_sign_an_announcement() -> None:
    """The tag is over the pseudo stream DOMAIN: a tag a key holder made for a stream message does not pass."""
    unsigned = sample().encode()
    stolen = KEY.frames(b"px", unsigned)[2]
    with pytest.raises(Unauthenticated):
        A.decode(unsigned + stolen, [KEY])


def test_bad_channels_and_names_are_refused() -> None:
    for ann in (
        sample(streams=(A.StreamAd("px", channels=(A.Channel("udp", "10.0.0.1", 5001),)),)),
        sample(streams=(A.StreamAd("px", channels=(A.Channel("udp", "239.192.1.1", 0),)),)),
    ):
        with pytest.raises(McastError):
            A.decode(ann.encode())
    data = sample().encode()
    at = data.index(b"px")
    with pytest.raises(McastError):
        A.decode(data[:at] + b"p/" + data[at + 2 :])  # '/' is never in a stream name
    with pytest.raises(McastError):
        sample(node="gw 1").encode()


def test_many_streams_are_spread_over_datagrams_that_each_fit() -> None:
    streams = tuple(
        A.StreamAd(f"stream-{i:04d}", i, i, (A.Channel("udp", "239.192.3.1", 6000 + i),)) for i in range(300)
    )
    datagrams = sample(streams=streams).encode_all(KEY)
    assert len(datagrams) > 1 and all(len(d) <= A.MAX_BYTES for d in datagrams)
    assert tuple(s for d in datagrams for s in A.decode(d, [KEY]).streams) == streams
    with pytest.raises(McastError):
        sample(streams=streams).encode()


@given(st.binary(max_size=200))
def test_junk_raises_mcast_error_only(junk: bytes) -> None:
    for data in (junk, A.MAGIC + bytes([A.VERSION]) + junk):
        with pytest.raises(McastError):
            A.decode(data)


@given(st.integers(0, len(sample().encode(KEY)) * 8 - 1))
def test_a_flipped_bit_is_refused_or_decodes_with_a_key_never_anything_else(bit: int) -> None:
    mangled = bytearray(sample().encode(KEY))
    mangled[bit // 8] ^= 1 << (bit % 8)
    with contextlib.suppress(McastError):
        A.decode(bytes(mangled))  # without the key: another valid announcement, or McastError
    with pytest.raises(McastError):
        A.decode(bytes(mangled), [KEY])  # with it: never accepted
