"""Record batches: the one binary format on multicast, in the journal and over replay.

A batch is a header followed by records. It is built once, by the gateway, and from then on only copied:
the journal appends its bytes, multicast sends them, replay reads and sends them. Nothing re-encodes records.

Layout (all integers little-endian)::

    header (40 bytes)
      0  magic        2s   b"ZB"
      2  version      u8   1
      3  flags        u8   FLAG_TTL (0x02) | FLAG_PRODUCER (0x04), or 0; unknown flags are rejected
      4  length       u32  total bytes of the batch, header included
      8  crc          u32  CRC32C of bytes [12, length)
      12 count        u32  number of records
      16 first_seq    u64  \\ coverage: the batch accounts for every record of the stream in
      24 last_seq     u64  /  [first_seq, last_seq] (all of them, or all that match a replay filter)
      32 ts_ns        u64  journal time of the batch, set by the gateway, never decreasing
    with FLAG_PRODUCER, the header has 16 more bytes (56 in all; records start there):
      40 producer_id  u64  the publisher that wrote every record of the batch
      48 producer_seq u64  that publisher's own number for the batch's first record (the next ones follow)
    record (17 bytes + key + body), repeated `count` times
      0  delta        u32  sequence - first_seq; strictly increasing, <= last_seq - first_seq
      4  ts_ns        u64  publish time of the record (the publisher's clock, or the gateway's)
      12 key_len      u8
      13 body_len     u32
      17 key          key_len bytes (UTF-8 routing key)
         body         body_len bytes
    with FLAG_TTL, every record of the batch has one more header field (21 bytes + key + body):
      17 ttl_ms       u32  time to live after ts_ns, in ms; 0: none (key and body follow at 21)

FLAG_TTL is set only when a publisher gives some record a TTL, so batches without one stay byte-identical to
the format before it. The first 17 bytes of a record are the same either way: walkers differ only in where
the key starts (`Batch.overhead`).

FLAG_PRODUCER is how exactly-once publishing survives a crash: a journaled batch says whose records it holds
and which of that producer's numbers, so the gateway rebuilds "highest number journaled per producer" from the
journal's tail alone (docs/gateway.md, "Exactly-once publishing"). A cut of such a batch (`part`, `split`)
keeps it, numbers adjusted; a filtered one (`select`) drops it, as it no longer holds a producer's whole run.

Why deltas rather than absolute sequences: a publisher's batch is sequenced by rewriting the header alone
(`resequence`), and a filtered replay batch (`select`) is built by copying record slices unchanged,
keeping the source's coverage. Both are O(1) Python work per batch, not per record.

A batch with no records may still cover a range: it tells a filtered client that the range holds nothing
for it. A *dense* batch holds every sequence of its coverage (live batches always are).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from crc32c import crc32c

from gateway.errors import BatchError
from gateway.wire import record_loops as loops
from gateway.wire.record_loops import DELTA as _DELTA
from gateway.wire.record_loops import MAX_KEY as MAX_KEY  # re-exported: the format's limits and record header
from gateway.wire.record_loops import MAX_TTL_MS as MAX_TTL_MS
from gateway.wire.record_loops import RECORD as RECORD
from gateway.wire.record_loops import RECORD_TTL as RECORD_TTL

MAGIC = b"ZB"
VERSION = 1
HEADER = struct.Struct("<2sBBIIIQQQ")
HEADER_SIZE = HEADER.size  # 40
PRODUCER = struct.Struct("<QQ")  # producer_id, producer_seq: after the header, with FLAG_PRODUCER
PRODUCER_HEADER_SIZE = HEADER_SIZE + PRODUCER.size  # 56
RECORD_OVERHEAD = RECORD.size  # 17
RECORD_TTL_OVERHEAD = RECORD_TTL.size  # 21
FLAG_TTL = 0x02
FLAG_PRODUCER = 0x04
KNOWN_FLAGS = FLAG_TTL | FLAG_PRODUCER
MAX_PRODUCER = 2**64 - 1
MAX_SEQ = 2**64 - 1
# crc32c keeps the GIL: a batch is at most a few MiB (about 100 µs at the hardware CRC's speed), and releasing it
# hands the GIL to a busy thread and then waits to get it back (the Publisher's IO thread did, once a batch).
_KEEP_GIL = 0
MAX_BATCH = 64 * 1024 * 1024
Bytes = bytes | memoryview  # a key or body as given to encode(): a copy or a view into another batch
_CRC_FROM = 12
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class Record:
    """One record as handed to applications."""

    seq: int
    ts_ns: int
    key: str
    body: bytes
    ttl_ms: int = 0  # 0: no time to live


class Batch:
    """A validated, read-only view over one encoded batch. Parsing checks the CRC and every record bound."""

    __slots__ = ("buf", "count", "first_seq", "flags", "last_seq", "ts_ns")

    def __init__(self, buf: memoryview, count: int, first_seq: int, last_seq: int, ts_ns: int, flags: int = 0) -> None:
        self.buf = buf
        self.count = count
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.ts_ns = ts_ns
        self.flags = flags

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, *, check_crc: bool = True) -> Batch:
        """Validate `data` as exactly one batch. Raises BatchError naming the first fault found."""
        buf = memoryview(data)
        if buf.format != "B" or buf.ndim != 1:
            buf = buf.cast("B")
        count, first, last, ts_ns, flags = _check_header(buf, len(buf))
        if check_crc:
            _check_crc(buf)
        fault = loops.check(buf, count, last - first, _overhead(flags), _header_size(flags))
        if fault is not None:
            raise BatchError(fault)
        return cls(buf, count, first, last, ts_ns, flags)

    @property
    def nbytes(self) -> int:
        return len(self.buf)

    @property
    def overhead(self) -> int:
        """Bytes of each record's header in this batch: where its key starts."""
        return _overhead(self.flags)

    @property
    def header_size(self) -> int:
        """Bytes before the first record: HEADER_SIZE, or PRODUCER_HEADER_SIZE with FLAG_PRODUCER."""
        return _header_size(self.flags)

    @property
    def payload_bytes(self) -> int:
        """Bytes of the records' keys and bodies: the batch without its header and record headers."""
        flags = self.flags
        return len(self.buf) - _header_size(flags) - self.count * _overhead(flags)

    @property
    def producer(self) -> tuple[int, int] | None:
        """(producer_id, producer_seq of the first record) of a FLAG_PRODUCER batch; None otherwise."""
        if not self.flags & FLAG_PRODUCER:
            return None
        pid, pseq = PRODUCER.unpack_from(self.buf, HEADER_SIZE)
        return pid, pseq

    @property
    def crc(self) -> int:
        """The CRC32C its header holds (checked by `parse`): with the coverage, what names this batch's bytes."""
        return int(_LENGTH.unpack_from(self.buf, 8)[0])

    @property
    def dense(self) -> bool:
        return self.count == self.last_seq - self.first_seq + 1

    def __len__(self) -> int:
        return self.count

    def __bytes__(self) -> bytes:
        return bytes(self.buf)

    def __repr__(self) -> str:
        return f"Batch(seq {self.first_seq}..{self.last_seq}, {self.count} records, {self.nbytes} bytes)"

    def raw(self, lo: int = 0, hi: int = MAX_SEQ) -> Iterator[tuple[int, int, memoryview, memoryview]]:
        """Yield (seq, ts_ns, key, body) for records with lo <= seq <= hi; key and body are views."""
        return self._walk(lo, hi, False)

    def entries(self, lo: int = 0, hi: int = MAX_SEQ) -> Iterator[tuple[int, int, memoryview, memoryview, int]]:
        """Yield (seq, ts_ns, key, body, ttl_ms) for records with lo <= seq <= hi; ttl_ms 0 means none."""
        return self._walk(lo, hi, True)

    def _walk(self, lo: int, hi: int, with_ttl: bool) -> Iterator:
        lo, hi = max(lo, self.first_seq), min(hi, self.last_seq)
        if lo > hi or not self.count:
            return iter(())
        walk = loops.entries(self.buf, self.first_seq, self.count, self.overhead, self.header_size, lo, hi, with_ttl)
        return iter(walk)

    def records(self, lo: int = 0, hi: int = MAX_SEQ, prefixes: tuple[bytes, ...] = ()) -> Iterator[Record]:
        """Yield Records with lo <= seq <= hi whose key starts with one of `prefixes` (all when empty)."""
        for seq, ts, key, body, ttl in self.entries(lo, hi):
            kb = key.tobytes()
            if not prefixes or kb.startswith(prefixes):
                yield Record(seq, ts, kb.decode(errors="replace"), body.tobytes(), ttl)

    def select(self, prefixes: tuple[bytes, ...]) -> bytes:
        """A batch with the same coverage holding only the records whose key starts with one of `prefixes`.

        Record slices are copied as they are; only the header is new.
        """
        if not prefixes:
            return bytes(self.buf)
        buf, unpack, overhead = self.buf, RECORD.unpack_from, self.overhead
        parts: list[memoryview] = []
        pos = self.header_size
        for _ in range(self.count):
            _, _, klen, blen = unpack(buf, pos)
            k = pos + overhead
            end = k + klen + blen
            if buf[k : k + klen].tobytes().startswith(prefixes):
                parts.append(buf[pos:end])
            pos = end
        return _seal(parts, len(parts), self.first_seq, self.last_seq, self.ts_ns, self.flags & ~FLAG_PRODUCER)

    def part(self, lo: int, hi: int) -> bytes:
        """The records lo..hi of a dense batch as a dense batch covering exactly lo..hi, journal time kept.

        Record bytes (TTLs included) are copied; only each record's sequence delta is rewritten.
        """
        if not self.dense or not self.first_seq <= lo <= hi <= self.last_seq:
            raise BatchError(f"{self!r}: only a dense batch can be cut, and only within its coverage ({lo}..{hi})")
        buf, unpack, overhead = self.buf, RECORD.unpack_from, self.overhead
        parts: list[bytes | memoryview] = self._producer_part(lo)
        pos = self.header_size
        for i in range(hi - self.first_seq + 1):
            _, _, klen, blen = unpack(buf, pos)
            end = pos + overhead + klen + blen
            delta = self.first_seq + i - lo
            if delta >= 0:
                parts.append(_DELTA.pack(delta))
                parts.append(buf[pos + _DELTA.size : end])
            pos = end
        return _seal(parts, hi - lo + 1, lo, hi, self.ts_ns, self.flags)

    def split(self, max_bytes: int) -> Iterator[tuple[int, bytes]]:
        """A dense batch as consecutive dense batches of at most `max_bytes` each, as (last_seq, bytes).

        One pass (`record_loops.cut`, compiled when built); record bytes are copied and their sequence deltas
        rewritten, journal time kept. A record too large for `max_bytes` on its own becomes a batch of one (the
        caller decides what to do with it). What a datagram transport sends: each part stands alone, so losing
        one loses only its records.
        """
        if not self.dense:
            raise BatchError(f"{self!r}: only a dense batch can be split")
        producer, lo = self.producer, self.first_seq
        for n, out in loops.cut(self.buf, self.count, self.overhead, self.header_size, max_bytes, self.header_size):
            if producer is not None:
                PRODUCER.pack_into(out, HEADER_SIZE, producer[0], producer[1] + lo - self.first_seq)
            yield lo + n - 1, _finish(out, n, lo, lo + n - 1, self.ts_ns, self.flags)
            lo += n

    def _producer_part(self, lo: int) -> list[bytes | memoryview]:
        """The producer header of a cut starting at sequence lo (empty without FLAG_PRODUCER)."""
        producer = self.producer
        if producer is None:
            return []
        return [PRODUCER.pack(producer[0], producer[1] + lo - self.first_seq)]


