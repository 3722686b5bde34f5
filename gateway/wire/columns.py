"""A columnar view of a batch's records: sequences and publish times as int64 arrays, keys and bodies as
(start, length) pairs of byte offsets into the batch's own buffer.

Why: `Batch.raw()` yields one tuple and two memoryviews per record, and an application that wants the records
as arrays (numpy, pandas, Arrow) then walks them again in Python. Here the records are walked once, in C when
the package was built with a compiler (gateway/wire/_column_loops.c, the twin of `py_walk` below, as
record_loops.py does for the other loops), into six int64 columns in one bytearray; nothing is copied per
record, and the view holds the batch, never a copy of it. numpy reads each column without a copy
(`numpy.frombuffer(view.seq, numpy.int64)`), and `to_arrow()` builds a pyarrow RecordBatch (the `arrow` extra:
numpy and pyarrow are not dependencies of the library).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.wire.record_loops import RECORD, compiled

if TYPE_CHECKING:
    import pyarrow as pa

    from gateway.wire.batch import Batch

COLUMNS = ("seq", "ts_ns", "key_start", "key_len", "body_start", "body_len")
_INT64 = struct.Struct("=q")


def py_walk(
    buf: memoryview, first: int, count: int, overhead: int, start: int, lo: int, hi: int, prefixes: tuple[bytes, ...]
) -> tuple[bytearray, int]:
    """The records with lo <= seq <= hi whose key starts with one of `prefixes` (all when empty), as COLUMNS:
    a bytearray of len(COLUMNS) blocks of `count` native int64s, the first `n` of each block filled; and n."""
    out = bytearray(len(COLUMNS) * count * _INT64.size)
    cols = memoryview(out).cast("q")
    unpack, pos, n = RECORD.unpack_from, start, 0
    for _ in range(count):
        delta, ts, klen, blen = unpack(buf, pos)
        seq, k = first + delta, pos + overhead
        if seq > hi:
            break
        if seq >= lo and (not prefixes or bytes(buf[k : k + klen]).startswith(prefixes)):
            for c, value in enumerate((seq, ts, k, klen, k + klen, blen)):
                cols[c * count + n] = value
            n += 1
        pos = k + klen + blen
    return out, n


_c = compiled("_column_loops")
IMPLEMENTATION = "compiled" if _c else "python"
walk: Callable[..., tuple[bytearray, int]] = _c.walk if _c else py_walk


class Columns:
    """Records of one batch as columns: each attribute named in COLUMNS is a memoryview of int64s (format "q"),
    all of one length; key i is buf[key_start[i] : key_start[i] + key_len[i]], body i likewise."""

    __slots__ = ("body_len", "body_start", "buf", "key_len", "key_start", "seq", "ts_ns")

    def __init__(self, batch: Batch, lo: int, hi: int, prefixes: tuple[bytes, ...] = ()) -> None:
        """The records lo..hi of `batch` whose key starts with one of `prefixes` (all when empty)."""
        self.buf = batch.buf
        count = batch.count
        lo, hi = max(lo, batch.first_seq), min(hi, batch.last_seq)
        if lo > hi:
            count = 0
        data, n = walk(batch.buf, batch.first_seq, count, batch.overhead, batch.header_size, lo, hi, prefixes)
        cols = memoryview(data).cast("q")
        self.seq, self.ts_ns, self.key_start, self.key_len, self.body_start, self.body_len = (
            cols[c * count : c * count + n] for c in range(len(COLUMNS))
        )

    def __len__(self) -> int:
        return len(self.seq)

    def key(self, i: int) -> memoryview:
        start = self.key_start[i]
        return self.buf[start : start + self.key_len[i]]

    def body(self, i: int) -> memoryview:
        start = self.body_start[i]
        return self.buf[start : start + self.body_len[i]]

    def to_arrow(self) -> pa.RecordBatch:
        """The records as a pyarrow RecordBatch (columns seq, ts_ns, key, body: gateway.wire.arrow.SCHEMA); needs
        the `arrow` extra (pip install 'zeps-gateway[arrow]')."""
        try:
            from gateway.wire import arrow
        except ImportError as exc:
            raise ImportError(f"to_arrow() needs numpy and pyarrow ({exc}): pip install 'zeps-gateway[arrow]'") from exc
        return arrow.record_batch(self.buf, self.seq, self.ts_ns, self.key_start, self.key_len, self.body_len)
