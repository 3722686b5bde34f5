"""JournalReader and Cursor: read a stream from any process while its writer appends, without locks.

Readers rely on three things the writer guarantees: it only appends whole batches with one write() each
(so bytes up to the file size are final, and an incomplete batch is one still being written); it creates a
segment's successor only after its last write to it (so once the successor exists, the segment is final);
and it names that successor by the sequence after the segment's last one (so a reader knows what to look for).

Two more things a reader of a replicated group's node (docs/ha.md) copes with. Such a node's journal runs
ahead of what is committed: a reader made with `committed=True` (the replay sidecar's) returns only batches
wholly at or below the stream's committed mark (gateway.journal.committed), and never moves past one that is
not. And a node that rejoins its group cuts uncommitted batches off its journal's end (tools.cut_after), then
journals its leader's records at those sequences: a cursor whose segment shrank below its position or was
unlinked finds its next sequence again in what the journal now holds. A bounded cursor never stood past the
cut (committed batches are never cut) and never keeps bytes it read ahead past its bound, so it returns the
new records; an unbounded cursor that returned records since cut raises JournalError rather than go on with
a history its caller never saw.
"""

from __future__ import annotations

import io
import logging
import os
from bisect import bisect_left, bisect_right
from pathlib import Path

from gateway.errors import BatchError, JournalCorrupt, JournalError, JournalTrimmed, NotAJournal
from gateway.journal.committed import MarkReader, open_mark, read_mark
from gateway.journal.layout import (
    FrameScanner,
    SegmentGone,
    SegmentShrank,
    check_stream_name,
    first_ts,
    idx_path,
    index_entry_ok,
    list_segments,
    open_segment,
    parse_segment_name,
    read_head,
    read_index,
    repair_hint,
    retrying,
    seg_path,
    segment_tail,
    stream_head,
)
from gateway.wire.batch import HEADER, HEADER_SIZE, Batch

log = logging.getLogger(__name__)

_ATTEMPTS = 3  # listing-then-opening races with retention: a few attempts, then the answer is JournalTrimmed


