"""The on-disk layout of a journal stream, its errors, and the primitives every part of the journal reads it with.

One directory per stream::

    ROOT/<stream>/
        00000000000000000001.seg   batches exactly as gateway.wire.batch encodes them, back to back
        00000000000000000001.idx   sparse index of that segment: INDEX_ENTRY records (seq, ts_ns, offset)
        head                       "<next_seq> <last_ts_ns>": keeps sequences unique if segments vanish
        writer.lock                flock'ed by the stream's one writer; holds its pid

A segment is named by the first sequence it holds (20 digits: any u64 sorts by name), so finding the
segment of a sequence is a bisect over a directory listing, and the successor of a finished segment is
named by the sequence after its last batch: a reader at the end of a segment knows which file to look for.
"""

from __future__ import annotations

import io
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gateway.errors import BatchError, JournalError
from gateway.wire.batch import HEADER, HEADER_SIZE, MAGIC, MAX_SEQ, Batch, frame_length

SEG_SUFFIX = ".seg"
IDX_SUFFIX = ".idx"
HEAD_NAME = "head"
LOCK_NAME = "writer.lock"
INDEX_ENTRY = struct.Struct("<QQQ")  # seq (first of the batch), ts_ns, byte offset in the segment
READ_SIZE = 1 << 20  # large preads: per-batch work only, few syscalls
_SEG_RE = re.compile(r"^(\d{20})\.seg$")
_STREAM_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_RETRIES = 3
T = TypeVar("T")


def repair_hint(root: Path, stream: str) -> str:
    """The fix every JournalCorrupt offers: look at everything first, then cut explicitly (never implicitly)."""
    return (
        f"Nothing was changed. Stop the gateway and run `zeps journal repair {root} --stream {stream}`: it lists "
        "every fault, then (once confirmed) discards this stream from the first corrupt batch on; the records "
        "there are lost, their sequences are never reused"
    )


class SegmentGone(JournalError):
    """Internal: the segment being read was unlinked while bytes of it were still unread."""


class SegmentShrank(JournalError):
    """Internal: the segment being read is now shorter than the position reached (a replica's journal was cut
    back: journal.tools.cut_after)."""


def check_stream_name(stream: str) -> None:
    """Stream names become directory names: refuse anything that could escape the root or hide."""
    if not _STREAM_RE.match(stream):
        raise ValueError(
            f"stream name {stream!r} is not allowed: use letters, digits, '_', '-', '.', not starting with '.'"
        )


def segment_name(seq: int) -> str:
    return f"{seq:020d}{SEG_SUFFIX}"


def seg_path(directory: Path, seq: int) -> Path:
    return directory / segment_name(seq)


def idx_path(directory: Path, seq: int) -> Path:
    return directory / f"{seq:020d}{IDX_SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    """First sequences of the segments in `directory`, ascending."""
    return sorted(int(m.group(1)) for name in os.listdir(directory) if (m := _SEG_RE.match(name)))


def parse_segment_name(name: str) -> int:
    match = _SEG_RE.match(Path(name).name)
    if not match:
        raise ValueError(f"{name!r} is not a segment file name (20 digits + {SEG_SUFFIX})")
    return int(match.group(1))


def read_head(directory: Path) -> tuple[int, int] | None:
    """(next_seq, last_ts_ns) from the head file, or None when there is none (or it is unreadable: not two
    numbers, or numbers no journal holds, so a damaged file can never move the sequence out of range)."""
    try:
        next_seq, last_ts = map(int, (directory / HEAD_NAME).read_bytes().split())
    except (FileNotFoundError, ValueError):
        return None
    return (next_seq, last_ts) if 1 <= next_seq < MAX_SEQ and 0 <= last_ts < MAX_SEQ else None


def write_head(directory: Path, next_seq: int, last_ts: int) -> None:
    """Replace the head file atomically (readers see the old or the new one, never half of one)."""
    tmp = directory / f"{HEAD_NAME}.tmp"
    tmp.write_text(f"{next_seq} {last_ts}\n")
    os.replace(tmp, directory / HEAD_NAME)


def read_index(path: Path) -> list[tuple[int, int, int]]:
    """All complete entries of an index file (a partly written last entry is ignored); [] if missing."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    end = len(data) - len(data) % INDEX_ENTRY.size
    return list(INDEX_ENTRY.iter_unpack(data[:end]))


MAX_OFFSET = 2**63 - 1  # what pread takes (off_t)


def open_segment(directory: Path, seq: int) -> io.FileIO | None:
    """The segment opened for reading, or None if it does not exist (not yet, or not any more)."""
    try:
        return io.FileIO(seg_path(directory, seq), "r")
    except FileNotFoundError:
        return None


def header_at(fd: int, offset: int) -> tuple[int, int, int] | None:
    """(first_seq, last_seq, ts_ns) of the batch header at `offset`, or None if there is no valid header."""
    if not 0 <= offset <= MAX_OFFSET - HEADER_SIZE:
        return None  # a corrupt index entry may hold any u64 (pread refuses an end past off_t too)
    data = os.pread(fd, HEADER_SIZE, offset)
    try:
        frame_length(data)
    except BatchError:
        return None
    return HEADER.unpack_from(data)[6:9]


def index_entry_ok(fd: int, entry: tuple[int, int, int]) -> bool:
    """Whether an index entry points at a batch header with its sequence and time (a cheap trust check)."""
    seq, ts, offset = entry
    header = header_at(fd, offset)
    return header is not None and header[0] == seq and header[2] == ts


