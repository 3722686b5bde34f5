"""Fill datagrams: a subscriber's re-request to the replay sidecar over UDP, and the sidecar's answers.

MoldUDP64's idea in ZEPS terms: a gap in a udp:// feed is asked for in one small datagram, and the records
come back in unicast datagrams, each holding one record batch in the one batch format (the bytes the journal
holds), so a lost answer costs one short timer rather than TCP's retransmission timeout (>= 200 ms). TCP
FETCH stays for large ranges and as the fallback (docs/protocol.md, "Fill datagrams").

    request: magic b"ZF", version u8 = 1, kind u8 = 1, request_id u32, first u64, count u16,
             stream: u8 length + UTF-8 name[, authenticator (24 bytes, gateway.wire.streamkey)]
    answer:  magic b"ZF", version u8 = 1, kind u8 = 2, request_id u32, batch (its length is in its header)
             [, authenticator]

Numbers are big-endian, as in ZEPS frames. With a stream key the authenticator's tag covers the stream name
and every byte before the authenticator (`StreamKey.tag`); the magic keeps a fill datagram's tag from ever
passing for a multicast message's (whose payload starts with a batch's b"ZB" or a heartbeat). Decoding is
strict: anything else (a short or long datagram, an unknown version or kind, a count of 0, a bad name)
raises FillError, which the receiver counts and drops.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass

from gateway.errors import FillError, Unauthenticated
from gateway.wire import batch as B
from gateway.wire.streamkey import AUTH, AUTH_MAGIC, AUTH_VERSION, StreamKey, parse_auth

MAGIC = b"ZF"
VERSION = 1
KIND_REQUEST = 1
KIND_ANSWER = 2
HEAD = struct.Struct(">2sBBI")  # magic, version, kind, request_id: 8 bytes
RANGE = struct.Struct(">QH")  # first, count
MAX_COUNT = 0xFFFF
MAX_STREAM = 255
MAX_REQUEST_ID = 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class FillRequest:
    """Records first .. first + count - 1 of `stream`, for the request `request_id` (echoed in the answers)."""

    request_id: int
    stream: str
    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1


def encode_request(req: FillRequest, key: StreamKey | None = None) -> bytes:
    name = req.stream.encode()
    if not (0 <= req.request_id <= MAX_REQUEST_ID and req.first >= 1 and 1 <= req.count <= MAX_COUNT):
        raise FillError(f"request {req.request_id} of {req.first} x {req.count} does not fit a fill datagram")
    if not 1 <= len(name) <= MAX_STREAM:
        raise FillError(f"a stream name has 1 to {MAX_STREAM} bytes, not {len(name)}")
    body = HEAD.pack(MAGIC, VERSION, KIND_REQUEST, req.request_id) + RANGE.pack(req.first, req.count)
    return _sign(body + bytes((len(name),)) + name, name, key)


def decode_request(data: bytes | memoryview, keys: dict[int, StreamKey] | None = None) -> FillRequest:
    """The request in `data`; with `keys` (key id -> key) it must carry a tag that checks out with one."""
    view = memoryview(data)
    rid = _head(view, KIND_REQUEST)
    at = HEAD.size + RANGE.size
    if len(view) < at + 1:
        raise FillError(f"a fill request of {len(view)} bytes is cut short")
    first, count = RANGE.unpack_from(view, HEAD.size)
    end = at + 1 + view[at]
    name = view[at + 1 : end]
    if not name or len(view) < end:
        raise FillError("a fill request's stream name is empty or cut short")
    if first < 1 or count < 1 or first + count - 1 > B.MAX_SEQ:
        raise FillError(f"a fill request for {first} x {count}: sequences start at 1 and count is at least 1")
    _check_auth(view, end, name, keys)
    try:
        stream = name.tobytes().decode()
    except UnicodeDecodeError:
        raise FillError("a fill request's stream name is not UTF-8") from None
    return FillRequest(rid, stream, first, count)


def encode_answer(request_id: int, batch: bytes | memoryview, stream: bytes, key: StreamKey | None = None) -> bytes:
    """One answer datagram carrying `batch` as it is (journal bytes, or a cut of them)."""
    return _sign(HEAD.pack(MAGIC, VERSION, KIND_ANSWER, request_id) + bytes(batch), stream, key)


def answer_bytes(batch_bytes: int, key: StreamKey | None) -> int:
    """The size of the answer datagram for a batch of `batch_bytes`."""
    return HEAD.size + batch_bytes + (AUTH.size if key is not None else 0)


def decode_answer(
    data: bytes | memoryview, stream: bytes, keys: dict[int, StreamKey] | None = None
) -> tuple[int, B.Batch]:
    """(request_id, batch) of an answer; the batch is parsed (CRC and bounds checked) as a view of `data`."""
    view = memoryview(data)
    rid = _head(view, KIND_ANSWER)
    header = view[HEAD.size : HEAD.size + B.HEADER_SIZE]
    if len(header) < B.HEADER_SIZE:
        raise FillError(f"a fill answer of {len(view)} bytes is cut short")
    (length,) = struct.unpack_from("<I", header, 4)  # the batch header's length field (gateway.wire.batch)
    end = HEAD.size + length
    if len(view) < end:
        raise FillError(f"a fill answer's batch of {length} bytes overruns the {len(view)}-byte datagram")
    _check_auth(view, end, stream, keys)
    try:
        return rid, B.Batch.parse(view[HEAD.size : end])
    except B.BatchError as exc:
        raise FillError(f"a fill answer's batch is damaged: {exc.reason}") from None


def _head(view: memoryview, kind: int) -> int:
    if len(view) < HEAD.size:
        raise FillError(f"a datagram of {len(view)} bytes is no fill datagram")
    magic, version, got, rid = HEAD.unpack_from(view)
    if magic != MAGIC or version != VERSION or got != kind:
        raise FillError(f"not a fill datagram of kind {kind}: magic {magic!r}, version {version}, kind {got}")
    return int(rid)


def _sign(body: bytes, stream: bytes | memoryview, key: StreamKey | None) -> bytes:
    if key is None:
        return body
    return body + AUTH.pack(AUTH_MAGIC, AUTH_VERSION, key.id, key.tag(stream, body))


def _check_auth(view: memoryview, end: int, stream: bytes | memoryview, keys: dict[int, StreamKey] | None) -> None:
    """Nothing may follow the body but, with keys, an authenticator that checks out with one of them."""
    rest = len(view) - end
    if not keys:
        if rest not in (0, AUTH.size):
            raise FillError(f"{rest} bytes after a fill datagram's body")
        return
    if rest != AUTH.size:
        raise FillError("a fill datagram without a valid authenticator (a stream key is required)")
    try:
        key_id, tag = parse_auth(view[end:])
    except Unauthenticated as exc:
        raise FillError(f"a fill datagram's authenticator is malformed: {exc}") from None
    key = keys.get(key_id)
    if key is None or not hmac.compare_digest(key.tag(stream, view[:end]), tag):
        raise FillError("a fill datagram whose tag does not check out with a stream key held here")
