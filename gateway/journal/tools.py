"""Whole-journal tools: inspect (what is there), verify (is every byte right), tail_fault (a damaged end),
truncate_at (explicit repair), cut_after (a replica dropping what its new leader does not have).

inspect and verify only read, so they are safe next to a running gateway; truncate_at and cut_after take the
writer lock.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from gateway.errors import BatchError, JournalError, NotAJournal
from gateway.journal.epochs import cut_epochs
from gateway.journal.layout import (
    HEAD_NAME,
    INDEX_ENTRY,
    FrameScanner,
    SegmentGone,
    check_stream_name,
    first_ts,
    idx_path,
    list_segments,
    next_valid_batch,
    open_segment,
    parse_segment_name,
    read_from,
    read_head,
    read_index,
    retrying,
    seg_path,
    segment_name,
    segment_tail,
    stream_head,
    write_head,
)
from gateway.journal.writer import RecoveryReport, lock_stream
from gateway.wire.batch import HEADER, Batch

log = logging.getLogger(__name__)


def journal_streams(root: str | os.PathLike[str]) -> list[str]:
    """The stream names under a journal root; NotAJournal (saying what to pass instead) if it is not one."""
    root = Path(root)
    if not root.is_dir():
        raise NotAJournal(f"{root} is not a directory: pass the gateway's journal root (one subdirectory per stream)")
    if list_segments(root):
        raise NotAJournal(f"{root} is a stream directory, not a journal root: pass its parent, {root.parent}")
    streams = sorted(p.name for p in root.iterdir() if p.is_dir() and (list_segments(p) or (p / HEAD_NAME).exists()))
    if not streams:
        raise NotAJournal(
            f"{root} holds no journal streams (expected {root}/<stream>/<20-digit sequence>.seg): "
            "pass the gateway's journal root"
        )
    return streams


def iso_utc(ts_ns: int) -> str:
    """ISO-8601 UTC with nanoseconds (datetime alone stops at microseconds)."""
    seconds, ns = divmod(ts_ns, 1_000_000_000)
    return f"{datetime.fromtimestamp(seconds, UTC):%Y-%m-%dT%H:%M:%S}.{ns:09d}Z"


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB ({n} bytes)"


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What one stream holds. Times are ISO-8601 UTC journal times; None when the stream holds no batch."""

    stream: str
    directory: Path
    first_seq: int
    last_seq: int
    first_time: str | None
    last_time: str | None
    segments: int
    bytes: int

    def describe(self) -> str:
        lines = [f"stream {self.stream}  ({self.directory})"]
        if self.last_seq >= self.first_seq:
            count = self.last_seq - self.first_seq + 1
            lines.append(f"  sequences  {self.first_seq} .. {self.last_seq}  ({count})")
            lines.append(f"  time       {self.first_time} .. {self.last_time}")
        else:
            lines.append(f"  sequences  none retained (the next is {self.first_seq})")
        lines.append(f"  segments   {self.segments}, {_size(self.bytes)}")
        return "\n".join(lines)


def inspect_root(root: str | os.PathLike[str]) -> list[StreamInfo]:
    """Sequence and time range, segment count and size of every stream: headers only, cheap on any size."""
    return [
        retrying(f"stream {stream!r}", functools.partial(_inspect, Path(root) / stream))
        for stream in journal_streams(root)
    ]