class FrameScanner:
    """The complete frames of one segment from a byte offset on, read with large preads.

    A frame is a batch's bytes as delimited by its header (magic and length checked, nothing else): callers
    parse what they need. The scanner never returns a frame the file does not fully hold yet, so a batch
    being written is simply not there; `partial` then tells whether bytes of one are. It raises
    SegmentGone rather than read a segment that was unlinked under it, and SegmentShrank when the file is shorter
    than its position (cut back under it).
    """

    __slots__ = ("_buf", "_pos", "bytes_read", "fd", "offset", "size")

    def __init__(self, fd: int, offset: int = 0) -> None:
        self.fd = fd
        self.offset = offset  # file offset of the next frame
        self.size = offset  # file size at the last refill
        self.bytes_read = 0
        self._buf = memoryview(b"")
        self._pos = 0

    @property
    def partial(self) -> bool:
        """After next_frame() returned None: whether bytes of an incomplete frame follow the last one."""
        return self.size > self.offset

    def next_frame(self) -> memoryview | None:
        """The next complete frame, or None at the current end of data. Raises BatchError on a bad header."""
        while True:  # at most three passes: header refill, frame refill, return
            buf, pos = self._buf, self._pos
            have = len(buf) - pos
            need = frame_length(buf, pos) if have >= HEADER_SIZE else HEADER_SIZE
            if need <= have:
                self._pos = pos + need
                self.offset += need
                return buf[pos : pos + need]
            if not self._fill(need):
                return None

    def skip(self, expected: int, through: int) -> tuple[int, int]:
        """Pass over the complete frames already read that continue the stream at `expected` and end at or
        before `through`, by header fields alone (one unpack each); stop at anything else, which next_frame()
        then returns (or refuses) as usual. Returns (the sequence expected next, frames passed over)."""
        buf, pos, passed = self._buf, self._pos, 0
        end = len(buf)
        while end - pos >= HEADER_SIZE:
            magic, _, _, length, _, _, first, last, _ = HEADER.unpack_from(buf, pos)
            if magic != MAGIC or not HEADER_SIZE <= length <= end - pos or first != expected or last > through:
                break
            pos += length
            expected = last + 1
            passed += 1
        self.offset += pos - self._pos
        self._pos = pos
        return expected, passed

    def _fill(self, need: int) -> bool:
        st = os.fstat(self.fd)
        self.size = st.st_size
        if st.st_nlink == 0 and st.st_size > self.offset:
            raise SegmentGone
        if st.st_size < self.offset:
            raise SegmentShrank
        if st.st_size - self.offset < need:
            # At the tail: forget what was read of an incomplete frame. A recovering writer may replace a
            # torn batch with a different one, which must not be sized by the stale header.
            self._buf, self._pos = memoryview(b""), 0
            return False
        data = os.pread(self.fd, max(need, READ_SIZE), self.offset)
        self.bytes_read += len(data)
        self._buf, self._pos = memoryview(data), 0
        return len(data) >= need


def next_valid_batch(data: bytes, start: int) -> int | None:
    """Offset of the first position >= start in `data` where a whole valid batch (CRC included) begins.

    This is how a fault is told from a torn tail: a tail has no valid batch after it.
    """
    view = memoryview(data)
    pos = data.find(MAGIC, start)
    while pos >= 0:
        try:
            end = pos + frame_length(view, pos)
            if end <= len(data):
                Batch.parse(view[pos:end])
                return pos
        except BatchError:
            pass
        pos = data.find(MAGIC, pos + 1)
    return None


def read_from(fd: int, offset: int) -> bytes:
    """Everything in the file from `offset` to its current end (used only on faults, by verify and repair)."""
    return os.pread(fd, max(0, os.fstat(fd).st_size - offset), offset)


def segment_tail(directory: Path, seq: int) -> tuple[int, int | None]:
    """(last_seq, last_ts_ns or None) of the complete batches in a segment, from its last index entry on.

    Headers only (no CRC): this answers "how far does the journal go", cheaply, while the writer appends.
    Raises FileNotFoundError if the segment is gone.
    """
    with io.FileIO(seg_path(directory, seq), "r") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        start, last, ts = 0, seq - 1, None
        for eseq, ets, eoff in reversed(read_index(idx_path(directory, seq))):
            if eoff < size and index_entry_ok(fd, (eseq, ets, eoff)):
                start = eoff
                break
        scanner = FrameScanner(fd, start)
        try:
            while (frame := scanner.next_frame()) is not None:
                last, ts = HEADER.unpack_from(frame)[7:9]
        except BatchError:
            pass  # the head is the last complete batch before a fault; verify reports the fault
        return last, ts


def stream_head(directory: Path, segments: list[int]) -> tuple[int, int | None]:
    """(last_seq, last_ts_ns) of a stream: the tail of its last segment, or of the one before if that is empty."""
    last, ts = segments[-1] - 1, None
    for seq in reversed(segments[-2:]):
        seg_last, seg_ts = segment_tail(directory, seq)
        last = max(last, seg_last)
        if seg_ts is not None:
            return last, seg_ts
    return last, ts


def first_ts(directory: Path, seq: int) -> int | None:
    """Journal time of a segment's first batch, None if it has none yet. Raises FileNotFoundError if gone."""
    with io.FileIO(seg_path(directory, seq), "r") as f:
        header = header_at(f.fileno(), 0)
    return None if header is None else header[2]


def retrying(what: str, read: Callable[[], T]) -> T:
    """Run a list-then-open read again if retention deleted a segment between the two (bounded)."""
    for _ in range(_RETRIES):
        try:
            return read()
        except FileNotFoundError:
            continue
    raise JournalError(f"{what}: segments keep vanishing while being read (retention deleting hard?); retry")
