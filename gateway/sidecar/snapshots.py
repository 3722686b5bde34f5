"""Last-value snapshots (the ZeroMQ Guide's Clone pattern): the last record of every key, as of one sequence.

A late joiner that wants the current state, not a day of history, asks the replay sidecar for a snapshot:
the last record of every key (under some key prefixes) as of a sequence N, then everything after N as usual.
The sidecar keeps one `SnapshotIndex` per stream, built by reading the journal once and then kept current by
following it, so a snapshot costs memory per key, never per journaled record.

The index is a dict key -> value in which each value is one bytes object: the record's absolute sequence
followed by the record exactly as a FLAG_TTL batch lays it out after its delta (VALUE, key, body). Serving
a record is then one pack of its delta plus a slice; nothing is re-encoded. An update moves its key to the
end of the dict, so iterating the dict yields records in sequence order: a snapshot needs no sort.

Rules (docs/snapshots.md):
- an empty body deletes the key; a delete is not kept (a snapshot holds live keys only);
- a record with ttl_ms > 0 is left out of snapshots taken once ts_ns + ttl_ms has passed on the sidecar's
  clock (and dropped from the index then);
- only retained records count: when retention trims the journal, keys whose last record went with it are
  dropped, so the index always equals what a rebuild from the journal would give.

A snapshot is coverage, like a filtered replay answer: its batches cover first..N contiguously and hold, of
each range, the records that are still the last of their key at N. So a client may treat any prefix of a
snapshot followed by a full replay from after that prefix as the stream itself (docs/snapshots.md, "Why it
is exact").
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, TypeVar

from gateway.errors import JournalError, JournalTrimmed, NotAJournal
from gateway.journal import Cursor, JournalReader, journal_streams
from gateway.journal.layout import list_segments
from gateway.wire import batch as B
from gateway.wire.ttl import Expiries, expired, expires_at

log = logging.getLogger(__name__)
K = TypeVar("K")

#: seq, then the record of a FLAG_TTL batch without its delta: ts_ns, key_len, body_len, ttl_ms (key, body follow)
VALUE = struct.Struct("<QQBII")
_SEQ = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_KLEN_AT = 16
_RECORD_AT = _SEQ.size  # where the record (minus its delta) starts in a value
MAX_DELTA = 2**32 - 1
BATCH_BYTES = 64 * 1024  # snapshot batches: about the size of the gateway's
SCAN_LIMIT = 50_000  # values one step looks at, matching or not: bounded work per step
PROGRESS_S = 2.0
HOUSEKEEPING_S = 1.0  # how often a current index drops expired keys and checks what retention trimmed


class Frozen(NamedTuple):
    """The index at one moment: what a snapshot serves. `values` are in sequence order and immutable."""

    first: int  # coverage starts here: the first sequence the index accounts for
    last: int  # N: the snapshot is as of this sequence
    ts_ns: int  # journal time of the batch holding N (0: none)
    now_ns: int  # the sidecar's clock when frozen: TTLs are judged against it
    values: list[bytes]


class SnapshotIndex:
    """The last record of every key of one stream, following its journal."""

    def __init__(self, reader: JournalReader, *, clock: Callable[[], int] = time.time_ns) -> None:
        self.reader = reader
        self.clock = clock
        self.entries: dict[bytes, bytes] = {}
        self.first = reader.first_seq
        self.last = self.first - 1
        self.last_ts = 0
        self.ready = False  # has reached the journal's end at least once
        self._expiries = Expiries(self._ttl_values)
        self._cursor: Cursor | None = None
        self._build_started = time.monotonic()
        self._build_target = 0
        self._next_log = 0.0
        self._next_housekeeping = 0.0
        self._frozen: Frozen | None = None
        self._frozen_at = 0.0

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def stream(self) -> str:
        return self.reader.stream

    # --- keeping current --------------------------------------------------------------------------------

    def apply(self, batch: B.Batch) -> None:
        """Apply one journal batch; records at or below `last` (a cursor's overlap) are skipped."""
        entries, pack = self.entries, VALUE.pack
        for seq, ts, key, body, ttl in batch.entries(self.last + 1):
            k = key.tobytes()
            entries.pop(k, None)  # re-inserted below: the dict stays in sequence order
            if body:
                entries[k] = b"".join((pack(seq, ts, len(k), len(body), ttl), k, body))
                if ttl:
                    self._expiries.add(ts, ttl, seq, k, len(entries))
        self.last = max(self.last, batch.last_seq)
        self.last_ts = batch.ts_ns

    def follow(self, budget_s: float) -> bool:
        """Read what the journal gained, for at most about `budget_s`; True once at its end."""
        now = time.monotonic()
        deadline = now + budget_s
        if self.ready and now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_S
            self.purge(self.clock())
            self.prune(self.reader.first_seq)
        while True:
            try:
                if self._cursor is None:
                    if not self.ready and not self._build_target:
                        self._build_target = self.reader.last_seq
                    self._cursor = self.reader.cursor(self.last + 1)
                batch = self._cursor.next_batch()
            except JournalTrimmed as exc:  # retention overtook the index: what it had is gone from the journal
                self._close_cursor()
                self.prune(exc.first_retained)
                continue
            except JournalError:
                if list_segments(self.reader.directory):
                    raise
                return self._at_end()  # a stream whose writer has not created its first segment yet
            if batch is None:
                return self._at_end()
            self.apply(batch)
            if not self.ready:
                self._log_progress()
            if time.monotonic() >= deadline:
                return False

    def prune(self, first_retained: int) -> None:
        """Retention removed everything below first_retained: drop the keys whose last record went with it."""
        if first_retained <= self.first:
            return
        gone = []
        for key, value in self.entries.items():  # sequence order: the oldest are at the front
            if _SEQ.unpack_from(value)[0] >= first_retained:
                break
            gone.append(key)
        for key in gone:
            del self.entries[key]
        self.first = first_retained
        self.last = max(self.last, first_retained - 1)
        if gone:
            log.info(
                "snapshot index of %s: %d keys trimmed with the journal below %d",
                self.stream,
                len(gone),
                first_retained,
            )

    def close(self) -> None:
        self._close_cursor()

    def _close_cursor(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    def _at_end(self) -> bool:
        if not self.ready:
            self.ready = True
            log.info(
                "snapshot index of %s: ready, %d keys as of sequence %d, built in %.1f s",
                self.stream,
                len(self.entries),
                self.last,
                time.monotonic() - self._build_started,
            )
        return True

    def _log_progress(self) -> None:
        now = time.monotonic()
        if now < self._next_log:
            return
        if self._next_log:
            target = max(self._build_target, self.last)
            done = self.last - self.first + 1
            total = max(1, target - self.first + 1)
            log.info(
                "snapshot index of %s: building, %d of %d records read (%.0f%%), %d keys",
                self.stream,
                done,
                total,
                100 * done / total,
                len(self.entries),
            )
        self._next_log = now + PROGRESS_S

    # --- snapshots --------------------------------------------------------------------------------------

    def freeze(self, share_s: float = 1.0) -> Frozen | None:
        """The index as of now for a snapshot (None until it is built). Expired keys are dropped first.

        Snapshots asked for within `share_s` of each other share one frozen list: many late joiners at once
        cost one list of references, not one each (a shared snapshot is at most share_s old; the client replays
        what follows it anyway).
        """
        if not self.ready:
            return None
        now = time.monotonic()
        if self._frozen is None or now - self._frozen_at >= share_s:
            now_ns = self.clock()
            self.purge(now_ns)
            self._frozen = Frozen(self.first, self.last, self.last_ts, now_ns, list(self.entries.values()))
            self._frozen_at = now
        return self._frozen

    def purge(self, now_ns: int) -> int:
        """Drop the keys whose last record has expired at now_ns; returns how many."""
        entries, gone = self.entries, 0
        for seq, key in self._expiries.due(now_ns):
            value = entries.get(key)
            if value is not None and _SEQ.unpack_from(value)[0] == seq:  # not replaced since
                del entries[key]
                gone += 1
        return gone

    def _ttl_values(self) -> Iterator[tuple[int, int, bytes]]:
        for key, value in self.entries.items():
            seq, ts, _, _, ttl = VALUE.unpack_from(value)
            if ttl:
                yield expires_at(ts, ttl), seq, key


class SnapshotFeed:
    """One snapshot answer being produced, batch by batch, only as fast as the client takes them.

    Batches hold records in sequence order and cover `first..last` contiguously; the last one ends at N.
    Every record of a snapshot batch uses the FLAG_TTL layout (the index stores them that way).
    """

    def __init__(
        self,
        source: Callable[[], Frozen | None],
        prefixes: tuple[bytes, ...],
        *,
        batch_bytes: int = BATCH_BYTES,
        scan_limit: int = SCAN_LIMIT,
    ) -> None:
        self.source = source
        self.prefixes = prefixes
        self.batch_bytes = batch_bytes
        self.scan_limit = scan_limit
        self.frozen: Frozen | None = None
        self.records = 0  # sent so far
        self.done = False
        self._pos = 0  # next value to look at
        self._start = 0  # the next batch covers from here

    @property
    def last(self) -> int:
        """N, once the snapshot is frozen."""
        return self.frozen.last if self.frozen is not None else 0

    def step(self) -> tuple[bytes, int] | None:
        """The next batch and its record count; None when there is none now: the index is still being built,
        or the snapshot is complete (`done`: then send SNAPSHOT-END)."""
        if self.frozen is None:
            self.frozen = self.source()
            if self.frozen is None:
                return None
            self._start = self.frozen.first
        frozen = self.frozen
        if self._start > frozen.last:
            self.done = True
            return None
        values, end = frozen.values, len(frozen.values)
        prefixes, now_ns, pack = self.prefixes, frozen.now_ns, _U32.pack
        start, size, count = self._start, B.HEADER_SIZE, 0
        parts: list[bytes | memoryview] = []
        pos, stop = self._pos, min(end, self._pos + self.scan_limit)
        top = start - 1  # highest sequence this batch covers so far
        while pos < stop and (size < self.batch_bytes or not count):  # at least one record a batch
            value = values[pos]
            if prefixes and not value.startswith(prefixes, VALUE.size, VALUE.size + value[_KLEN_AT]):
                pos += 1
                continue
            seq, ts, _, _, ttl = VALUE.unpack_from(value)
            if seq - start > MAX_DELTA:  # a sparse stretch too long for a u32 delta: end the batch before it
                break
            pos += 1
            if ttl and expired(ts, ttl, now_ns):
                continue
            parts.append(pack(seq - start))
            parts.append(memoryview(value)[_RECORD_AT:])
            size += len(value) - _RECORD_AT + _U32.size
            count += 1
            top = seq
        self._pos = pos
        if pos == end:
            top = frozen.last  # the last batch covers up to N
        elif not count:  # nothing for this client in what was scanned (or a delta too long): cover up to pos
            top = _SEQ.unpack_from(values[pos])[0] - 1
        self._start = top + 1
        self.records += count
        return B.assemble(parts, count, start, top, frozen.ts_ns, B.FLAG_TTL), count


class SnapshotIndexes:
    """Every stream's index in one replay sidecar: created for the streams there at start, for streams created
    since within DISCOVER_S (and at once by a snapshot request for one), all kept current by `follow`. So what a
    sidecar indexes, and the CPU it spends on it, never depends on whether it started before or after its
    gateway created a stream.

    An index whose journal fails to read (corrupt, removed) is dropped; for RETRY_S its snapshots fail with that
    error (the journal's message names the repair), then the next request or look at the root builds it afresh.
    """

    RETRY_S = 10.0
    DISCOVER_S = 1.0  # how often `follow` looks for streams created since

    def __init__(self, root: Path) -> None:
        self.root = root
        self.indexes: dict[str, SnapshotIndex] = {}
        self.failed: dict[str, tuple[Exception, float]] = {}  # stream -> (error, until when it is the answer)
        self._discover_at = 0.0
        self._discover()

    def _discover(self) -> None:
        """An index for every stream of the root that has none (one that failed lately waits for RETRY_S)."""
        self._discover_at = time.monotonic() + self.DISCOVER_S
        try:
            streams = journal_streams(self.root)
        except NotAJournal:
            return  # no stream yet
        for stream in streams:
            if stream not in self.indexes:
                with contextlib.suppress(JournalError, OSError):  # kept in `failed`, or said at the request
                    self.get(stream)

    def get(self, stream: str) -> SnapshotIndex:
        """The stream's index, created (not yet built) if need be; the journal's error if it cannot be read."""
        index = self.indexes.get(stream)
        if index is None:
            error, until = self.failed.get(stream, (None, 0.0))
            if error is not None and time.monotonic() < until:
                raise error
            self.failed.pop(stream, None)
            index = self.indexes[stream] = SnapshotIndex(JournalReader(self.root, stream, committed=True))
            log.info("snapshot index of %s: building from the journal", stream)
        return index

    def source(self, stream: str) -> Callable[[], Frozen | None]:
        """What a session's SnapshotFeed freezes: this stream's index (None until it is built)."""
        return lambda: self.get(stream).freeze()

    def follow(self, budget_s: float) -> bool:
        """Read what every journal gained, within about budget_s in all; True if every index is at its end."""
        deadline = time.monotonic() + budget_s
        if deadline - budget_s >= self._discover_at:
            self._discover()
        current = True
        for stream, index in list(self.indexes.items()):
            try:
                current = index.follow(max(0.0, deadline - time.monotonic())) and current
            except (JournalError, OSError) as exc:
                log.error("snapshot index of %s dropped: %s", stream, exc)
                self.indexes.pop(stream).close()
                self.failed[stream] = (exc, time.monotonic() + self.RETRY_S)
        return current

    def close(self) -> None:
        for index in self.indexes.values():
            index.close()
