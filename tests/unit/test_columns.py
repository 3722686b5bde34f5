"""The columnar view of a batch (gateway.wire.columns) against the per-record view (`Batch.raw`): the same
records, on generated batches (with and without TTL and producer headers, filtered and cut to a range), from the
compiled walk and the Python one, and the same again through `to_arrow()`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.client.subscriber import Delivery
from gateway.wire import batch as B
from gateway.wire import columns as C

if C.IMPLEMENTATION != "compiled":  # what the equivalence below compares; `pip install -e .` builds it
    pytest.fail(f"gateway.wire._column_loops was not built (columns: {C.IMPLEMENTATION}): is a C compiler installed?")
from gateway.wire import _column_loops

keys = st.sampled_from([b"", b"a", b"ab", b"b", b"key1", b"\xff\xfe"])
records = st.lists(st.tuples(st.integers(0, 2**63 - 1), keys, st.binary(max_size=40)), min_size=1, max_size=40)
prefixes = st.sampled_from([(), (b"a",), (b"b", b"key"), (b"zz",)])


@st.composite
def batches(draw: st.DrawFn) -> B.Batch:
    """A batch as a subscriber may get it: live (dense, perhaps TTL or producer) or filtered by replay."""
    recs = draw(records)
    first = draw(st.integers(1, 2**40))
    ttl = draw(st.booleans())
    rows = [(*r, 7) for r in recs] if ttl else recs
    producer = (5, 9) if draw(st.booleans()) else None
    raw = B.encode(first, rows, ttl=ttl, producer=producer)
    batch = B.Batch.parse(raw)
    if draw(st.booleans()):  # replay's filtered batch: same coverage, fewer records (not dense)
        batch = B.Batch.parse(batch.select(draw(prefixes)))
    return batch


def _rows(view: C.Columns) -> list[tuple[int, int, bytes, bytes]]:
    return [(view.seq[i], view.ts_ns[i], view.key(i).tobytes(), view.body(i).tobytes()) for i in range(len(view))]


@settings(max_examples=200)
@given(batches(), st.data())
def test_columns_hold_what_raw_yields(batch: B.Batch, data: st.DataObject) -> None:
    lo = data.draw(st.integers(max(0, batch.first_seq - 2), batch.last_seq + 2))
    hi = data.draw(st.integers(max(0, lo - 1), batch.last_seq + 2))  # sequences are unsigned
    wanted = data.draw(prefixes)
    delivery = Delivery(batch, lo, hi, "live", wanted)
    expected = [(s, t, k.tobytes(), b.tobytes()) for s, t, k, b in delivery.raw()]
    view = delivery.columns()
    assert _rows(view) == expected
    args = (batch.buf, batch.first_seq, batch.count, batch.overhead, batch.header_size, lo, hi, wanted)
    compiled, python = _column_loops.walk(*args), C.py_walk(*args)
    assert compiled == python
    table = view.to_arrow()
    assert table.schema.names == ["seq", "ts_ns", "key", "body"]
    assert table.column("seq").to_pylist() == [r[0] for r in expected]
    assert table.column("ts_ns").to_pylist() == [r[1] for r in expected]
    assert table.column("key").to_pylist() == [r[2].decode(errors="replace") for r in expected]
    assert table.column("body").to_pylist() == [r[3] for r in expected]


def test_columns_are_views_of_the_batch_not_copies() -> None:
    """numpy reads the columns in place, and keys and bodies are offsets into the batch's own buffer."""
    raw = B.encode(100, [(i, b"k%d" % i, b"x" * i) for i in range(50)])
    batch = B.Batch.parse(raw)
    view = Delivery(batch, 110, 119, "live").columns()
    seq = np.frombuffer(view.seq, np.int64)
    assert seq.tolist() == list(range(110, 120))
    assert view.buf.obj is raw  # the batch's bytes, held, not copied
    starts = np.frombuffer(view.body_start, np.int64)
    assert bytes(raw[starts[0] : starts[0] + view.body_len[0]]) == b"x" * 10


def test_a_walk_past_the_end_is_refused() -> None:
    """The compiled walk checks every bound itself: cut records raise, never read past the buffer."""
    raw = B.encode(1, [(0, b"k", b"body")] * 3)
    cut = memoryview(raw)[: len(raw) - 2]
    with pytest.raises(ValueError, match="run past its end"):
        _column_loops.walk(cut, 1, 3, B.RECORD_OVERHEAD, B.HEADER_SIZE, 0, 10, ())