def _inspect(directory: Path) -> StreamInfo:
    segments = list_segments(directory)
    if not segments:
        head = read_head(directory)
        first = head[0] if head else 1
        return StreamInfo(directory.name, directory, first, first - 1, None, None, 0, 0)
    nbytes = sum(seg_path(directory, seq).stat().st_size for seq in segments)
    start = first_ts(directory, segments[0])
    last, end = stream_head(directory, segments)
    return StreamInfo(
        directory.name,
        directory,
        segments[0],
        last,
        None if start is None else iso_utc(start),
        None if end is None else iso_utc(end),
        len(segments),
        nbytes,
    )


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing verify found, where it is (file, byte offset if it has one), and what it means."""

    path: Path
    offset: int | None
    message: str

    def describe(self) -> str:
        where = str(self.path) if self.offset is None else f"{self.path} @ byte {self.offset}"
        return f"{where}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    """The result of verify_root: `problems` make it unclean; `notes` (a write in progress...) do not."""

    root: Path
    problems: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)
    streams: int = 0
    segments: int = 0
    batches: int = 0
    bytes: int = 0

    @property
    def clean(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        lines = [
            f"verify {self.root}: {self.streams} streams, {self.segments} segments, {self.batches} batches, "
            f"{_size(self.bytes)}"
        ]
        lines += [f"PROBLEM {f.describe()}" for f in self.problems]
        lines += [f"note    {f.describe()}" for f in self.notes]
        if self.clean:
            lines.append("clean: every checksum, sequence and index entry checks out")
        else:
            lines.append(
                f"NOT CLEAN: {len(self.problems)} problem(s). A bad index: delete the file, the writer rebuilds "
                "it when it opens the stream. A bad segment: the writer refuses to open past it. "
                f"`zeps journal repair {self.root}` fixes both (it asks before it discards anything)."
            )
        return "\n".join(lines)


def verify_root(root: str | os.PathLike[str]) -> VerifyReport:
    """Check every batch (CRC, record bounds), sequence continuity within and across segments, journal time
    order, and every index entry, in every stream. Reads everything; safe next to a running writer."""
    report = VerifyReport(Path(root))
    for stream in journal_streams(root):
        report.streams += 1
        _StreamCheck(report, Path(root) / stream).run()
    return report


def _gap(expected: int, seq: int) -> str:
    if seq > expected:
        return (
            f"sequences {expected}..{seq - 1} are missing (segments removed by hand, or discarded by "
            "truncate_at): readers get JournalTrimmed there"
        )
    return f"segment starts at sequence {seq}, but the one before already reached {expected - 1}"


class _StreamCheck:
    """Verify one stream, segment by segment, carrying sequence and time across segment boundaries."""

    def __init__(self, report: VerifyReport, directory: Path) -> None:
        self.report = report
        self.directory = directory
        self.expected: int | None = None  # first sequence of the next batch; None: do not check
        self.last_ts = 0

    def run(self) -> None:
        segments = list_segments(self.directory)
        for k, seq in enumerate(segments):
            if self.expected is not None and seq != self.expected:
                self.problem(seg_path(self.directory, seq), None, _gap(self.expected, seq))
            self.segment(seq, last=k == len(segments) - 1)

    def problem(self, path: Path, offset: int | None, message: str) -> None:
        self.report.problems.append(Finding(path, offset, message))

    def segment(self, seq: int, last: bool) -> None:
        path = seg_path(self.directory, seq)
        f = open_segment(self.directory, seq)
        if f is None:
            self.report.notes.append(Finding(path, None, "removed while verifying (retention)"))
            self.expected = None
            return
        self.expected = seq
        self.report.segments += 1
        boundaries: dict[int, tuple[int, int]] = {}
        with f:
            resume: int | None = 0
            try:
                while resume is not None:
                    resume, end = self._batches(path, FrameScanner(f.fileno(), resume), boundaries, last)
            except SegmentGone:
                self.report.notes.append(Finding(path, None, "removed while verifying (retention)"))
                self.expected = None
                return
            self.report.bytes += os.fstat(f.fileno()).st_size
        self._index(seq, boundaries, end)

    def _batches(
        self, path: Path, scanner: FrameScanner, boundaries: dict[int, tuple[int, int]], last: bool
    ) -> tuple[int | None, int]:
        """Check batches up to the end or a fault. Returns (where valid batches resume after a fault, or
        None if nothing valid follows; where the good batches end)."""
        while True:
            offset = scanner.offset
            try:
                frame = scanner.next_frame()
                batch = None if frame is None else Batch.parse(frame)
            except BatchError as e:
                fault, incomplete = e.reason, False
            else:
                if batch is not None:
                    self._batch(path, offset, batch, boundaries)
                    continue
                if not scanner.partial:
                    return None, offset
                fault, incomplete = f"incomplete batch ({scanner.size - offset} bytes of it)", True
            found = next_valid_batch(read_from(scanner.fd, offset + 1), 0)
            if found is not None:
                resume = offset + 1 + found
                self.problem(path, offset, f"{fault}; valid batches resume at byte {resume}")
                self.expected = None  # what lies between is lost: do not report it twice
                return resume, offset
            if last and incomplete:
                message = f"{fault} at the end: a write in progress, or a crash (the writer truncates it on open)"
                self.report.notes.append(Finding(path, offset, message))
            elif last:
                self.problem(path, offset, f"{fault}, at the tail: zeps gateway refuses to start on it until repaired")
            else:
                self.problem(path, offset, f"{fault}, at the end of a sealed segment")
            return None, offset

    def _batch(self, path: Path, offset: int, batch: Batch, boundaries: dict[int, tuple[int, int]]) -> None:
        if self.expected is not None and batch.first_seq != self.expected:
            self.problem(path, offset, f"batch holds sequences from {batch.first_seq}, {self.expected} was expected")
        if batch.ts_ns < self.last_ts:
            self.problem(
                path, offset, f"journal time goes backwards ({batch.ts_ns} after {self.last_ts}): time lookups skew"
            )
        boundaries[offset] = (batch.first_seq, batch.ts_ns)
        self.expected, self.last_ts = batch.last_seq + 1, batch.ts_ns
        self.report.batches += 1

    def _index(self, seq: int, boundaries: dict[int, tuple[int, int]], end: int) -> None:
        """Every index entry must name a batch that is there; entries past `end` (a live writer's newer
        batches, or a torn tail) are not judged."""
        path = idx_path(self.directory, seq)
        fix = "delete it: the writer rebuilds it when it opens the stream"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            if boundaries:
                rebuilt = "the writer rebuilds it when it opens the stream (`zeps journal repair` does it now)"
                self.problem(path, None, f"index missing, so reads scan the segment from its start; {rebuilt}")
            return
        if size % INDEX_ENTRY.size:
            self.problem(path, size - size % INDEX_ENTRY.size, f"partial entry at the end; {fix}")
        entries = [e for e in read_index(path) if e[2] < end]
        offsets = [o for _, _, o in entries]
        bad = [i for i, (s, t, o) in enumerate(entries) if boundaries.get(o) != (s, t)]
        bad += [i for i in range(1, len(offsets)) if offsets[i] <= offsets[i - 1]]
        if bad:
            s, t, o = entries[min(bad)]
            message = f"{len(set(bad))} of {len(entries)} entries do not name the batch at their offset "
            self.problem(path, min(bad) * INDEX_ENTRY.size, f"{message}(first: seq {s}, ts {t}, offset {o}); {fix}")
        elif boundaries and (not entries or entries[0][2] != 0):
            self.problem(path, 0, f"no entry for the segment's first batch; {fix}")


def tail_fault(root: str | os.PathLike[str], stream: str) -> Finding | None:
    """The corrupt end of a stream that opening its writer would cut off in silence, or None.

    The writer truncates whatever fails its checks at the end of the last segment when nothing valid follows
    (docs/journal.md, "Recovery"). That is right for a torn write (an incomplete last batch: a crash mid-write)
    and for zeros to the end (a power loss after the file grew), and those give None here. A *complete* batch
    that fails its checks, or bytes that are no batch at all, mean damage: this names it, so that a gateway
    can refuse to start until someone looks (`zeps journal repair`). Read-only; a fault with valid data after
    it is left to the writer, which refuses it with JournalCorrupt.
    """
    directory = Path(root) / stream
    segments = list_segments(directory) if directory.is_dir() else []
    if not segments:
        return None
    path = seg_path(directory, segments[-1])
    with open(path, "rb") as f:
        scanner, expected = FrameScanner(f.fileno()), segments[-1]
        while True:
            offset = scanner.offset
            try:
                frame = scanner.next_frame()
                if frame is None:
                    return None  # the end, or an incomplete last batch (torn)
                batch = Batch.parse(frame)
            except BatchError as e:
                reason = e.reason
            else:
                if batch.first_seq == expected:
                    expected = batch.last_seq + 1
                    continue
                reason = f"batch holds sequences from {batch.first_seq}, {expected} was expected"
            rest = read_from(f.fileno(), offset)
            if not rest.strip(b"\0") or next_valid_batch(rest, 1) is not None:
                return None  # zeros (power loss), or valid data follows (the writer refuses that itself)
            return Finding(path, offset, f"{reason}: {len(rest)} bytes at the end that are not a torn write")


def truncate_at(root: str | os.PathLike[str], stream: str, segment: str | int, offset: int) -> RecoveryReport:
    """Discard a stream from byte `offset` of `segment` on, and every later segment: the explicit repair for a
    fault JournalWriter.open refuses to skip (its JournalCorrupt names segment and offset).

    Destructive, hence never automatic. Takes the writer lock, so it fails while a gateway writes the stream.
    The head file moves past every sequence found in the discarded bytes, so none is ever reused: readers
    meet JournalTrimmed at the gap, and verify reports it as missing sequences until retention removes it.
    """
    check_stream_name(stream)
    directory = Path(root) / stream
    seq = segment if isinstance(segment, int) else parse_segment_name(segment)
    path = seg_path(directory, seq)
    if not path.is_file():
        raise JournalError(f"no segment {segment_name(seq)} in {directory}: take the name from the error or verify")
    lock_fd = lock_stream(directory, stream)
    try:
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if not 0 <= offset <= size:
                raise ValueError(f"offset {offset} is outside {path.name} (0..{size} bytes)")
            highest = _highest(read_from(f.fileno(), offset))
            f.truncate(offset)
            os.fsync(f.fileno())
        dropped = size - offset
        later = [s for s in list_segments(directory) if s > seq]
        for s in later:
            later_path = seg_path(directory, s)
            highest = max(highest, _highest(later_path.read_bytes()))
            dropped += later_path.stat().st_size
            later_path.unlink()
            idx_path(directory, s).unlink(missing_ok=True)
        kept = b"".join(INDEX_ENTRY.pack(*e) for e in read_index(idx_path(directory, seq)) if e[2] < offset)
        idx_path(directory, seq).write_bytes(kept)
        last_good, last_ts = segment_tail(directory, seq)
        head = read_head(directory) or (1, 0)
        next_seq = max(head[0], highest[0] + 1, last_good + 1)
        write_head(directory, next_seq, max(head[1], highest[1], last_ts or 0))
    finally:
        os.close(lock_fd)
    report = RecoveryReport(
        path,
        offset,
        dropped,
        last_good,
        f"discarded by truncate_at with {len(later)} later segment(s); the next sequence will be {next_seq}",
    )
    log.warning("journal %s: %s", stream, report.describe())
    return report


def cut_after(root: str | os.PathLike[str], stream: str, last_keep: int) -> int:
    """Discard every batch after sequence `last_keep` (which must end a batch) so that the next append is
    `last_keep + 1`: a replica whose journal went further than its new leader's (records its old leader
    journaled but never replicated) takes the leader's records at those sequences instead. Unlike truncate_at,
    the sequences are reused on purpose; they were never confirmed. Returns the number of bytes discarded.
    """
    check_stream_name(stream)
    directory = Path(root) / stream
    lock_fd = lock_stream(directory, stream)
    try:
        dropped, last_ts = 0, 0
        for seq in reversed(list_segments(directory)):
            path = seg_path(directory, seq)
            if seq > last_keep:  # wholly after the cut
                dropped += path.stat().st_size
                path.unlink()
                idx_path(directory, seq).unlink(missing_ok=True)
                continue
            with open(path, "rb") as f:
                scanner, offset = FrameScanner(f.fileno()), 0
                while (frame := scanner.next_frame()) is not None:
                    first, last, ts = HEADER.unpack_from(frame)[6:9]
                    if first > last_keep:
                        break
                    if last > last_keep:
                        raise JournalError(f"stream {stream}: sequence {last_keep} does not end a batch")
                    offset, last_ts = scanner.offset, ts
                size = os.fstat(f.fileno()).st_size
                if offset < size:
                    _replace_with_prefix(f, path, offset)
            dropped += size - offset
            kept = b"".join(INDEX_ENTRY.pack(*e) for e in read_index(idx_path(directory, seq)) if e[2] < offset)
            idx_path(directory, seq).write_bytes(kept)
            break
        write_head(directory, last_keep + 1, last_ts)
        cut_epochs(directory, last_keep)
    finally:
        os.close(lock_fd)
    if dropped:
        log.warning("journal %s: discarded %d bytes after sequence %d (never confirmed)", stream, dropped, last_keep)
    return dropped


def _replace_with_prefix(f: BinaryIO, path: Path, size: int) -> None:
    """Replace the segment by a new file holding its first `size` bytes rather than truncate it in place: a new
    inode, so that every reader holding the old one finds it deleted and looks for its place again (a file
    cut and then appended to past a reader's position would look to it like one that only grew)."""
    tmp = path.with_name(path.name + ".cut")
    with open(tmp, "wb") as out:
        left, offset = size, 0
        while left:
            chunk = os.pread(f.fileno(), min(left, 1 << 20), offset)
            if not chunk:
                raise JournalError(f"{path}: shorter than {size} bytes while being cut")
            out.write(chunk)
            left, offset = left - len(chunk), offset + len(chunk)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _highest(data: bytes) -> tuple[int, int]:
    """(highest last_seq, highest ts_ns) among the valid batches anywhere in `data` ((0, 0) if none)."""
    view, pos, best = memoryview(data), 0, (0, 0)
    while (found := next_valid_batch(data, pos)) is not None:
        _, _, _, length, _, _, _, last, ts = HEADER.unpack_from(view, found)
        best = (max(best[0], last), max(best[1], ts))
        pos = found + length
    return best
