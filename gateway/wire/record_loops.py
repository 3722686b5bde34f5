"""The per-record loops of the batch format: the only Python work per record left on the hot path.

Everything else in `gateway.wire.batch` costs the same for a batch of one record or of ten thousand. These five
cost per record, so they set how many records per second one core parses, hands out, builds and cuts:

- `check`: the structure walk of `Batch.parse`, on every batch the gateway ingests from a publisher and
  every batch a subscriber takes off the wire (a rogue or corrupt batch must never be walked out of bounds);
- `entries`: what `Batch.raw()` / `Batch.entries()` yield, the records an application iterates;
- `pack`: the record layout of `encode`, what every `Publisher` batch is built with;
- `take`: how a `Publisher` cuts its queue into batches (records popped up to the batch limits);
- `cut`: how `Batch.split` cuts a committed batch into datagram-sized ones, for every batch udp:// sends.

They are compiled from gateway/_record_loops.c when the package was built with a C compiler (pip does it;
the extension is optional, so an install without one still works) and are the Python below otherwise, as
the standard library does with heapq and _heapq. `IMPLEMENTATION` says which. ZEPS_PURE_PYTHON=1 in the
environment at import forces the Python ones, to compare (docs/benchmarks.md has both). Both give the same
results and the same error messages: tests/unit/test_record_loops.py checks that on generated and corrupted
batches.
"""

from __future__ import annotations

import importlib
import os
import struct
from collections import deque
from collections.abc import Iterable, Iterator
from types import ModuleType

RECORD = struct.Struct("<IQBI")  # delta, ts_ns, key_len, body_len
RECORD_TTL = struct.Struct("<IQBII")  # RECORD plus ttl_ms, in batches with FLAG_TTL
_TTL = struct.Struct("<I")
DELTA = struct.Struct("<I")  # a record's first field
MAX_KEY = 255
MAX_TTL_MS = 2**32 - 1

Entry = tuple  # (seq, ts_ns, key, body) or, with_ttl, (seq, ts_ns, key, body, ttl_ms); key and body are views


def py_check(buf: memoryview, count: int, span: int, overhead: int, start: int) -> str | None:
    """The first structural fault of `count` records from byte `start` to the end of `buf`, or None.

    Each record header must lie inside the batch, deltas must rise strictly and stay within `span`
    (last_seq - first_seq), and the records must end exactly where the batch ends.
    """
    end, unpack = len(buf), RECORD.unpack_from
    pos, prev = start, -1
    for i in range(count):
        if pos + overhead > end:
            return f"record {i}: header runs past the batch end at byte {pos}"
        delta, _, klen, blen = unpack(buf, pos)
        if delta <= prev or delta > span:
            return f"record {i}: sequence delta {delta} out of order or outside coverage"
        prev = delta
        pos += overhead + klen + blen
    if pos != end:
        return f"records end at byte {pos} but the batch is {end} bytes"
    return None


def py_entries(
    buf: memoryview, first: int, count: int, overhead: int, start: int, lo: int, hi: int, with_ttl: bool
) -> Iterator[Entry]:
    """The records of a checked batch with lo <= seq <= hi as (seq, ts_ns, key, body[, ttl_ms]).

    Sequences rise, so the walk stops at the first one past `hi`. ttl_ms is 0 when the batch has none.
    """
    unpack, has_ttl, ttl = RECORD.unpack_from, overhead >= RECORD_TTL.size, 0
    pos = start
    for _ in range(count):
        delta, ts, klen, blen = unpack(buf, pos)
        k = pos + overhead
        b = k + klen
        seq = first + delta
        if seq > hi:
            return
        if seq >= lo:
            if not with_ttl:
                yield seq, ts, buf[k:b], buf[b : b + blen]
            else:
                if has_ttl:
                    (ttl,) = _TTL.unpack_from(buf, pos + RECORD.size)
                yield seq, ts, buf[k:b], buf[b : b + blen], ttl
        pos = b + blen


