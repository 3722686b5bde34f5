"""Record batch format: round trips, re-sequencing, filtering, and rejection of every damaged input."""

from __future__ import annotations

import contextlib
import re
import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire import batch as B

keys = st.binary(max_size=B.MAX_KEY)
record = st.tuples(st.integers(0, 2**64 - 1), keys, st.binary(max_size=300))
records = st.lists(record, max_size=40)


@given(records.filter(bool), st.integers(0, 2**40))
def test_round_trip(recs: list[tuple[int, bytes, bytes]], first: int) -> None:
    raw = B.encode(first, recs, ts_ns=7)
    b = B.Batch.parse(raw)
    assert (b.count, b.first_seq, b.ts_ns, b.nbytes) == (len(recs), first, 7, len(raw))
    got = [(seq, ts, k.tobytes(), v.tobytes()) for seq, ts, k, v in b.raw()]
    assert got == [(first + i, ts, k, v) for i, (ts, k, v) in enumerate(recs)]
    assert b.dense


@given(records.filter(bool), st.integers(1, 2**40), st.integers(0, 2**63))
def test_resequence_rewrites_the_header_only(recs, first, ts) -> None:
    src = B.Batch.parse(B.encode(0, recs))
    out = B.Batch.parse(B.resequence(src, first, ts))
    assert (out.first_seq, out.last_seq, out.ts_ns) == (first, first + len(recs) - 1, ts)
    assert out.buf[B.HEADER_SIZE :] == src.buf[B.HEADER_SIZE :]
    assert [r.seq for r in out.records()] == list(range(first, first + len(recs)))


@given(records.filter(bool), st.lists(st.binary(max_size=3), max_size=3))
def test_select_keeps_coverage_and_matching_records(recs, prefixes) -> None:
    src = B.Batch.parse(B.encode(100, recs))
    picked = B.Batch.parse(src.select(tuple(prefixes)))
    assert (picked.first_seq, picked.last_seq) == (src.first_seq, src.last_seq)
    want = [(seq, k.tobytes()) for seq, _, k, _ in src.raw() if not prefixes or k.tobytes().startswith(tuple(prefixes))]
    assert [(seq, k.tobytes()) for seq, _, k, _ in picked.raw()] == want


@given(records.filter(bool), st.integers(1, 2**40), st.booleans(), st.integers(B.HEADER_SIZE, 2_000))
def test_split_cuts_into_contiguous_parts_that_fit(recs, first, ttl, max_bytes) -> None:
    entries = [(ts, k, v, i * 7) for i, (ts, k, v) in enumerate(recs)] if ttl else recs
    src = B.Batch.parse(B.encode(0, entries, ttl=ttl))
    whole = B.Batch.parse(B.resequence(src, first, 99))
    parts = [(last, B.Batch.parse(raw)) for last, raw in whole.split(max_bytes)]
    assert parts[0][1].first_seq == first and parts[-1][0] == whole.last_seq
    for (last, part), nxt in zip(parts, [*parts[1:], None], strict=True):
        assert part.dense and part.last_seq == last and part.ts_ns == 99 and part.flags == whole.flags
        assert part.nbytes <= max_bytes or part.count == 1  # only a record too large alone overshoots
        if nxt is not None:
            assert nxt[1].first_seq == last + 1
    for _, part in parts:  # the bytes on the wire: each part is the batch its records encode to
        records = [
            (ts, k.tobytes(), v.tobytes(), t) if ttl else (ts, k.tobytes(), v.tobytes())
            for _, ts, k, v, t in part.entries()
        ]
        assert part.buf.tobytes() == B.encode(part.first_seq, records, ts_ns=99, ttl=ttl)
    got = [entry for _, part in parts for entry in part.entries()]
    assert [(s, ts, k.tobytes(), v.tobytes(), t) for s, ts, k, v, t in got] == [
        (s, ts, k.tobytes(), v.tobytes(), t) for s, ts, k, v, t in whole.entries()
    ]