class JournalReader:
    """Read access to one stream. Cheap to create; holds no open files (cursors do).

    `committed`: read only what the stream's committed mark covers, if it has one (a replay sidecar)."""

    def __init__(self, root: str | os.PathLike[str], stream: str, *, committed: bool = False) -> None:
        check_stream_name(stream)
        self.root = Path(root)
        self.stream = stream
        self.committed = committed
        self.directory = self.root / stream
        if not self.directory.is_dir():
            raise NotAJournal(
                f"no stream {stream!r} in journal {self.root} (no directory {self.directory}): check the "
                "journal root and stream name; the gateway creates the directory when it first opens the stream"
            )

    def unbounded(self) -> JournalReader:
        """The same stream read to its end, whatever its committed mark says (a follower copying it)."""
        return JournalReader(self.root, self.stream)

    @property
    def first_seq(self) -> int:
        """The first retained sequence (the head's next sequence when nothing is retained)."""
        segments = list_segments(self.directory)
        if segments:
            return segments[0]
        head = read_head(self.directory)
        return head[0] if head else 1

    @property
    def last_seq(self) -> int:
        """The last sequence of the last complete batch (0 if none yet). A directory listing and a short read."""
        return retrying(f"stream {self.stream!r}", self._last_seq)

    def _last_seq(self) -> int:
        segments = list_segments(self.directory)
        head = stream_head(self.directory, segments)[0] if segments else self.first_seq - 1
        mark = read_mark(self.directory) if self.committed else None
        return head if mark is None else min(head, mark)

    def held_below(self, seq: int) -> int:
        """The last sequence the journal holds below `seq`, for a `seq` it jumps over: a hole that `zeps journal
        repair` left (the writer then continues after the highest sequence ever recorded, so that none is
        reused). The first retained sequence - 1 if it holds none."""
        segments = list_segments(self.directory)
        for first in reversed(segments[: bisect_right(segments, seq)]):
            last = segment_tail(self.directory, first)[0]
            if last >= first:  # not an empty segment
                return min(last, seq - 1)
        return self.first_seq - 1

    def seq_for_time(self, ts_ns: int) -> int:
        """The first sequence whose batch journal time is >= ts_ns (last_seq + 1 if there is none yet).

        Journal time never decreases, so this is a bisect over segments, one over the index, and a short scan.
        """
        return retrying(f"stream {self.stream!r}", lambda: self._seq_for_time(ts_ns))

    def _seq_for_time(self, ts_ns: int) -> int:
        segments = list_segments(self.directory)
        if not segments:
            return self.first_seq
        lo, hi = 0, len(segments)  # find the first segment starting at or after ts_ns (empty ones count)
        while lo < hi:
            mid = (lo + hi) // 2
            start = first_ts(self.directory, segments[mid])
            if start is not None and start < ts_ns:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return segments[0]
        seq = segments[lo - 1]  # the answer is in here, or is the next segment's first sequence
        entries = read_index(idx_path(self.directory, seq))
        with io.FileIO(seg_path(self.directory, seq), "r") as f:
            i = bisect_left([ts for _, ts, _ in entries], ts_ns) - 1
            offset, expected = (entries[i][2], entries[i][0]) if i >= 0 else (0, seq)
            if i >= 0 and not index_entry_ok(f.fileno(), entries[i]):
                offset, expected = 0, seq
            scanner = FrameScanner(f.fileno(), offset)
            try:
                while (frame := scanner.next_frame()) is not None:
                    first, last, ts = HEADER.unpack_from(frame)[6:9]
                    if ts >= ts_ns:
                        return first
                    expected = last + 1
            except BatchError as e:
                raise _corrupt(self, seq, scanner.offset, e.reason) from None
        return segments[lo] if lo < len(segments) else expected

    def cursor(self, from_seq: int) -> Cursor:
        """A cursor delivering the batches that hold sequences >= from_seq, then following the tail.

        Raises JournalTrimmed if from_seq is before the first retained sequence.
        """
        if from_seq < 1:
            raise ValueError(f"from_seq {from_seq}: sequences start at 1")
        for _ in range(_ATTEMPTS):
            dir_mtime = os.stat(self.directory).st_mtime_ns
            segments = list_segments(self.directory)
            if not segments:
                raise JournalError(
                    f"stream {self.stream!r} has no segments: its writer creates the first one when it opens"
                )
            if from_seq < segments[0]:
                raise JournalTrimmed(self.stream, from_seq, segments[0])
            seq = segments[bisect_right(segments, from_seq) - 1]
            f = open_segment(self.directory, seq)
            if f is None:
                continue  # deleted by retention between listing and opening
            offset, expected = self._position(seq, f.fileno(), from_seq)
            mark = open_mark(self.directory) if self.committed else None
            return Cursor(self, f, offset, expected, from_seq, (dir_mtime, segments), mark)
        raise JournalTrimmed(self.stream, from_seq, self.first_seq)

    def _position(self, seq: int, fd: int, from_seq: int) -> tuple[int, int]:
        """(offset, first sequence there) of the last index entry at or before from_seq in a segment."""
        entries = read_index(idx_path(self.directory, seq))
        i = bisect_right([s for s, _, _ in entries], from_seq) - 1
        if i < 0:
            return 0, seq
        if index_entry_ok(fd, entries[i]):
            return entries[i][2], entries[i][0]
        log.warning(
            "journal %s: index %s does not match its segment; reading the segment from its start "
            "(`zeps journal verify` reports it; the writer rebuilds it on open)",
            self.stream,
            idx_path(self.directory, seq).name,
        )
        return 0, seq


def _corrupt(reader: JournalReader, seq: int, offset: int, reason: str) -> JournalCorrupt:
    path = seg_path(reader.directory, seq)
    return JournalCorrupt(path, offset, reason, repair_hint(reader.root, reader.stream))