def join(parts: Sequence[Batch]) -> bytes:
    """Consecutive parts of one dense batch (`split`'s or `part`'s, in order) as that batch: split's inverse.

    Record bytes are copied and their deltas rewritten relative to the first part's first_seq; journal time,
    flags and producer are the first part's, so a whole batch's parts give back its very bytes (its CRC says
    so). BatchError if the parts are not consecutive cuts of one batch.
    """
    head = parts[0]
    lo, ts, flags, overhead, producer = head.first_seq, head.ts_ns, head.flags, head.overhead, head.producer
    out = head._producer_part(lo)
    seq = lo
    for part in parts:
        if not part.dense or part.first_seq != seq or (part.ts_ns, part.flags) != (ts, flags):
            raise BatchError(f"{part!r} does not continue a batch at {seq} with journal time {ts}, flags {flags}")
        if producer is not None and part.producer != (producer[0], producer[1] + seq - lo):
            raise BatchError(f"{part!r} is not the same producer's run as the batch it would continue")
        buf, pos = part.buf, part.header_size
        for _ in range(part.count):
            _, _, klen, blen = RECORD.unpack_from(buf, pos)
            end = pos + overhead + klen + blen
            out.append(_DELTA.pack(seq - lo))
            out.append(buf[pos + _DELTA.size : end])
            pos, seq = end, seq + 1
    return _seal(out, seq - lo, lo, seq - 1, ts, flags)


