"""Tests of the ZEPS codec: the command table against the spec, round trips, golden bytes, and hostile input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.strategies import COMMAND

from gateway.errors import ProtocolError
from gateway.wire import protocol as p
from gateway.wire.protocol import (
    COMMANDS,
    Attach,
    Deliver,
    Extend,
    Fetch,
    Invalid,
    Ping,
    Publish,
    PublishOk,
    Wire,
    decode,
    encode,
    invalid,
    is_zeps,
    printable,
    validate_stream_name,
)

# The grammar written out independently of the module: id -> (name, [(field, wire type)], feature).
N1, N2, N4, N8, S, SS, C = "number-1", "number-2", "number-4", "number-8", "string", "strings", "chunk"
SPEC = {
    1: ("ATTACH", [("protocol", S), ("version", N2), ("stream", S)], None),
    2: ("ATTACH-OK", [], None),
    3: ("SUBSCRIBE", [("pattern", S), ("latest", N8)], None),
    4: ("SUBSCRIBE-OK", [], None),
    5: ("CREDIT", [("credit", N8)], None),
    6: ("PUBLISH", [("key", S), ("body", C)], None),
    7: ("DELIVER", [("sequence", N8), ("key", S), ("body", C)], None),
    8: ("PING", [], None),
    9: ("PING-OK", [], None),
    10: ("DETACH", [], None),
    11: ("DETACH-OK", [], None),
    12: ("INVALID", [("reason", S)], None),
    13: ("EXTEND", [("features", SS)], None),
    14: ("EXTEND-OK", [("features", SS)], None),
    15: ("SUBSCRIBE-TIME", [("pattern", S), ("since_ns", N8)], "time"),
    16: ("FETCH", [("request_id", N4), ("pattern", S), ("first", N8), ("last", N8)], "range"),
    17: ("FETCH-END", [("request_id", N4), ("first", N8), ("last", N8)], "range"),
    18: ("TRIMMED", [("requested", N8), ("first_retained", N8)], "range"),
    19: ("DELIVER-BATCH", [("batch", C)], "batch"),
    20: ("PUBLISH-OK", [("sequence", N8), ("count", N4)], "confirm"),
    21: ("PUBLISH-BATCH", [("batch", C)], "batch"),
    22: ("SNAPSHOT", [("prefixes", SS)], "snapshot"),
    23: ("SNAPSHOT-END", [("last", N8), ("records", N8)], "snapshot"),
    24: (
        "REPLICA-ACK",
        [("node", S), ("stream", S), ("epoch", N8), ("sequence", N8), ("durable", N8), ("mac", C)],
        None,
    ),
    25: ("REPLICA-COMMIT", [("stream", S), ("epoch", N8), ("sequence", N8), ("head", N8)], None),
    26: ("REPLICA-BATCH", [("stream", S), ("epoch", N8), ("committed", N8), ("batch", C)], None),
    27: ("MIRROR", [("source", S)], "mirror"),
    28: ("MIRROR-OK", [("head", N8), ("head_ts_ns", N8)], "mirror"),
    29: ("PROMOTE", [], "mirror"),
    30: ("PROMOTE-OK", [("head", N8)], "mirror"),
    31: ("TAIL-UDP", [("port", N2), ("token", N8), ("mode", S)], "datagram-tail"),
}


def test_table_matches_the_grammar() -> None:
    got = {i: (s.name, [(n, str(w)) for n, w in s.fields], s.feature) for i, s in COMMANDS.items()}
    assert got == SPEC
    for cmd_id, spec in COMMANDS.items():
        assert (cmd_id, spec.name, spec.feature) == (spec.cls.ID, spec.cls.NAME, spec.cls.FEATURE)
    assert {
        "batch",
        "confirm",
        "range",
        "time",
        "snapshot",
        "producer",
        "uncommitted",
        "mirror",
        "datagram-tail",
    } == p.FEATURES
    assert {s.feature for s in COMMANDS.values()} - {None} <= p.FEATURES


# --- strategies ------------------------------------------------------------------------------------------


def _outcome(frame: bytes, decoder=decode) -> object:
    try:
        return decoder(frame)
    except ProtocolError as exc:
        _assert_sendable(exc.reason)
        return exc.reason


def _assert_sendable(reason: str) -> None:
    assert reason and all(" " <= c <= "~" for c in reason), reason
    assert len(reason.encode()) <= 255


# --- round trips -----------------------------------------------------------------------------------------


@given(COMMAND)
def test_round_trip(cmd: p.Command) -> None:
    frame = encode(cmd)
    assert frame[:3] == p.SIGNATURE + bytes([cmd.ID])
    for view in (frame, bytearray(frame), memoryview(frame)):
        assert decode(view) == cmd
    assert encode(decode(frame)) == frame


@pytest.mark.parametrize("cls", [s.cls for s in COMMANDS.values()])
def test_every_command_at_its_maximum(cls: type[p.Command]) -> None:
    biggest = {
        Wire.NUMBER_2: 2**16 - 1,
        Wire.NUMBER_4: 2**32 - 1,
        Wire.NUMBER_8: 2**64 - 1,
        Wire.STRING: "z" * 255,
        Wire.STRINGS: ("y" * 255,) * 255,
        Wire.CHUNK: bytes(range(256)) * 4096,
    }
    kw = {n: p.PROTOCOL if n == "protocol" else biggest[w] for n, w in COMMANDS[cls.ID].fields}
    assert decode(encode(cls(**kw))) == cls(**kw)


def test_chunks_are_zero_copy_views_of_the_frame() -> None:
    frame = encode(Deliver(1, "k", b"payload"))
    body = decode(frame).body
    assert isinstance(body, memoryview)
    assert body.obj is frame
    assert bytes(body) == b"payload"


def test_decode_accepts_views_of_any_format() -> None:
    frame = encode(Invalid("abcd"))  # 8 bytes: viewable as two 32-bit words
    assert decode(memoryview(frame).cast("I")) == Invalid("abcd")


# --- golden bytes, written by hand from the grammar ------------------------------------------------------

GOLDEN = [
    (Attach("ZEPS", 1, "s"), "AA A5 01 04 5A 45 50 53 00 01 01 73"),
    (p.AttachOk(), "AA A5 02"),
    (p.Subscribe("a.*", 7), "AA A5 03 03 61 2E 2A 00 00 00 00 00 00 00 07"),
    (p.Credit(2**32), "AA A5 05 00 00 00 01 00 00 00 00"),
    (Publish("k", b"\x00\xff"), "AA A5 06 01 6B 00 00 00 02 00 FF"),
    (Deliver(258, "", b"hi"), "AA A5 07 00 00 00 00 00 00 01 02 00 00 00 00 02 68 69"),
    (Ping(), "AA A5 08"),
    (p.DetachOk(), "AA A5 0B"),
    (Invalid("no"), "AA A5 0C 02 6E 6F"),
    (Extend(("batch", "")), "AA A5 0D 02 05 62 61 74 63 68 00"),
    (p.ExtendOk(()), "AA A5 0E 00"),
    (Fetch(1, "", 2, 3), "AA A5 10 00 00 00 01 00" + " 00" * 7 + " 02" + " 00" * 7 + " 03"),
    (p.Trimmed(5, 9), "AA A5 12" + " 00" * 7 + " 05" + " 00" * 7 + " 09"),
    (PublishOk(16, 3), "AA A5 14 00 00 00 00 00 00 00 10 00 00 00 03"),
    (p.PublishBatch(b""), "AA A5 15 00 00 00 00"),
]


@pytest.mark.parametrize(("cmd", "hexa"), GOLDEN, ids=[c.NAME for c, _ in GOLDEN])
def test_golden_bytes(cmd: p.Command, hexa: str) -> None:
    assert encode(cmd) == bytes.fromhex(hexa)
    assert decode(bytes.fromhex(hexa)) == cmd


# --- hostile input ---------------------------------------------------------------------------------------


@given(COMMAND)
@settings(max_examples=60)
def test_every_truncation_raises_protocol_error(cmd: p.Command) -> None:
    frame = encode(cmd)
    for cut in {*range(min(len(frame), 400)), *range(max(0, len(frame) - 400), len(frame))}:
        with pytest.raises(ProtocolError) as info:
            decode(frame[:cut])
        _assert_sendable(info.value.reason)


@given(
    st.binary(max_size=64)
    | st.integers(1, 30).flatmap(lambda i: st.binary(max_size=64).map(lambda tail: p.SIGNATURE + bytes([i]) + tail))
)
@example(b"\xaa\xa5\x0d\x05\x01\xff")
def test_random_bytes_are_rejected_or_canonical(frame: bytes) -> None:
    result = _outcome(frame)
    if isinstance(result, p.Command):
        assert encode(result) == frame


MUTATION = st.tuples(st.sampled_from(["flip", "insert", "delete", "set"]), st.integers(0, 10_000), st.integers(0, 255))


@given(COMMAND, st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_frames_are_rejected_or_canonical(cmd: p.Command, mutations: list) -> None:
    frame = bytearray(encode(cmd))
    for kind, where, value in mutations:
        at = where % (len(frame) + 1)
        if kind == "insert":
            frame[at:at] = bytes([value])
        elif frame and at < len(frame):
            if kind == "delete":
                del frame[at]
            else:
                frame[at] = value if kind == "set" else frame[at] ^ (1 << value % 8)
    frame = bytes(frame)
    result = _outcome(frame)
    if isinstance(result, p.Command):
        assert encode(result) == frame
    if frame[:3] in (b"\xaa\xa5\x06", b"\xaa\xa5\x07", b"\xaa\xa5\x15"):  # the fast paths agree with the generic one
        assert result == _outcome(memoryview(frame), p._decode_generic)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"", "bad signature"),
        (b"\xaa", "bad signature"),
        (b"\xaa\xa4\x08", "bad signature"),
        (b"\xaa\xa5", "truncated frame: signature but no command id"),
        (b"\xaa\xa5\x63", "unknown command 99"),
        (b"\xaa\xa5\x20", "unknown command 32"),
        (b"\xaa\xa5\x08abc", "trailing 3 bytes after PING"),
        (
            b"\xaa\xa5\x07" + bytes(8) + b"\x00\x00\x00\x01\xf4" + bytes(12),
            "truncated DELIVER: body chunk needs 500 bytes, 12 left",
        ),
        (b"\xaa\xa5\x07" + bytes(5), "truncated DELIVER: sequence number-8 needs 8 bytes, 5 left"),
        (b"\xaa\xa5\x06\x05ab", "truncated PUBLISH: key string needs 5 bytes, 2 left"),
        (b"\xaa\xa5\x06\x01\xff\x00\x00\x00\x00", "invalid UTF-8 in PUBLISH string field 'key' at byte 0"),
        (b"\xaa\xa5\x0d\x02\x01a\x01\xc3", "invalid UTF-8 in EXTEND string field 'features[1]' at byte 0"),
        (b"\xaa\xa5\x0d\x02\x01a", "truncated EXTEND: features[1] string length needs 1 bytes, 0 left"),
        (b"\xaa\xa5\x01\x03XYZ\x00\x01\x01s", "ATTACH protocol must be 'ZEPS', got 'XYZ'"),
        (b"\xaa\xa5\x01\x04zeps\x00\x01\x01s", "ATTACH protocol must be 'ZEPS', got 'zeps'"),
    ],
)
def test_decode_reasons(frame: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(frame)
    assert info.value.reason == reason == str(info.value)
    assert isinstance(info.value, ValueError)


def test_reason_is_printable_and_fits_invalid() -> None:
    reason = printable("caf\u00e9\n\x00" + "x" * 1000)
    _assert_sendable(reason)
    assert reason.startswith("caf\\xe9\\n\\x00xxx") and reason.endswith("...")
    assert len(reason) == 255
    long_protocol = b"\xaa\xa5\x01\xff" + b"\xe2\x82\xac" * 85 + b"\x00\x01\x01s"
    with pytest.raises(ProtocolError) as info:
        decode(long_protocol)
    _assert_sendable(info.value.reason)
    assert info.value.reason.startswith("ATTACH protocol must be 'ZEPS', got '\\u20ac")


@pytest.mark.parametrize("reason", ["", "short", "x" * 300, "\u00e9\t" * 200])
def test_invalid_frame_always_encodes(reason: str) -> None:
    cmd = decode(invalid(reason))
    assert isinstance(cmd, Invalid)
    assert all(" " <= c <= "~" for c in cmd.reason) and len(cmd.reason) <= 255
    assert cmd.reason == reason if len(reason) <= 255 and reason.isascii() else cmd.reason.endswith("...")


# --- encoding errors name the field ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Publish("k" * 256, b""), ["PUBLISH", "'key'", "256 bytes", "max 255"]),
        (lambda: Publish("\u00e9" * 128, b""), ["PUBLISH", "'key'", "256 bytes"]),
        (lambda: Publish("\ud800", b""), ["PUBLISH", "'key'", "UTF-8"]),
        (lambda: Publish(b"k", b""), ["PUBLISH", "'key'", "must be str", "bytes"]),
        (lambda: Publish("k", "text"), ["PUBLISH", "'body'", "bytes-like", "str"]),
        (lambda: Deliver(-1, "k", b""), ["DELIVER", "'sequence'", "0..18446744073709551615", "-1"]),
        (lambda: Deliver(2**64, "k", b""), ["DELIVER", "'sequence'", "18446744073709551616"]),
        (lambda: Deliver(1.0, "k", b""), ["DELIVER", "'sequence'", "1.0"]),
        (lambda: Attach("ZEPS", 65536, "s"), ["ATTACH", "'version'", "0..65535"]),
        (lambda: PublishOk(1, 2**32), ["PUBLISH-OK", "'count'", "0..4294967295"]),
        (lambda: Extend(("a",) * 256), ["EXTEND", "'features'", "256 strings"]),
        (lambda: Extend(("ok", "x" * 300)), ["EXTEND", "'features[1]'", "300 bytes"]),
        (lambda: Extend("batch"), ["EXTEND", "'features'", "tuple of str"]),
        (lambda: Invalid(None), ["INVALID", "'reason'", "NoneType"]),
    ],
)
def test_encode_rejects_values_naming_the_field(make, words: list[str]) -> None:
    with pytest.raises(ProtocolError) as info:
        encode(make())
    for word in words:
        assert word in info.value.reason
    _assert_sendable(info.value.reason)


def test_attach_protocol_is_fixed_and_encode_needs_a_command() -> None:
    with pytest.raises(ProtocolError, match="ATTACH protocol must be 'ZEPS', got 'ZMTP'"):
        Attach("ZMTP", 1, "s")
    with pytest.raises(TypeError, match="ZEPS command"):
        encode(b"\xaa\xa5\x08")  # type: ignore[arg-type]


def test_encode_accepts_any_contiguous_buffer_for_chunks() -> None:
    words = memoryview(struct.pack(">2I", 1, 2)).cast("I")
    assert encode(Publish("k", words)) == encode(Publish("k", struct.pack(">2I", 1, 2)))
    assert encode(Deliver(1, "k", bytearray(b"ab"))) == encode(Deliver(1, "k", b"ab"))


def test_lists_encode_like_tuples() -> None:
    assert encode(Extend(["batch", "time"])) == encode(Extend(("batch", "time")))  # type: ignore[arg-type]


def test_repr_shows_small_chunks_and_sizes_of_large_ones() -> None:
    assert repr(decode(encode(Deliver(3, "k", b"hi")))) == "Deliver(sequence=3, key='k', body=b'hi')"
    assert repr(decode(encode(Publish("k", bytes(33))))) == "Publish(key='k', body=<33 bytes>)"


# --- helpers ---------------------------------------------------------------------------------------------


def test_is_zeps() -> None:
    assert is_zeps(encode(Ping()))
    assert is_zeps(memoryview(b"\xaa\xa5"))
    assert is_zeps(bytearray(b"\xaa\xa5\x63"))  # signed but garbage: the server answers INVALID
    for frame in (b"", b"\xaa", b"\xa5\xaa\x08", b"GET / HTTP/1.1"):
        assert not is_zeps(frame)


@pytest.mark.parametrize("name", ["s", "orders", "a.b-c_d~!", "x" * 255, "..."])
def test_valid_stream_names(name: str) -> None:
    assert validate_stream_name(name) == name


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("", "non-empty"),
        ("x" * 256, "256 bytes, max 255"),
        ("a b", "without spaces"),
        ("a/b", "'/'"),
        ("caf\u00e9", "printable ASCII"),
        ("tab\t", "printable ASCII"),
        (".", "must not be '.'"),
        ("..", "must not be '..'"),
        (None, "non-empty str"),
    ],
)
def test_invalid_stream_names(name: str, words: str) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_stream_name(name)
    assert words in info.value.reason
    _assert_sendable(info.value.reason)


def test_head_of_a_one_chunk_command_is_what_encode_puts_before_the_chunk() -> None:
    chunk = bytes(range(200))
    assert p.head_of(p.PublishBatch, len(chunk)) + chunk == p.encode(p.PublishBatch(chunk))
    with pytest.raises(TypeError, match="not a command of one chunk field"):
        p.head_of(p.Publish, 3)