class Cursor:
    """Reads a stream forward, batch by batch, across segments, and follows the tail.

    Every returned batch passed Batch.parse (CRC and record bounds) and continues the previous one's
    sequences. Batches entirely before from_seq are skipped by header (no CRC work); the first returned one
    may start before from_seq: trim by sequence. With a committed mark, the next batch is returned only once
    the mark covers its last sequence: the mark is read again (one pread) only when a batch passes the last
    value read, and then the batch is read again from the file too, since what was read ahead may predate a
    cut. Not thread-safe; one per client.
    """

    def __init__(
        self,
        reader: JournalReader,
        f: io.FileIO,
        offset: int,
        expected: int,
        from_seq: int,
        listing: tuple[int, list[int]],
        mark: MarkReader | None = None,
    ) -> None:
        """Internal: use JournalReader.cursor(). `listing`: the directory's mtime and its segments then;
        `mark`: the stream's committed mark, which bounds what is returned (None: the journal's end)."""
        self._reader = reader
        self._segment = parse_segment_name(f.name)
        self._file = f
        self._scan = FrameScanner(f.fileno(), offset)
        self._expected = expected  # first sequence of the next batch
        self._from = from_seq
        self._successor: tuple[int, io.FileIO] | None = None
        self._dir_mtime, self._listing = listing
        self._mark, self._bound = mark, 0
        self._returned = 0  # the last sequence returned
        self._returned_header = b""  # its batch's header (CRC included)
        self._check: bytes | None = None  # after finding our place again: the header the batch there must have
        self._bytes_before = 0  # read from segments already left
        self.batches_parsed = 0
        self.batches_skipped = 0

    @property
    def next_seq(self) -> int:
        """The first sequence the next batch read will hold (after a JournalTrimmed: where reading resumes)."""
        return self._expected

    @property
    def bytes_read(self) -> int:
        """Bytes this cursor has read from disk (index look-ups aside): shows the index at work."""
        return self._bytes_before + self._scan.bytes_read

    def skip_to(self, seq: int) -> None:
        """From here on, return only batches holding sequences >= `seq`, passing those before over by header:
        a reader answering requests in rising order goes on from where the last one ended instead of from an
        index entry, which may be a segment's `index_interval` bytes of small batches back. A `seq` below
        `from_seq` or `next_seq` changes nothing: what was read is not read again."""
        self._from = max(self._from, seq)

    def next_batch(self) -> Batch | None:
        """The next complete batch, or None at the current end of the stream (call again later).

        Raises JournalTrimmed if the batches it needs were deleted (it then stands at the first retained one),
        JournalCorrupt for bytes that are not a valid batch where more data follows.
        """
        fresh = False  # the frame at hand was read after the mark
        while True:  # each pass consumes a batch or moves on a segment or finds its place again; all finite
            if self._expected < self._from and self._check is None:  # before the range: headers only, in bulk
                through = self._from - 1 if self._mark is None else min(self._from - 1, self._bound)
                self._expected, passed = self._scan.skip(self._expected, through)
                self.batches_skipped += passed
            offset = self._scan.offset
            try:
                frame = self._scan.next_frame()
                if frame is None:
                    if not self._advance():
                        return None
                    continue
            except BatchError as e:
                raise _corrupt(self._reader, self._segment, offset, e.reason) from None
            except (SegmentGone, SegmentShrank):
                self._relocate()
                continue
            first, last = HEADER.unpack_from(frame)[6:8]
            if self._check is not None and last >= self._returned:
                self._verify(frame, offset)
            if self._mark is not None and last > self._bound:
                self._rescan(offset)  # keep nothing read ahead past the bound: it may be cut and replaced
                if fresh:
                    return None
                bound = self._mark.read()
                if bound is None:  # the mark was removed: a single gateway's stream, served to its end
                    self._mark.close()
                    self._mark = None
                else:
                    self._bound = bound
                fresh = True
                continue
            if last < self._from:  # wholly before the requested range: header checks only
                self._follow(first, last, offset)
                self.batches_skipped += 1
                continue
            try:
                batch = Batch.parse(frame)
            except BatchError as e:
                raise _corrupt(self._reader, self._segment, offset, e.reason) from None
            self._follow(first, last, offset)
            self.batches_parsed += 1
            self._returned, self._returned_header = last, bytes(frame[:HEADER_SIZE])
            return batch

    def _follow(self, first: int, last: int, offset: int) -> None:
        if first != self._expected:
            reason = f"batch holds sequences from {first}, {self._expected} was expected"
            raise _corrupt(self._reader, self._segment, offset, reason)
        self._expected = last + 1

    def _advance(self) -> bool:
        """At the end of the current segment's complete batches: move on if it is sealed. False: wait."""
        if self._successor is None:
            self._successor = self._find_successor()
            # A successor exists, so this segment is final; read it once more, as the writer may have
            # appended to it between our last read and creating the successor.
            return self._successor is not None
        if self._scan.partial:
            reason = f"incomplete batch ({self._scan.size - self._scan.offset} bytes) at the end of a sealed segment"
            raise _corrupt(self._reader, self._segment, self._scan.offset, reason)
        (seq, f), self._successor = self._successor, None
        missing = max(self._expected, self._from)
        self._reposition(seq, f)
        if seq > missing:  # a gap the caller cares about: segments between were removed
            raise JournalTrimmed(self._reader.stream, missing, seq)
        return True

    def _find_successor(self) -> tuple[int, io.FileIO] | None:
        """The segment after this one, None if there is none yet; SegmentGone if this one was deleted."""
        directory = self._reader.directory
        if os.fstat(self._file.fileno()).st_nlink == 0:
            raise SegmentGone  # deleted by retention, or cut: where to go on is found again (_relocate)
        if self._expected > self._segment and (f := open_segment(directory, self._expected)) is not None:
            return self._expected, f  # (a segment holding no batch yet has no successor by name)
        # No successor by name: usually the writer simply has not rolled. A later one after a gap (segments
        # removed by hand) needs a directory listing: only when the directory changed.
        mtime = os.stat(directory).st_mtime_ns
        if mtime != self._dir_mtime:
            self._dir_mtime, self._listing = mtime, list_segments(directory)
        for seq in self._listing[bisect_right(self._listing, self._segment) :]:
            if (f := open_segment(directory, seq)) is not None:
                return seq, f
        return None

    def _relocate(self) -> None:
        """The current segment was deleted (retention) or cut (shrank, or deleted by a replica's cut): find the
        next sequence to return in what the journal holds now, and stand there. Raises JournalTrimmed (standing
        at the first retained batch) if retention took it, JournalError if a cut took records we returned."""
        directory, stream = self._reader.directory, self._reader.stream
        target = self._returned + 1 if self._returned else self._from
        for _ in range(_ATTEMPTS):
            segments = list_segments(directory)
            if not segments or target < segments[0]:
                for seq in segments:
                    if (f := open_segment(directory, seq)) is not None:
                        self._reposition(seq, f)
                        raise JournalTrimmed(stream, max(target, self._expected), seq)
                raise JournalTrimmed(stream, max(target, self._expected), self._reader.first_seq)
            head = stream_head(directory, segments)[0]
            if self._returned > head:
                raise self._cut_under_us(head)
            seq = segments[bisect_right(segments, target) - 1]
            if (f := open_segment(directory, seq)) is None:
                continue
            offset, expected = self._reader._position(seq, f.fileno(), target)
            self._reposition(seq, f)
            self._scan = FrameScanner(f.fileno(), offset)
            self._expected, self._from = expected, max(self._from, target)
            self._check = self._returned_header if self._returned else None
            return
        raise JournalTrimmed(stream, target, self._reader.first_seq)

    def _verify(self, frame: memoryview, offset: int) -> None:
        """After finding our place again: the batch that ended what we returned, if it is there (our place may
        be the start of a segment after it), must be unchanged."""
        first, last = HEADER.unpack_from(frame)[6:8]
        if first <= self._returned and (last != self._returned or bytes(frame[:HEADER_SIZE]) != self._check):
            raise self._cut_under_us(first - 1)
        self._check = None

    def _cut_under_us(self, kept: int) -> JournalError:
        return JournalError(
            f"stream {self._reader.stream!r} was cut to about {kept} under a reader that had returned "
            f"{self._returned}: other records are there now; read again from {kept + 1}"
        )

    def _rescan(self, offset: int) -> None:
        """Read on from `offset` of this segment, dropping what was read ahead."""
        self._bytes_before += self._scan.bytes_read
        self._scan = FrameScanner(self._file.fileno(), offset)

    def _reposition(self, seq: int, f: io.FileIO) -> None:
        """Continue at the start of segment `seq` (open as `f`), dropping any successor found before."""
        self._bytes_before += self._scan.bytes_read
        self._close_segments()
        self._file, self._segment, self._scan = f, seq, FrameScanner(f.fileno(), 0)
        self._expected = seq

    def _close_segments(self) -> None:
        self._file.close()
        if self._successor is not None:
            self._successor[1].close()
            self._successor = None

    def close(self) -> None:
        self._close_segments()
        if self._mark is not None:
            self._mark.close()
            self._mark = None

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
