"""JournalWriter: the one writer of a stream. It sequences batches, appends them, and decides when they are durable.

The writer owns sequencing because only the journal knows, across restarts, which sequences were issued:
the next one comes from the journal head on open (the last segment's tail, or the `head` file if that is
further on), so a restarted gateway never reuses a sequence it may already have multicast.

Size: about 680 lines, kept whole: append, the index, rolling segments, syncing (per batch, grouped, on the
syncer's thread), retention and the recovery of a torn tail all act on the same open segment and index
descriptors and their offsets, under one invariant (the files hold whole batches, the index only what the
segment has); the layout (gateway.journal.layout), the reader and the syncer are apart already.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gateway.errors import BatchError, JournalCorrupt, JournalError, JournalLocked
from gateway.journal.layout import (
    INDEX_ENTRY,
    LOCK_NAME,
    FrameScanner,
    check_stream_name,
    first_ts,
    idx_path,
    index_entry_ok,
    list_segments,
    next_valid_batch,
    read_from,
    read_head,
    read_index,
    repair_hint,
    seg_path,
    segment_name,
    segment_tail,
    write_head,
)
from gateway.journal.syncer import Syncer, timed_fdatasync
from gateway.wire.batch import HEADER, Batch, resequence

log = logging.getLogger(__name__)

MiB = 1 << 20
HEAD_REFRESH_S = 1.0  # sync() rewrites the head file at most this often (roll and close always do)


@dataclass(frozen=True, slots=True)
class Durability:
    """When appended bytes are forced to disk: the trade of append latency and throughput against what a
    power loss (not a process crash: the page cache survives those) can take away.

    always: fsync every append. group: fsync once `group_bytes` are unsynced (in `append`), or once
    `group_ms` passed since the first unsynced append (in `maybe_sync()`, which the owner calls on a timer
    after sending what it appended: a due sync never holds back the multicast of the batch that made it due;
    the write, which is what replay needs, still comes first). With a `Syncer`, a group sync runs on its
    thread and `synced_seq` moves when it has finished (the owner's `maybe_sync()` finds it). never: no
    fsync per append; the OS writes back when it likes.
    In every mode a segment is fsync'ed when it is sealed (once per segment_bytes) and by close(), so
    unsynced data is only ever in the active segment and `synced_seq` is exact.
    """

    mode: Literal["always", "group", "never"] = "group"
    group_ms: float = 5.0
    group_bytes: int = MiB

    def __post_init__(self) -> None:
        if self.mode not in ("always", "group", "never"):
            raise ValueError(f"durability mode {self.mode!r}: use 'always', 'group' or 'never'")
        if self.group_ms < 0 or self.group_bytes < 1:
            raise ValueError("durability group_ms must be >= 0 and group_bytes >= 1")


@dataclass(frozen=True, slots=True)
class Retention:
    """How much history to keep. Whole segments go, oldest first; the active segment never does."""

    max_bytes: int | None = None
    max_age_s: float | None = None


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery (or an explicit truncate_at) cut off the end of a stream."""

    segment: Path
    offset: int
    bytes_dropped: int
    last_good_seq: int
    reason: str

    def describe(self) -> str:
        return (
            f"{self.segment}: dropped {self.bytes_dropped} bytes from byte {self.offset} ({self.reason}); "
            f"the last good sequence is {self.last_good_seq}"
        )


def lock_stream(directory: Path, stream: str) -> int:
    """Take the stream's writer lock (flock: released by the kernel when the holder dies) and record our pid."""
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        pid = int(text) if text.isdigit() else None
        raise JournalLocked(
            f"stream {stream!r} in {directory.parent} is already being written by pid {pid or 'unknown'} "
            f"(lock {path}): a stream has exactly one writer. Stop that process, or give this one another "
            "journal directory or stream name",
            pid,
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class JournalWriter:
    """Appends sequenced batches to one stream. Create with JournalWriter.open(); one per stream (locked)."""

    def __init__(
        self,
        root: Path,
        stream: str,
        lock_fd: int,
        segment_bytes: int,
        index_interval: int,
        durability: Durability,
        retention: Retention,
        clock: Callable[[], int],
        syncer: Syncer | None,
    ) -> None:
        """Internal: use JournalWriter.open(), which also recovers the stream."""
        self.root = root
        self.stream = stream
        self.directory = root / stream
        self.recovery: RecoveryReport | None = None
        self._lock_fd = lock_fd
        self._segment_bytes = segment_bytes
        self._index_interval = index_interval
        self._durability = durability
        self._retention = retention
        self._clock = clock
        self._segments: list[int] = []  # first sequences, oldest first; the last one is active
        self._sizes: dict[int, int] = {}  # bytes of the sealed segments
        self._first_ts: dict[int, int | None] = {}
        self._fd = self._idx_fd = -1
        self._size = 0  # bytes in the active segment
        self._index_off = -index_interval  # offset of the active segment's last index entry
        self._index_owed: tuple[int, int, int] | None = None  # (seq, ts, offset) of an entry not written yet
        self._next_seq = 1
        self._last_ts = 0
        self._synced_seq = 0
        self._unsynced_bytes = 0
        self._unsynced_since: float | None = None  # time.monotonic() of the first unsynced append
        self._syncer = syncer
        self._syncing: tuple[Future[float], int] | None = None  # a group sync on the syncer's thread, and its last seq
        self._last_sync_s = 0.0
        self._head_at = 0.0
        self._head_failed = False
        self._closed = False

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        stream: str,
        *,
        segment_bytes: int = 64 * MiB,
        index_interval: int = 64 * 1024,
        durability: Durability = Durability(),
        retention: Retention = Retention(),
        clock: Callable[[], int] = time.time_ns,
        syncer: Syncer | None = None,
    ) -> JournalWriter:
        """Lock the stream, recover it (docs/journal.md, "Recovery"), and get ready to append after its head.

        `clock` gives wall time in ns: journal time and segment age come from it (injectable for tests).
        `syncer`: group syncs run on its thread, never on the caller's (None: on the caller's).
        Raises JournalLocked, JournalCorrupt (a fault with valid data after it: never skipped), OSError.
        """
        check_stream_name(stream)
        if segment_bytes < 1 or index_interval < 1:
            raise ValueError("segment_bytes and index_interval must be positive")
        root = Path(root)
        (root / stream).mkdir(parents=True, exist_ok=True)
        lock_fd = lock_stream(root / stream, stream)
        writer = cls(root, stream, lock_fd, segment_bytes, index_interval, durability, retention, clock, syncer)
        try:
            writer._recover()
        except BaseException:
            writer._release()
            raise
        return writer

    # -- state -----------------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def last_seq(self) -> int:
        """The last sequence appended (0 for a stream that never had one)."""
        return self._next_seq - 1

    @property
    def last_ts_ns(self) -> int:
        """Journal time of the last batch; the next one gets max(this, clock())."""
        return self._last_ts

    @property
    def synced_seq(self) -> int:
        """Every sequence <= this is on disk (fsync'ed); the rest may still be only in the page cache."""
        return self._synced_seq

    @property
    def last_sync_latency_s(self) -> float:
        """How long the last data fsync took, in seconds (for metrics)."""
        return self._last_sync_s

    @property
    def sync_deadline(self) -> float | None:
        """time.monotonic() at which unsynced data becomes due (group mode), for the gateway's timer; None while
        a sync runs on the syncer (its pipe wakes the owner when it ends)."""
        if self._unsynced_since is None or self._durability.mode != "group" or self._syncing is not None:
            return None
        return self._unsynced_since + self._durability.group_ms / 1000

    # -- appending -------------------------------------------------------------------------------------

    def append(self, batch: Batch) -> bytes:
        """Sequence a dense publisher batch, journal it, and return the sealed bytes to multicast.

        The returned bytes are in the page cache (a reader sees them at once) and on disk as the
        durability mode says: `synced_seq` tells which sequences are.
        """
        if self._closed:
            raise JournalError(f"journal writer of {self.stream!r} is closed: open a new one")
        ts = max(self._last_ts, self._clock())
        data = resequence(batch, self._next_seq, ts)
        self._put(data, batch.count, ts)
        return data

    def append_replica(self, batch: Batch) -> bytes:
        """Journal a batch sequenced elsewhere, verbatim (its sequences and journal time kept): a follower's copy
        of the leader's journal, a mirror's of the source site's. It must continue this journal's sequences.
        Returns the bytes journaled."""
        if self._closed:
            raise JournalError(f"journal writer of {self.stream!r} is closed: open a new one")
        if batch.first_seq != self._next_seq:
            raise JournalError(
                f"replica batch of {self.stream!r} starts at {batch.first_seq}, this journal's next is {self._next_seq}"
            )
        data = bytes(batch)
        self._put(data, batch.count, batch.ts_ns)
        return data

    def _put(self, data: bytes, count: int, ts: int) -> None:
        size = len(data)
        if self._size and self._size + size > self._segment_bytes:
            self._roll()
        offset, first = self._size, self._next_seq
        self._write(data)
        # The batch is in the journal: account for it before anything else can fail, so that no
        # sequence is ever issued twice.
        self._size += size
        self._next_seq += count
        self._last_ts = max(self._last_ts, ts)
        if self._index_owed is None and offset - self._index_off >= self._index_interval:
            self._index_owed = (first, ts, offset)
        self._write_owed_index()
        self._pending(size)

    def _write(self, data: bytes) -> None:
        """Write all of `data`, or nothing: a failed write (ENOSPC...) is cut back so no torn batch stays."""
        done, size = 0, len(data)
        try:
            while done < size:  # one write but on a short one: the first with no view of `data` to make
                written = os.write(self._fd, memoryview(data)[done:] if done else data)
                if written <= 0:
                    raise OSError(f"write to {self._active_path} made no progress")
                done += written
        except OSError:
            os.ftruncate(self._fd, self._size)
            raise

    def _write_owed_index(self) -> None:
        """Write the index entry that is owed, if any. The batch it names is journaled already and the index is
        derived data, so an entry that cannot be written yet (disk full) does not fail the append: it is cut
        back rather than left half-written, stays owed, and is tried again by the next append and by
        maybe_sync(); later batches get no entry before it, so entries stay in order."""
        if self._index_owed is None:
            return
        size = os.lseek(self._idx_fd, 0, os.SEEK_END)
        try:
            written = os.write(self._idx_fd, INDEX_ENTRY.pack(*self._index_owed))
        except OSError as exc:
            log.debug("journal %s: index entry %s owed: %s", self.stream, self._index_owed, exc)
            written = 0
        if written == INDEX_ENTRY.size:
            self._index_off = self._index_owed[2]
            self._index_owed = None
        else:
            os.ftruncate(self._idx_fd, size)

    def _pending(self, nbytes: int) -> None:
        mode = self._durability.mode
        if self._unsynced_since is None:
            self._unsynced_since = time.monotonic()
        self._unsynced_bytes += nbytes
        if mode == "always":
            self.sync()
        elif mode == "group" and self._unsynced_bytes >= self._durability.group_bytes:
            self._group_sync()

    # -- durability ------------------------------------------------------------------------------------

    @property
    def durable_seq(self) -> int:
        """The last sequence as durable as the mode promises: synced, or (mode never) written."""
        return self._next_seq - 1 if self._durability.mode == "never" else self._synced_seq

    def take_finished_sync(self) -> bool:
        """Take a background sync that has finished (`durable_seq` moves); never waits: whether one had."""
        return self._collect(wait=False)

    def sync_due(self, now: float) -> bool:
        """Whether group-mode data has waited `group_ms` (now is time.monotonic())."""
        deadline = self.sync_deadline
        return deadline is not None and now >= deadline

    def maybe_sync(self) -> bool:
        """The gateway's timer hook: take a finished background sync, sync if due (so idle data is not left
        unsynced), then apply retention.

        Returns whether a sync finished (`synced_seq` and `last_sync_latency_s` are new).
        """
        done = self._collect(wait=False)
        if self.sync_due(time.monotonic()):
            done = self._group_sync() or done
        self._write_owed_index()
        self._apply_retention()
        return done

    def _group_sync(self) -> bool:
        """A group commit: on the syncer's thread if there is one (and none runs yet), else here. Whether it
        finished here."""
        if self._syncer is None:
            self.sync()
            return True
        if self._syncing is None:
            self._syncing = (self._syncer.submit(self._fd), self._next_seq - 1)
            self._unsynced_since, self._unsynced_bytes = None, 0  # what comes now is the next group's
        return False

    def _collect(self, *, wait: bool) -> bool:
        """Take the background sync's outcome if it has finished (or, with `wait`, once it has): whether one
        did. Raises its OSError, as sync() would."""
        if self._syncing is None or not (wait or self._syncing[0].done()):
            return False
        future, seq = self._syncing
        self._syncing = None
        self._last_sync_s = future.result()
        self._synced_seq = max(self._synced_seq, seq)
        self._refresh_head()
        return True

    def sync(self) -> None:
        """Force everything appended so far to disk, whatever the mode (waiting for a background sync first)."""
        self._collect(wait=True)
        if self._unsynced_since is not None:
            self._last_sync_s = timed_fdatasync(self._fd)
            self._unsynced_since, self._unsynced_bytes = None, 0
        self._synced_seq = self._next_seq - 1
        self._refresh_head()

    def _refresh_head(self) -> None:
        """After a sync: rewrite the head file, at most every HEAD_REFRESH_S."""
        if time.monotonic() - self._head_at >= HEAD_REFRESH_S:
            self._write_head()

    def close(self) -> None:
        """Sync, record the head, release the lock. Idempotent."""
        if self._closed:
            return
        try:
            self.sync()
            self._write_head()
        finally:
            self._release()

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _release(self) -> None:
        self._closed = True
        for fd in (self._fd, self._idx_fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._idx_fd = self._lock_fd = -1

    def _write_head(self) -> None:
        """Refresh the head file. It is a floor for segments removed by hand, not data: a failure (disk full) is
        logged once and the refresh retried by the next sync, rather than failing the append or sync that asked."""
        try:
            write_head(self.directory, self._next_seq, self._last_ts)
        except OSError as exc:
            if not self._head_failed:
                log.warning("journal %s: cannot refresh the head file (%s); will retry at each sync", self.stream, exc)
            self._head_failed = True
            return
        self._head_failed = False
        self._head_at = time.monotonic()

    # -- segments --------------------------------------------------------------------------------------

    @property
    def _active(self) -> int:
        return self._segments[-1]

    @property
    def _active_path(self) -> Path:
        return seg_path(self.directory, self._active)

    def _roll(self) -> None:
        """Seal the active segment (data and index synced) and start one named by the next sequence.

        If the new segment cannot be created (disk full), the old one stays active and nothing has changed.
        """
        self.sync()
        self._write_owed_index()
        if self._index_owed is not None:
            log.warning(
                "journal %s: sealing %s without its last index entry (disk full); it is rebuilt on the next open",
                self.stream,
                segment_name(self._active),
            )
        os.fsync(self._idx_fd)
        sealed, size, fd, idx_fd = self._active, self._size, self._fd, self._idx_fd
        self._start_segment(self._next_seq)
        self._sizes[sealed] = size
        os.close(fd)
        os.close(idx_fd)
        self._sync_dir()
        self._write_head()
        self._apply_retention()

    def _start_segment(self, seq: int) -> None:
        """Create the segment `seq` and make it the active one. Raises with nothing created, or with it created
        and active: readers take an older segment as final once its successor exists, so it is never reverted."""
        # The index first: a reader that sees the segment finds its index too.
        idx = idx_path(self.directory, seq)
        idx_fd = os.open(idx, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fd = os.open(seg_path(self.directory, seq), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except OSError:
            os.close(idx_fd)
            idx.unlink(missing_ok=True)
            raise
        self._fd, self._idx_fd = fd, idx_fd
        self._segments.append(seq)
        self._first_ts[seq] = None
        self._size, self._index_off, self._index_owed = 0, -self._index_interval, None

    def _sync_dir(self) -> None:
        """fsync the stream directory: a new segment's name itself must survive a power loss."""
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _apply_retention(self) -> None:
        """Delete whole oldest segments while the stream is over its size or age limit. Never the active one."""
        max_bytes, max_age_s = self._retention.max_bytes, self._retention.max_age_s
        if max_bytes is None and max_age_s is None:
            return
        now = self._clock()
        while len(self._segments) > 1:
            total = sum(self._sizes.values()) + self._size
            too_big = max_bytes is not None and total > max_bytes
            newest = self._newest_ts()
            too_old = max_age_s is not None and newest is not None and now - newest > max_age_s * 1e9
            if not (too_big or too_old):
                return
            self._delete_oldest("size" if too_big else "age")

    def _newest_ts(self) -> int | None:
        """An upper bound of the journal time in the oldest segment: its successor's first batch time."""
        successor = self._segments[1]
        if successor == self._active and self._size == 0:
            return self._last_ts
        if self._first_ts.get(successor) is None:
            try:
                self._first_ts[successor] = first_ts(self.directory, successor)
            except FileNotFoundError:
                return None
        return self._first_ts[successor]

    def _delete_oldest(self, why: str) -> None:
        seq = self._segments.pop(0)
        size = self._sizes.pop(seq, 0)
        self._first_ts.pop(seq, None)
        for path in (seg_path(self.directory, seq), idx_path(self.directory, seq)):
            path.unlink(missing_ok=True)  # the segment first: a reader never finds a segment without index
        log.info(
            "journal %s: retention (%s) deleted %s (%d bytes, sequences %d..%d)",
            self.stream,
            why,
            segment_name(seq),
            size,
            seq,
            self._segments[0] - 1,
        )

    # -- recovery --------------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Find the head: check the sealed segments' indexes, validate the active segment from its last
        trustworthy index entry, and continue after the highest sequence ever recorded (segments or head)."""
        self._segments = list_segments(self.directory)
        for seq in self._segments[:-1]:
            self._check_sealed_index(seq)
        end, last_ts = 1, None
        if self._segments:
            end, last_ts = self._recover_active()
            if last_ts is None and len(self._segments) > 1:
                last_ts = segment_tail(self.directory, self._segments[-2])[1]
        head = read_head(self.directory)
        if head is not None and head[0] > end:
            log.warning(
                "journal %s: sequences %d..%d are not in the journal (segments removed by hand, or discarded "
                "by truncate_at); continuing at %d so that none is reused",
                self.stream,
                end,
                head[0] - 1,
                head[0],
            )
            if self._segments:
                self._seal_for_jump()
            end = head[0]
        self._next_seq = end
        self._last_ts = max(last_ts or 0, head[1] if head else 0)
        if self._fd < 0:
            self._start_segment(end)
            self._sync_dir()
        os.fdatasync(self._fd)  # what a crashed writer left may be only in the page cache
        self._synced_seq = end - 1
        self._write_head()
        self._apply_retention()

    def _seal_for_jump(self) -> None:
        """The active segment ends before the head file's sequence: seal it (or drop it, if empty)."""
        os.close(self._fd)
        os.close(self._idx_fd)
        self._fd = self._idx_fd = -1
        if self._size:
            self._sizes[self._active] = self._size
            return
        seq = self._segments.pop()
        seg_path(self.directory, seq).unlink()
        idx_path(self.directory, seq).unlink(missing_ok=True)

    def _check_sealed_index(self, seq: int) -> None:
        """Cheap trust check of a sealed segment's index (shape, first and last entry); rebuild it if it fails."""
        with open(seg_path(self.directory, seq), "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            self._sizes[seq] = size
            path = idx_path(self.directory, seq)
            entries = read_index(path)
            shaped = path.exists() and path.stat().st_size == len(entries) * INDEX_ENTRY.size
            if size == 0:
                ok = shaped and not entries
            else:
                ok = shaped and bool(entries) and entries[0][2] == 0 and entries[-1][2] < size
                ok = ok and index_entry_ok(f.fileno(), entries[0]) and index_entry_ok(f.fileno(), entries[-1])
            if ok:
                return
            scanner, index_off, out = FrameScanner(f.fileno()), -self._index_interval, bytearray()
            try:
                while True:
                    offset = scanner.offset
                    if (frame := scanner.next_frame()) is None:
                        break
                    if offset - index_off >= self._index_interval:
                        out += INDEX_ENTRY.pack(*HEADER.unpack_from(frame)[6:9:2], offset)
                        index_off = offset
            except BatchError:
                pass  # index what is valid; `zeps journal verify` reports the fault
        tmp = path.with_suffix(".idx.tmp")
        tmp.write_bytes(out)
        os.replace(tmp, path)
        log.info("journal %s: rebuilt index %s (it did not match its segment)", self.stream, path.name)

    def _recover_active(self) -> tuple[int, int | None]:
        """Validate the active segment's tail batch by batch (CRC, record bounds, sequence continuity).

        A fault with no valid batch after it is a torn tail: truncated and reported in `recovery`. A fault
        with valid data after it raises JournalCorrupt: skipping it would silently lose records.
        Returns (next sequence, journal time of the last batch or None if the segment holds none).
        """
        seq = self._active
        path = seg_path(self.directory, seq)
        self._fd = fd = os.open(path, os.O_RDWR | os.O_APPEND)
        self._idx_fd = os.open(idx_path(self.directory, seq), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(fd).st_size
        entries = read_index(idx_path(self.directory, seq))
        keep = self._trusted(entries, len(entries), size)
        while True:
            start, expected = (entries[keep - 1][2], entries[keep - 1][0]) if keep else (0, seq)
            self._index_off = start if keep else -self._index_interval
            scanner, fresh, last_ts = FrameScanner(fd, start), bytearray(), None
            fault, search_from = "", 0
            while True:
                offset = scanner.offset
                try:
                    if (frame := scanner.next_frame()) is None:
                        if scanner.partial:
                            fault = f"incomplete batch ({scanner.size - offset} bytes of it)"
                            search_from = offset + 1
                        break
                    batch = Batch.parse(frame)
                except BatchError as e:
                    fault, search_from = e.reason, offset + 1
                    break
                if batch.first_seq != expected:
                    fault = f"batch holds sequences from {batch.first_seq}, {expected} was expected"
                    search_from = scanner.offset
                    break
                if offset - self._index_off >= self._index_interval:
                    fresh += INDEX_ENTRY.pack(batch.first_seq, batch.ts_ns, offset)
                    self._index_off = offset
                expected, last_ts = batch.last_seq + 1, batch.ts_ns
            if not (fault and keep and start == offset):
                break
            # The entry points at the faulty batch itself: scan again from the entry before it, so that the head
            # comes from batches this scan checked, never from a header nobody validated.
            keep = self._trusted(entries, keep - 1, size)
        if fault:
            self._cut_tail(path, offset, search_from, fault, expected - 1)
        if keep < len(entries) or fresh or os.fstat(self._idx_fd).st_size != keep * INDEX_ENTRY.size:  # torn entry
            os.ftruncate(self._idx_fd, keep * INDEX_ENTRY.size)
            os.write(self._idx_fd, fresh)
            log.info("journal %s: index of %s brought in line with the segment", self.stream, path.name)
        self._size = offset
        return expected, last_ts

    def _trusted(self, entries: list[tuple[int, int, int]], below: int, size: int) -> int:
        """How many index entries to keep: the longest run of the first `below` that starts at byte 0 and rises,
        each pointing at a matching batch header inside the segment (0: scan from the start). A power loss can
        zero an earlier entry of the unsynced index and keep later ones: those must not be kept behind it."""
        prev = -1
        for i, entry in enumerate(entries[:below]):
            if entry[2] <= prev or (i == 0 and entry[2] != 0) or not self._trust(entry, size):
                return i
            prev = entry[2]
        return below

    def _trust(self, entry: tuple[int, int, int], size: int) -> bool:
        return entry[2] < size and index_entry_ok(self._fd, entry)

    def _cut_tail(self, path: Path, offset: int, search_from: int, reason: str, last_good: int) -> None:
        """Truncate a torn tail at `offset`, unless a valid batch follows (then refuse: JournalCorrupt)."""
        found = next_valid_batch(read_from(self._fd, search_from), 0)
        if found is not None:
            raise JournalCorrupt(
                path,
                offset,
                f"{reason}; a valid batch follows at byte {search_from + found}, so this is not a torn tail",
                repair_hint(self.root, self.stream),
            )
        size = os.fstat(self._fd).st_size
        os.ftruncate(self._fd, offset)
        self.recovery = RecoveryReport(path, offset, size - offset, last_good, reason)
        log.warning("journal %s: recovered a torn tail: %s", self.stream, self.recovery.describe())
