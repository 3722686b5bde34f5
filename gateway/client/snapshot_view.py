"""`LastValues`: the application's key -> value view of a stream, kept current record by record.

A subscriber that starts from a snapshot (or from the first record) and applies every record after it to
this view holds what the replay sidecar's snapshot index holds: the last value of every key. The rules are
the index's (gateway.sidecar.snapshots): an empty body deletes the key, and a record with a TTL disappears once
ts_ns + ttl_ms has passed, judged here on this host's clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from gateway.wire.ttl import Expiries, expires_at


class KeyedRecord(Protocol):
    """A record as the application sees it: gateway.wire.batch.Record and gateway.client.subscriber.Received fit."""

    @property
    def seq(self) -> int: ...

    @property
    def ts_ns(self) -> int: ...

    @property
    def key(self) -> str: ...

    @property
    def body(self) -> bytes: ...

    @property
    def ttl_ms(self) -> int: ...


class LastValues(Mapping[str, bytes]):
    """key -> body of the last record of every live key. Records must be applied in sequence order."""

    def __init__(self, *, clock: Callable[[], int] = time.time_ns) -> None:
        self.clock = clock
        self.seq: int | None = None  # the last sequence applied: the view is as of this record
        self._records: dict[str, KeyedRecord] = {}
        self._expiries: Expiries[str] = Expiries(self._ttl_records)

    def apply(self, rec: KeyedRecord) -> None:
        """One record, the next in sequence order."""
        self.seq = rec.seq
        if not rec.body:
            self._records.pop(rec.key, None)
            return
        self._records[rec.key] = rec
        if rec.ttl_ms:
            self._expiries.add(rec.ts_ns, rec.ttl_ms, rec.seq, rec.key, len(self._records))

    def record(self, key: str) -> KeyedRecord:
        """The whole last record of `key` (sequence, publish time, TTL); KeyError if the key is not live."""
        self.expire()
        return self._records[key]

    def expire(self, now_ns: int | None = None) -> int:
        """Drop the keys whose last record has expired (at now_ns, default: now); returns how many."""
        records, gone = self._records, 0
        for seq, key in self._expiries.due(self.clock() if now_ns is None else now_ns):
            rec = records.get(key)
            if rec is not None and rec.seq == seq:  # not replaced since
                del records[key]
                gone += 1
        return gone

    def _ttl_records(self) -> Iterator[tuple[int, int, str]]:
        for key, rec in self._records.items():
            if rec.ttl_ms:
                yield expires_at(rec.ts_ns, rec.ttl_ms), rec.seq, key

    def __getitem__(self, key: str) -> bytes:
        self.expire()
        return self._records[key].body

    def __iter__(self) -> Iterator[str]:
        self.expire()
        return iter(list(self._records))

    def __len__(self) -> int:
        self.expire()
        return len(self._records)

    def __repr__(self) -> str:
        return f"LastValues({len(self)} keys as of sequence {self.seq})"
