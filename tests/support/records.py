"""Journal contents for snapshot tests: records, the expected last values, writing them."""

from __future__ import annotations

from gateway.journal import JournalWriter
from gateway.wire import batch as B

NOW = 1_800_000_000 * 10**9


Rec = tuple[bytes, bytes, int]  # key, body (empty: delete), ttl_ms


def write(writer: JournalWriter, recs: list[Rec], ts_ns: int = NOW, per_batch: int = 7) -> None:
    for i in range(0, len(recs), per_batch):
        chunk = [(ts_ns, k, b, ttl) for k, b, ttl in recs[i : i + per_batch]]
        writer.append(B.Batch.parse(B.encode(0, chunk, ttl=any(t for *_, t in chunk))))


def last_values(recs: list[Rec], first_seq: int = 1, now_ns: int = NOW) -> dict[bytes, tuple[int, bytes, int]]:
    """The model: key -> (seq, body, ttl_ms) of the last record of every live key, in sequence order."""
    out: dict[bytes, tuple[int, bytes, int]] = {}
    for seq, (k, body, ttl) in enumerate(recs, first_seq):
        out.pop(k, None)
        if body and not (ttl and NOW + ttl * 1_000_000 <= now_ns):
            out[k] = (seq, body, ttl)
    return out