@given(records.filter(bool), st.integers(1, 2**40), st.booleans(), st.booleans(), st.integers(B.HEADER_SIZE, 600))
def test_join_gives_back_the_split_batch_byte_for_byte(recs, first, ttl, producer, max_bytes) -> None:
    entries = [(ts, k, v, i * 7) for i, (ts, k, v) in enumerate(recs)] if ttl else recs
    src = B.Batch.parse(B.encode(0, entries, ttl=ttl, producer=(9, 40) if producer else None))
    whole = B.Batch.parse(B.resequence(src, first, 99))
    parts = [B.Batch.parse(raw) for _, raw in whole.split(max_bytes)]
    joined = B.join(parts)
    assert joined == bytes(whole.buf) and B.Batch.parse(joined).crc == whole.crc


def test_join_refuses_parts_that_are_not_one_batch_in_order() -> None:
    whole = B.Batch.parse(B.resequence(B.Batch.parse(B.encode(0, [(0, b"k", b"x" * 30)] * 6)), 10, 5))
    a, b, c = (B.Batch.parse(raw) for _, raw in whole.split(B.HEADER_SIZE + 2 * 48))
    later = B.Batch.parse(B.resequence(B.Batch.parse(B.encode(0, [(0, b"k", b"x" * 30)] * 2)), 12, 6))
    for wrong in ([a, c], [b, a, c], [a, later, c]):
        with pytest.raises(B.BatchError, match="does not continue"):
            B.join(wrong)