def encode(
    first_seq: int,
    records: Iterable[tuple[int, Bytes, Bytes]] | Iterable[tuple[int, Bytes, Bytes, int]],
    *,
    ts_ns: int = 0,
    ttl: bool = False,
    producer: tuple[int, int] | None = None,
) -> bytes:
    """Encode a dense batch of (ts_ns, key, body) records numbered first_seq, first_seq + 1, ...

    With ttl=True the records are (ts_ns, key, body, ttl_ms) and the batch has FLAG_TTL. With
    producer=(producer_id, producer_seq) the batch has FLAG_PRODUCER: those are its first record's.
    Publishers encode with first_seq=0; the gateway then assigns real sequences with `resequence`.
    """
    return bytes(encode_after(0, first_seq, records, ts_ns=ts_ns, ttl=ttl, producer=producer))


def encode_after(
    reserve: int,
    first_seq: int,
    records: Iterable[tuple[int, Bytes, Bytes]] | Iterable[tuple[int, Bytes, Bytes, int]],
    *,
    ts_ns: int = 0,
    ttl: bool = False,
    producer: tuple[int, int] | None = None,
) -> bytearray:
    """encode()'s batch after `reserve` free bytes, in the buffer it was built in: a sender writes its frame's
    head there and sends the whole, the records copied once (the Publisher's PUBLISH-BATCH)."""
    flags = (FLAG_TTL if ttl else 0) | (FLAG_PRODUCER if producer is not None else 0)
    rows: Iterable[tuple] = records if reserve == 0 or isinstance(records, list) else list(records)  # read twice
    try:
        out, n = loops.pack(rows, ttl, reserve + _header_size(flags), reserve + MAX_BATCH)
    except ValueError as exc:
        message = str(exc)
        if reserve:  # its sizes count the reserve: the message without it
            try:
                loops.pack(rows, ttl, _header_size(flags), MAX_BATCH)
            except ValueError as plain:
                message = str(plain)
        raise BatchError(message) from None
    if n == 0:
        raise BatchError("a batch of records needs at least one record (use empty() to cover a range)")
    if producer is not None:
        PRODUCER.pack_into(out, reserve + HEADER_SIZE, *producer)
    _write_header(out, reserve, n, first_seq, first_seq + n - 1, ts_ns, flags)
    return out


