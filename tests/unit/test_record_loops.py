"""The compiled record loops (gateway/_record_loops.c) against their Python versions: same answers, same errors.

Every batch the gateway ingests and every batch a subscriber receives goes through `check`, so the compiled
one must refuse exactly what the Python one refuses, with the same words, and never read out of bounds on
bytes a rogue sender made up.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire import batch as B
from gateway.wire import record_loops as L

if L.IMPLEMENTATION != "compiled":  # what the equivalence below compares; `pip install -e .` builds it
    pytest.fail(
        f"gateway.wire._record_loops was not built (record loops: {L.IMPLEMENTATION}): is a C compiler installed?"
    )
from gateway.wire import _record_loops as C

MAX = B.MAX_SEQ
keys = st.binary(max_size=12)
plain = st.tuples(st.integers(0, 2**64 - 1), keys, st.binary(max_size=60))
with_ttl = st.tuples(st.integers(0, 2**64 - 1), keys, st.binary(max_size=60), st.integers(0, B.MAX_TTL_MS))
firsts = st.integers(0, MAX - 50)
batches = st.builds(B.encode, firsts, st.lists(plain, min_size=1, max_size=30)) | st.builds(
    lambda first, recs: B.encode(first, recs, ttl=True), firsts, st.lists(with_ttl, min_size=1, max_size=30)
)


def _check_args(raw: bytes | bytearray) -> tuple:
    _, _, flags, _, _, count, first, last, _ = B.HEADER.unpack_from(raw)
    return memoryview(raw), count, last - first, B._overhead(flags), B.HEADER_SIZE


@settings(max_examples=300)
@given(batches, st.data())
def test_check_finds_the_same_fault(raw: bytes, data: st.DataObject) -> None:
    """Flip, cut or pad the records; both loops name the same first fault (or none)."""
    assert C.check(*_check_args(raw)) is None is L.py_check(*_check_args(raw))
    damaged = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        how = data.draw(st.sampled_from(["flip", "cut", "pad"]))
        if how == "flip" and len(damaged) > B.HEADER_SIZE:
            at = data.draw(st.integers(B.HEADER_SIZE, len(damaged) - 1))
            damaged[at] = data.draw(st.integers(0, 255))
        elif how == "cut" and len(damaged) > B.HEADER_SIZE:
            del damaged[data.draw(st.integers(B.HEADER_SIZE, len(damaged) - 1)) :]
        else:
            damaged += data.draw(st.binary(min_size=1, max_size=30))
    assert C.check(*_check_args(damaged)) == L.py_check(*_check_args(damaged))


@given(batches, st.integers(0, 40), st.integers(0, 40), st.booleans())
def test_entries_are_the_same_records(raw: bytes, lo_off: int, span: int, ttl: bool) -> None:
    b = B.Batch.parse(raw)
    lo = b.first_seq + lo_off
    args = (b.buf, b.first_seq, b.count, b.overhead, B.HEADER_SIZE, lo, min(lo + span, MAX), ttl)
    compiled = C.entries(*args)
    assert all(isinstance(field, memoryview) for e in compiled for field in e[2:4])
    as_bytes = [tuple(bytes(f) if isinstance(f, memoryview) else f for f in e) for e in compiled]
    assert as_bytes == [tuple(bytes(f) if isinstance(f, memoryview) else f for f in e) for e in L.py_entries(*args)]


def test_entries_refuse_records_past_the_end_instead_of_reading_them() -> None:
    """`Batch` built around unchecked bytes (not through parse): the compiled walk stops, it does not overread."""
    raw = bytearray(B.encode(0, [(1, b"k", b"body")]))
    raw[B.HEADER_SIZE + 13] = 0xFF  # body_len now claims 255 more bytes than there are
    with pytest.raises(ValueError, match="run past its end at byte 40"):
        C.entries(memoryview(raw), 0, 1, B.RECORD_OVERHEAD, B.HEADER_SIZE, 0, MAX, False)
    with pytest.raises(ValueError, match="overhead below"):
        C.check(memoryview(raw), 1, 0, 3, B.HEADER_SIZE)


@given(st.lists(plain, max_size=20) | st.lists(with_ttl, min_size=1, max_size=20))
def test_pack_lays_out_the_same_bytes(recs: list[tuple]) -> None:
    ttl = bool(recs) and len(recs[0]) == 4
    assert C.pack(recs, ttl, B.HEADER_SIZE, B.MAX_BATCH) == L.py_pack(recs, ttl, B.HEADER_SIZE, B.MAX_BATCH)


@pytest.mark.parametrize(
    ("recs", "ttl", "max_batch", "message"),
    [
        ([(0, b"k" * 256, b"")], False, B.MAX_BATCH, "record 0: key is 256 bytes, the limit is 255"),
        (
            [(0, b"k", b"x"), (0, b"k", b"y" * 101)],
            False,
            100,
            "record 1: body is 101 bytes, a batch holds at most 100",
        ),
        ([(0, b"k", b"x" * 50)] * 3, False, 150, "batch of 176 bytes is over the limit of 150"),
        ([(0, b"k", b"", -1)], True, B.MAX_BATCH, "record 0: ttl_ms -1 outside 0..4294967295"),
        ([(0, b"k", b"", 2**32)], True, B.MAX_BATCH, "record 0: ttl_ms 4294967296 outside 0..4294967295"),
        ([(0, b"k", b"", 2**70)], True, B.MAX_BATCH, f"record 0: ttl_ms {2**70} outside 0..4294967295"),
    ],
)
def test_pack_refuses_with_the_same_words(recs: list[tuple], ttl: bool, max_batch: int, message: str) -> None:
    for pack in (C.pack, L.py_pack):
        with pytest.raises(ValueError) as err:
            pack(recs, ttl, B.HEADER_SIZE, max_batch)
        assert str(err.value) == message


def test_pack_takes_any_iterable_and_refuses_what_is_not_a_record() -> None:
    assert C.pack(iter([(5, b"a", b"b")]), False, 0, B.MAX_BATCH) == L.py_pack([(5, b"a", b"b")], False, 0, B.MAX_BATCH)
    with pytest.raises(TypeError):
        C.pack([(5, b"a")], False, 0, B.MAX_BATCH)
    with pytest.raises(TypeError):
        C.pack([(5, "not bytes", b"b")], False, 0, B.MAX_BATCH)


queued = st.tuples(st.integers(0, 2**64 - 1), keys, st.binary(max_size=60), st.integers(0, B.MAX_TTL_MS))


@given(st.lists(queued, max_size=30), st.integers(1, 12), st.integers(0, 200))
def test_take_cuts_the_same_batches(recs: list[tuple], max_records: int, max_payload: int) -> None:
    """Batch after batch until the queue is empty: the same records, in order, within both limits (a record
    bigger than max_payload goes alone)."""
    cut = {}
    for take in (C.take, L.py_take):
        queue, batches = deque(recs), []
        while queue:
            batches.append(take(queue, max_records, max_payload))
        cut[take] = batches
        assert [r for records, _, _ in batches for r in records] == recs
        for records, payload, ttl in batches:
            assert 1 <= len(records) <= max_records
            assert payload == sum(len(k) + len(b) for _, k, b, _ in records)
            assert payload <= max_payload or len(records) == 1
            assert ttl == any(t > 0 for *_, t in records)
    assert cut[C.take] == cut[L.py_take]


def test_take_puts_back_everything_when_a_record_is_not_one() -> None:
    for take in (C.take, L.py_take):
        recs = [(1, b"a", b"b", 0), (2, b"c", b"d", 5), (3, "not bytes", b"e", 0), (4, b"f", b"g", 0)]
        queue = deque(recs)
        with pytest.raises(TypeError, match="is not \\(ts_ns, key bytes, body bytes, ttl_ms\\)"):
            take(queue, 10, 1000)
        assert list(queue) == recs


def _cut_both(raw: bytes | bytearray, max_bytes: int) -> list[tuple[int, bytes]]:
    """`cut` of a batch's records, compiled and in Python, asserted equal byte for byte."""
    _, count, _, overhead, start = _check_args(raw)
    got = {cut: cut(memoryview(raw), count, overhead, start, max_bytes, start) for cut in (C.cut, L.py_cut)}
    assert all(isinstance(out, bytearray) for parts in got.values() for _, out in parts)
    assert got[C.cut] == got[L.py_cut]
    return [(n, bytes(out)) for n, out in got[C.cut]]