def py_pack(records: Iterable[tuple], ttl: bool, reserve: int, max_batch: int) -> tuple[bytearray, int]:
    """`reserve` zero bytes (for the caller's header), then the (ts_ns, key, body[, ttl_ms]) records laid out
    with deltas 0, 1, ...; and how many there were. Raises ValueError naming the first bad record."""
    head = RECORD_TTL if ttl else RECORD
    parts: list[bytes] = [bytes(reserve)]
    total, n = reserve, 0
    for n, rec in enumerate(records, 1):
        key, body = rec[1], rec[2]
        if len(key) > MAX_KEY:
            raise ValueError(f"record {n - 1}: key is {len(key)} bytes, the limit is {MAX_KEY}")
        if len(body) > max_batch:
            raise ValueError(f"record {n - 1}: body is {len(body)} bytes, a batch holds at most {max_batch}")
        if ttl:
            if not 0 <= rec[3] <= MAX_TTL_MS:
                raise ValueError(f"record {n - 1}: ttl_ms {rec[3]} outside 0..{MAX_TTL_MS}")
            parts.append(head.pack(n - 1, rec[0], len(key), len(body), rec[3]))
        else:
            parts.append(head.pack(n - 1, rec[0], len(key), len(body)))
        parts += (key, body)
        total += head.size + len(key) + len(body)
        if total > max_batch:
            raise ValueError(f"batch of {total} bytes is over the limit of {max_batch}")
    return bytearray(b"".join(parts)), n


def py_take(queue: deque[tuple[int, bytes, bytes, int]], max_records: int, max_payload: int) -> tuple[list, int, bool]:
    """(ts_ns, key, body, ttl_ms) records popped from the left of `queue`: at most max_records of them and
    max_payload bytes of keys and bodies, but at least one; and their keys' and bodies' bytes, and whether one
    has a TTL. A deque's appends and pops are atomic, so one thread may append while another takes."""
    out: list[tuple[int, bytes, bytes, int]] = []
    payload, ttl = 0, False
    while queue and len(out) < max_records:
        rec = queue.popleft()
        if type(rec) is not tuple or len(rec) != 4 or not isinstance(rec[1], bytes) or not isinstance(rec[2], bytes):
            queue.appendleft(rec)
            queue.extendleft(reversed(out))
            raise TypeError(f"queued record {rec!r} is not (ts_ns, key bytes, body bytes, ttl_ms)")
        size = len(rec[1]) + len(rec[2])
        if out and payload + size > max_payload:
            queue.appendleft(rec)
            break
        out.append(rec)
        payload += size
        ttl = ttl or rec[3] > 0
    return out, payload, ttl


def py_cut(
    buf: memoryview, count: int, overhead: int, start: int, max_bytes: int, reserve: int
) -> list[tuple[int, bytearray]]:
    """The `count` records from byte `start` of `buf` as consecutive parts of at most `max_bytes` (a record
    larger than that alone is a part of one), as (records, `reserve` zero bytes for the caller's header then the
    records with their deltas rewritten 0, 1, ...). Raises ValueError naming a record that overruns `buf`."""
    out: list[tuple[int, bytearray]] = []
    end, unpack = len(buf), RECORD.unpack_from
    pieces: list[bytes | memoryview] = [bytes(reserve)]
    pos, size, n = start, reserve, 0
    for i in range(count):
        if pos + overhead > end:
            raise ValueError(f"record {i}: header runs past the batch end at byte {pos}")
        _, _, klen, blen = unpack(buf, pos)
        length = overhead + klen + blen
        if pos + length > end:
            raise ValueError(f"record {i}: runs past the batch end at byte {pos}")
        if n and size + length > max_bytes:
            out.append((n, bytearray(b"".join(pieces))))
            pieces, size, n = [bytes(reserve)], reserve, 0
        pieces += (DELTA.pack(n), buf[pos + DELTA.size : pos + length])
        size, pos, n = size + length, pos + length, n + 1
    if n:
        out.append((n, bytearray(b"".join(pieces))))
    return out


def compiled(name: str) -> ModuleType | None:
    """gateway.wire.`name`, the compiled twin of a module's Python loops; None when it was not built (no C
    compiler) or ZEPS_PURE_PYTHON=1 asks for the Python ones."""
    if os.environ.get("ZEPS_PURE_PYTHON") == "1":
        return None
    try:
        return importlib.import_module(f"gateway.wire.{name}")
    except ImportError:  # built without a C compiler
        return None


_c = compiled("_record_loops")
IMPLEMENTATION = "compiled" if _c else "python"
check = _c.check if _c else py_check
entries = _c.entries if _c else py_entries
pack = _c.pack if _c else py_pack
take = _c.take if _c else py_take
cut = _c.cut if _c else py_cut