def empty(first_seq: int, last_seq: int, ts_ns: int = 0) -> bytes:
    """A batch of no records covering [first_seq, last_seq]: 'nothing here for you' to a filtered client."""
    return _seal([], 0, first_seq, last_seq, ts_ns)


def resequence(batch: Batch, first_seq: int, ts_ns: int) -> bytes:
    """Give a dense publisher batch its sequences and journal time: a new header, the records copied."""
    if not batch.dense or batch.count == 0:
        raise BatchError("only a dense, non-empty batch can be sequenced")
    # One copy (the join): the header is packed first, its CRC carried on over the records (the producer
    # header, if any, is copied with them). The gateway sequences every batch so: each copy of ~60 KB costs.
    body = batch.buf[HEADER_SIZE:]
    last = first_seq + batch.count - 1
    head = HEADER.pack(MAGIC, VERSION, batch.flags, batch.nbytes, 0, batch.count, first_seq, last, ts_ns)
    crc = crc32c(body, value=crc32c(head[_CRC_FROM:], gil_release_mode=_KEEP_GIL), gil_release_mode=_KEEP_GIL)
    return b"".join((head[:8], _LENGTH.pack(crc), head[_CRC_FROM:], body))


def assemble(
    parts: list[bytes | memoryview], count: int, first_seq: int, last_seq: int, ts_ns: int, flags: int
) -> bytes:
    """A batch from `count` records already laid out as `flags` says, deltas relative to first_seq (a sparse
    batch covering first_seq..last_seq, such as a snapshot's). Batch.parse checks what the caller vouches for."""
    return _seal(parts, count, first_seq, last_seq, ts_ns, flags)