@given(records.filter(bool), st.integers(0, B.MAX_PRODUCER), st.integers(0, 2**40), st.booleans())
def test_producer_header_survives_sequencing_and_cuts(recs, pid, pseq, ttl) -> None:
    entries = [(ts, k, v, i * 7) for i, (ts, k, v) in enumerate(recs)] if ttl else recs
    src = B.Batch.parse(B.encode(0, entries, ttl=ttl, producer=(pid, pseq)))
    assert src.producer == (pid, pseq) and src.header_size == B.PRODUCER_HEADER_SIZE
    whole = B.Batch.parse(B.resequence(src, 1000, 5))
    assert whole.producer == (pid, pseq) and whole.flags == src.flags
    assert [e[1:] for e in whole.entries()] == [e[1:] for e in src.entries()]
    n = len(recs)
    for lo in {1000, 1000 + n // 2, 1000 + n - 1}:
        cut = B.Batch.parse(whole.part(lo, 1000 + n - 1))
        assert cut.producer == (pid, pseq + lo - 1000)
        assert [e[2].tobytes() for e in cut.entries()] == [e[2].tobytes() for e in whole.entries(lo)]
    pieces = [B.Batch.parse(raw) for _, raw in whole.split(B.PRODUCER_HEADER_SIZE + 50)]
    assert [p.producer for p in pieces] == [(pid, pseq + p.first_seq - 1000) for p in pieces]
    picked = B.Batch.parse(whole.select((b"",)))  # a filtered view is no longer a producer's run
    assert picked.producer is None and picked.count == n


@given(records.filter(bool), st.integers(0, 64), st.booleans(), st.integers(0, 2**40))
def test_encode_after_is_encode_behind_a_reserve(recs, reserve, producer, first) -> None:
    """The Publisher's in-place PUBLISH-BATCH: the same batch bytes, `reserve` bytes in, the reserve untouched."""
    pid = (7, 9) if producer else None
    out = B.encode_after(reserve, first, recs, ts_ns=3, producer=pid)
    assert bytes(out[reserve:]) == B.encode(first, recs, ts_ns=3, producer=pid)
    assert out[:reserve] == bytes(reserve)


def test_encode_after_names_the_sizes_of_the_batch_not_of_the_reserve() -> None:
    big = [(0, b"k", b"x" * (B.MAX_BATCH // 3))] * 3
    with pytest.raises(B.BatchError) as plain:
        B.encode(0, big)
    with pytest.raises(B.BatchError) as after:
        B.encode_after(100, 0, iter(big))
    assert str(after.value) == str(plain.value) and f"limit of {B.MAX_BATCH}" in str(plain.value)


def test_producer_flag_needs_its_header() -> None:
    raw = bytearray(B.encode(1, [(0, b"", b"")]))  # 40 + 17 bytes: claims a producer header it lacks
    raw[3] = B.FLAG_PRODUCER
    with pytest.raises(B.BatchError):
        B.Batch.parse(raw, check_crc=False)
    short = bytearray(B.empty(1, 1))
    short[3] = B.FLAG_PRODUCER
    with pytest.raises(B.BatchError, match="shorter than its 56-byte header"):
        B.Batch.parse(short, check_crc=False)


def test_records_filters_by_range_and_prefix() -> None:
    b = B.Batch.parse(B.encode(10, [(i, b"a" if i % 2 else b"b", b"%d" % i) for i in range(10)]))
    got = [(r.seq, r.key, r.body) for r in b.records(12, 16, prefixes=(b"a",))]
    assert got == [(13, "a", b"3"), (15, "a", b"5")]


def test_empty_batch_covers_a_range() -> None:
    b = B.Batch.parse(B.empty(5, 9, ts_ns=3))
    assert (b.count, b.first_seq, b.last_seq, b.dense) == (0, 5, 9, False)
    assert list(b.raw()) == []


@given(records.filter(bool), st.data())
def test_every_truncation_is_rejected(recs, data) -> None:
    raw = B.encode(1, recs)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(B.BatchError):
        B.Batch.parse(raw[:cut])


@given(records.filter(bool), st.data())
def test_every_flipped_byte_is_rejected(recs, data) -> None:
    raw = bytearray(B.encode(1, recs))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(B.BatchError):
        B.Batch.parse(raw)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_batch_error(junk: bytes) -> None:
    with contextlib.suppress(B.BatchError):
        B.Batch.parse(junk, check_crc=False)


def _forge(count: int, first: int, last: int, body: bytes = b"", flags: int = 0, version: int = 1) -> bytes:
    """A header around `body` with a correct length and CRC, to reach the checks behind the CRC."""
    out = bytearray(B.HEADER_SIZE) + body
    B.HEADER.pack_into(out, 0, B.MAGIC, version, flags, len(out), 0, count, first, last, 0)
    struct.pack_into("<I", out, 8, crc32c(memoryview(out)[12:]))
    return bytes(out)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (_forge(0, 5, 4), "coverage 5..4 is empty"),
        (_forge(3, 1, 2), "3 records cannot fit coverage 1..2"),
        (_forge(0, 1, 1, flags=1), "unsupported batch flags 0x01"),
        (_forge(0, 1, 1, version=9), "unsupported batch version 9"),
        (_forge(1, 1, 1, B.RECORD.pack(1, 0, 0, 0)), "record 0: sequence delta 1 out of order"),
        (_forge(2, 1, 5, B.RECORD.pack(2, 0, 0, 0) * 2), "record 1: sequence delta 2 out of order"),
        (_forge(1, 1, 1, B.RECORD.pack(0, 0, 0, 9)), "records end at byte"),
        (_forge(1, 1, 1, b"\0" * 5), "record 0: header runs past the batch end"),
        (b"XX" + _forge(0, 1, 1)[2:], "bad magic"),
    ],
)
def test_structural_faults_are_named(raw: bytes, reason: str) -> None:
    with pytest.raises(B.BatchError, match=re.escape(reason)):
        B.Batch.parse(raw)


def test_key_limit_and_sequencing_rules() -> None:
    with pytest.raises(B.BatchError, match="key is 256 bytes"):
        B.encode(0, [(0, b"k" * 256, b"")])
    with pytest.raises(B.BatchError, match="at least one record"):
        B.encode(0, [])
    with pytest.raises(B.BatchError, match="dense, non-empty"):
        B.resequence(B.Batch.parse(B.empty(0, 3)), 1, 0)


def test_frame_length_reads_the_header_only() -> None:
    raw = B.encode(1, [(0, b"k", b"v")])
    stream = raw + raw[:10]
    assert B.frame_length(stream, 0) == len(raw)
    with pytest.raises(B.BatchError, match="truncated header"):
        B.frame_length(stream, len(raw))
