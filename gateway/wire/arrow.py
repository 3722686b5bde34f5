"""Columns of records to Arrow: a `Columns` view to a pyarrow RecordBatch, and the variable-length arrays the
Spark data source builds the same way. Needs numpy and pyarrow (the `arrow` extra); nothing in the library
imports this module but `Columns.to_arrow()` and gateway.spark.

Keys and bodies lie between record headers in a batch, so an Arrow binary column (its values back to back)
needs one copy of them: numpy selects each column's bytes in bulk (`keys_and_bodies`), no Python per record.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_SKIP, _KEY, _BODY = 0, 1, 2
_LABELS = np.array([_SKIP, _KEY, _BODY], np.uint8)
SCHEMA = pa.schema([("seq", pa.int64()), ("ts_ns", pa.int64()), ("key", pa.string()), ("body", pa.binary())])


def record_batch(
    buf: memoryview,
    seq: memoryview,
    ts_ns: memoryview,
    key_start: memoryview,
    key_len: memoryview,
    body_len: memoryview,
) -> pa.RecordBatch:
    """Records as one RecordBatch of SCHEMA, from a `Columns` view's buffer and int64 columns (the view's
    fields, passed one by one so that this module needs nothing of gateway.wire.columns)."""
    klen = np.frombuffer(key_len, np.int64)
    blen = np.frombuffer(body_len, np.int64)
    keys, bodies = keys_and_bodies(buf, np.frombuffer(key_start, np.int64), klen, blen)
    arrays = [
        pa.array(np.frombuffer(seq, np.int64), pa.int64()),
        pa.array(np.frombuffer(ts_ns, np.int64), pa.int64()),
        strings(keys, klen),
        variable(pa.binary(), bodies, blen),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


def keys_and_bodies(
    buf: memoryview, key_start: np.ndarray, key_len: np.ndarray, body_len: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every key's bytes back to back, and every body's (each body follows its key; records in buffer order).

    Each byte up to the last body's end is labelled skip (headers, records left out), key or body, by one
    np.repeat over the run lengths; two boolean masks then select the keys and the bodies. About ten times
    faster than a fancy index per byte, as masks and repeats over uint8 are cheap."""
    if not len(key_start):
        return np.empty(0, np.uint8), np.empty(0, np.uint8)
    ends = key_start + key_len + body_len
    runs = np.empty((len(key_start), 3), np.int64)
    runs[:, 0] = key_start
    runs[1:, 0] -= ends[:-1]
    runs[:, 1] = key_len
    runs[:, 2] = body_len
    labels = np.repeat(np.tile(_LABELS, len(key_start)), runs.ravel())
    data = np.frombuffer(buf, np.uint8, count=len(labels))
    return data[labels == _KEY], data[labels == _BODY]


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
