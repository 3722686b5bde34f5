"""Columns of records to Arrow: a `Columns` view to a pyarrow RecordBatch, and the variable-length arrays the
Spark data source builds the same way. Needs numpy and pyarrow (the `arrow` extra); nothing in the library
imports this module but `Columns.to_arrow()` and gateway.spark.

Keys and bodies lie between record headers in a batch, so an Arrow binary column (its values back to back)
needs one copy of them: numpy gathers each column's bytes in one fancy-indexing pass, with no Python per record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from gateway.wire.columns import Columns

SCHEMA = pa.schema([("seq", pa.int64()), ("ts_ns", pa.int64()), ("key", pa.string()), ("body", pa.binary())])


def record_batch(columns: Columns) -> pa.RecordBatch:
    """The records of `columns` as one RecordBatch of SCHEMA."""
    buf = np.frombuffer(columns.buf, np.uint8)
    klen = np.frombuffer(columns.key_len, np.int64)
    blen = np.frombuffer(columns.body_len, np.int64)
    arrays = [
        pa.array(np.frombuffer(columns.seq, np.int64), pa.int64()),
        pa.array(np.frombuffer(columns.ts_ns, np.int64), pa.int64()),
        strings(gather(buf, np.frombuffer(columns.key_start, np.int64), klen), klen),
        variable(pa.binary(), gather(buf, np.frombuffer(columns.body_start, np.int64), blen), blen),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


def gather(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The byte runs buf[starts[i] : starts[i] + lengths[i]], back to back, in one numpy pass."""
    if not len(lengths):
        return np.empty(0, np.uint8)
    ends = np.cumsum(lengths)
    index = np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
    return buf[index]


def variable(kind: pa.DataType, values: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A string or binary array straight from its value bytes and lengths (offsets by cumsum)."""
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(kind, len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(values)])


def strings(values: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Keys as Arrow strings. Keys should be UTF-8; any that are not are decoded with replacement characters,
    as Batch.records does, so that every reader agrees."""
    keys = variable(pa.string(), values, lengths)
    try:
        keys.validate(full=True)
    except pa.ArrowInvalid:
        binary = variable(pa.binary(), values, lengths)
        keys = pa.array([k.decode(errors="replace") for k in binary.to_pylist()], pa.string())
    return keys
