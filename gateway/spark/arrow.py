"""Journal batches to Arrow record batches: the hot path of the `zeps` data source.

Spark takes Arrow record batches from a Python data source about four times faster than tuples, and the
journal's batches already hold every column's bytes. So the only per-record Python work is one walk over
the record headers, to find where each record starts (lengths are variable, so the walk is sequential);
every column is then cut out of the batch bytes by numpy in bulk: the fixed-size record headers are gathered
into a structured array (sequence deltas, publish times, lengths), and the key and body bytes are selected by
labelling each byte of the batch as header, key or body with one np.repeat over run lengths. No Record, no
bytes object per record. Measured numbers are in docs/spark.md.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from gateway.wire.arrow import strings, variable
from gateway.wire.batch import RECORD_OVERHEAD, Batch

# (name, Spark SQL type, Arrow type): the one definition both the Spark schema and the Arrow batches use.
COLUMNS = (
    ("stream", "STRING", pa.string()),
    ("seq", "BIGINT", pa.int64()),
    ("ts_ns", "BIGINT", pa.int64()),
    ("key", "STRING", pa.string()),
    ("body", "BINARY", pa.binary()),
)
JOURNAL_TIME = ("journal_ts_ns", "BIGINT", pa.int64())  # the batch's journal time: publish-to-journal timing

MAX_RECORDS = 10_000  # per Arrow batch (Spark's own default for Arrow batches)
MAX_BYTES = 4 << 20  # per Arrow batch, of journal bytes: bounds memory whatever the record size

_LENGTHS = struct.Struct("<12xBI")  # key_len, body_len of a record header (gateway.wire.batch.RECORD)
_RECORD = np.dtype([("delta", "<u4"), ("ts", "<u8"), ("klen", "u1"), ("blen", "<u4")])  # packed, like RECORD
_SPAN = np.arange(RECORD_OVERHEAD)
_SKIP, _KEY, _BODY = 0, 1, 2
_LABELS = np.array([_SKIP, _KEY, _BODY], np.uint8)
assert _RECORD.itemsize == RECORD_OVERHEAD


def columns(journal_time: bool = False) -> tuple[tuple[str, str, pa.DataType], ...]:
    return (*COLUMNS, JOURNAL_TIME) if journal_time else COLUMNS


def spark_schema(journal_time: bool = False) -> str:
    """The data source's schema as Spark DDL."""
    return ", ".join(f"{name} {sql}" for name, sql, _ in columns(journal_time))


def arrow_schema(journal_time: bool = False) -> pa.Schema:
    return pa.schema([pa.field(name, kind) for name, _, kind in columns(journal_time)])


def record_batches(
    stream: str,
    batches: Iterable[Batch],
    lo: int = 0,
    hi: int = 2**63 - 1,
    *,
    journal_time: bool = False,
    max_records: int = MAX_RECORDS,
    max_bytes: int = MAX_BYTES,
) -> Iterator[pa.RecordBatch]:
    """The records lo..hi of `batches` (in sequence order) as Arrow record batches of about `max_records` rows.

    Journal batches are grouped until the group holds `max_records` records or `max_bytes` bytes, and each group
    becomes one Arrow batch: few, large batches keep Spark's per-batch cost down.
    """
    group: list[Batch] = []
    records = nbytes = 0
    for batch in batches:
        if batch.count == 0:
            continue
        group.append(batch)
        records += batch.count
        nbytes += batch.nbytes
        if records >= max_records or nbytes >= max_bytes:
            if (out := to_record_batch(stream, group, lo, hi, journal_time=journal_time)) is not None:
                yield out
            group, records, nbytes = [], 0, 0
    if group and (out := to_record_batch(stream, group, lo, hi, journal_time=journal_time)) is not None:
        yield out


def to_record_batch(
    stream: str, batches: Sequence[Batch], lo: int, hi: int, *, journal_time: bool = False
) -> pa.RecordBatch | None:
    """One Arrow batch of the records lo..hi of `batches`; None if there are none."""
    data = b"".join(batch.buf for batch in batches)  # the one copy of the bytes
    buf = np.frombuffer(data, np.uint8)
    starts = _record_starts(data, batches)
    if not len(starts):
        return None
    heads = buf[starts[:, None] + _SPAN].reshape(-1).view(_RECORD)
    counts = [batch.count for batch in batches]
    seq = np.repeat(np.array([b.first_seq for b in batches], np.int64), counts) + heads["delta"]
    klen = heads["klen"].astype(np.int64)
    blen = heads["blen"].astype(np.int64)
    keep = (seq >= lo) & (seq <= hi)
    kept = int(keep.sum())
    if kept == 0:
        return None

    # Label every byte: runs of (skip: batch and record headers, key, body) per record, records outside
    # lo..hi skipped whole. The runs cover `data` exactly, so one repeat labels it all.
    ends = starts + RECORD_OVERHEAD + klen + blen
    runs = np.empty((len(starts), 3), np.int64)
    runs[:, 0] = starts + RECORD_OVERHEAD
    runs[1:, 0] -= ends[:-1]
    runs[:, 1] = klen
    runs[:, 2] = blen
    labels = np.tile(_LABELS, (len(starts), 1))
    all_kept = kept == len(starts)
    if not all_kept:
        labels[~keep, 1:] = _SKIP
        seq, heads, klen, blen = seq[keep], heads[keep], klen[keep], blen[keep]
    byte_labels = np.repeat(labels.ravel(), runs.ravel())

    arrays = [
        pa.repeat(pa.scalar(stream, pa.string()), kept),
        pa.array(seq, pa.int64()),
        pa.array(heads["ts"].astype(np.int64), pa.int64()),
        strings(buf[byte_labels == _KEY], klen),
        variable(pa.binary(), buf[byte_labels == _BODY], blen),
    ]
    if journal_time:
        times = np.repeat(np.array([b.ts_ns for b in batches], np.int64), counts)
        arrays.append(pa.array(times if all_kept else times[keep], pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(journal_time))


def _record_starts(data: bytes, batches: Sequence[Batch]) -> np.ndarray:
    """Byte offsets in `data` (the batches back to back) of every record header: the one per-record loop."""
    starts = array("q")
    append, lengths = starts.append, _LENGTHS.unpack_from
    base = 0
    for batch in batches:
        pos = base + batch.header_size
        for _ in range(batch.count):
            append(pos)
            klen, blen = lengths(data, pos)
            pos += RECORD_OVERHEAD + klen + blen
        base += batch.nbytes
    return np.frombuffer(starts, np.int64) if starts else np.empty(0, np.int64)