@settings(max_examples=300)
@given(batches, st.integers(0, 1_500))
def test_cut_gives_the_same_parts(raw: bytes, max_bytes: int) -> None:
    """Both cut at the same records into the same bytes: deltas from 0, the reserve zeroed, nothing lost."""
    parts = _cut_both(raw, max_bytes)
    assert sum(n for n, _ in parts) == B.Batch.parse(raw).count
    assert all(len(out) <= max_bytes or n == 1 for n, out in parts)  # only a record too large alone overshoots
    assert all(out[: B.HEADER_SIZE] == bytes(B.HEADER_SIZE) for _, out in parts)


def test_cut_edges_one_part_exactly_full_parts_and_a_record_larger_than_a_part() -> None:
    body = b"x" * 30
    size = B.RECORD_OVERHEAD + 1 + len(body)  # one record's bytes
    raw = B.encode(5, [(1, b"k", body)] * 6)
    assert _cut_both(raw, len(raw)) == [(6, bytes(B.HEADER_SIZE) + raw[B.HEADER_SIZE :])]  # fits one: the batch
    full = _cut_both(raw, B.HEADER_SIZE + 2 * size)  # exactly two records a part: three parts, each exactly full
    assert [(n, len(out)) for n, out in full] == [(2, B.HEADER_SIZE + 2 * size)] * 3
    assert [(n, len(out)) for n, out in _cut_both(raw, B.HEADER_SIZE + 2 * size - 1)] == [(1, B.HEADER_SIZE + size)] * 6
    big = B.encode(0, [(1, b"k", b"y" * 3_000), (2, b"", b"z")])  # a record larger than a part: a part of its own
    assert [n for n, _ in _cut_both(big, 1_472)] == [1, 1]


def test_cut_refuses_records_past_the_end_with_the_same_words() -> None:
    raw = bytearray(B.encode(0, [(1, b"k", b"body")]))
    raw[B.HEADER_SIZE + 13] = 0xFF  # body_len now claims 255 more bytes than there are
    for cut in (C.cut, L.py_cut):
        with pytest.raises(ValueError, match="record 0: runs past the batch end at byte 40"):
            cut(memoryview(raw), 1, B.RECORD_OVERHEAD, B.HEADER_SIZE, 1_472, B.HEADER_SIZE)
        with pytest.raises(ValueError, match="record 1: header runs past the batch end at byte 62"):
            cut(memoryview(B.encode(0, [(1, b"k", b"body")])), 2, B.RECORD_OVERHEAD, B.HEADER_SIZE, 1_472, 0)