def frame_length(buf: bytes | memoryview, offset: int = 0) -> int:
    """The total length a batch starting at `offset` claims, from its header alone (for stream scanning)."""
    if len(buf) - offset < HEADER_SIZE:
        raise BatchError(f"truncated header: {len(buf) - offset} of {HEADER_SIZE} bytes")
    if buf[offset : offset + 2] != MAGIC:
        raise BatchError(f"bad magic {bytes(buf[offset : offset + 2])!r}, expected {MAGIC!r}")
    (length,) = _LENGTH.unpack_from(buf, offset + 4)
    if not HEADER_SIZE <= length <= MAX_BATCH:
        raise BatchError(f"batch length {length} outside {HEADER_SIZE}..{MAX_BATCH}")
    return length


def _header_size(flags: int) -> int:
    return PRODUCER_HEADER_SIZE if flags & FLAG_PRODUCER else HEADER_SIZE


def _overhead(flags: int) -> int:
    return RECORD_TTL_OVERHEAD if flags & FLAG_TTL else RECORD_OVERHEAD


def _seal(parts: list, count: int, first_seq: int, last_seq: int, ts_ns: int, flags: int = 0) -> bytes:
    body_len = sum(len(p) for p in parts)
    if HEADER_SIZE + body_len > MAX_BATCH:
        raise BatchError(f"batch of {HEADER_SIZE + body_len} bytes is over the limit of {MAX_BATCH}")
    out = bytearray(HEADER_SIZE + body_len)
    out[HEADER_SIZE:] = b"".join(parts)
    return _finish(out, count, first_seq, last_seq, ts_ns, flags)


def _finish(out: bytearray, count: int, first_seq: int, last_seq: int, ts_ns: int, flags: int) -> bytes:
    """The batch whose records fill `out` after HEADER_SIZE reserved bytes: its header and CRC written."""
    _write_header(out, 0, count, first_seq, last_seq, ts_ns, flags)
    return bytes(out)


def _write_header(out: bytearray, at: int, count: int, first_seq: int, last_seq: int, ts_ns: int, flags: int) -> None:
    """Header and CRC of the batch that fills `out` from byte `at` to its end."""
    HEADER.pack_into(out, at, MAGIC, VERSION, flags, len(out) - at, 0, count, first_seq, last_seq, ts_ns)
    struct.pack_into("<I", out, at + 8, crc32c(memoryview(out)[at + _CRC_FROM :], gil_release_mode=_KEEP_GIL))


def _check_header(buf: memoryview, available: int) -> tuple[int, int, int, int, int]:
    length = frame_length(buf)
    if length != available:
        raise BatchError(f"batch claims {length} bytes but {available} were given")
    _, version, flags, _, _, count, first, last, ts_ns = HEADER.unpack_from(buf)
    if version != VERSION:
        raise BatchError(f"unsupported batch version {version} (this build reads {VERSION})")
    if flags & ~KNOWN_FLAGS:
        raise BatchError(f"unsupported batch flags 0x{flags:02x}")
    if length < _header_size(flags):
        raise BatchError(f"batch of {length} bytes is shorter than its {_header_size(flags)}-byte header")
    if last < first:
        raise BatchError(f"coverage {first}..{last} is empty")
    if count > last - first + 1:
        raise BatchError(f"{count} records cannot fit coverage {first}..{last}")
    return count, first, last, ts_ns, flags


def _check_crc(buf: memoryview) -> None:
    (stored,) = _LENGTH.unpack_from(buf, 8)
    actual = crc32c(buf[_CRC_FROM:], gil_release_mode=_KEEP_GIL)
    if stored != actual:
        raise BatchError(f"CRC32C mismatch: stored 0x{stored:08x}, computed 0x{actual:08x}")
