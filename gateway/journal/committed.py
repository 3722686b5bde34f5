"""The committed mark of a stream (docs/ha.md, "Guarantees"): how far a node of a replicated group may serve.

A node of a group journals records before they are committed (its followers may not hold them yet; a deposed
leader may have journaled some alone, and cuts them when it rejoins). Its replay sidecar, another process,
must serve only committed records, like Kafka's high watermark. The gateway tells it through a small file
beside the segments, `committed`: 16 bytes written in place with one pwrite, the sequence (8 bytes, big
endian) and the same sequence xor `_CHECK`, so that a reader racing a write (Linux does not promise that a
pread sees a concurrent pwrite whole) sees a mismatch and reads again. The mark only grows and is not
fsynced: it is advice to readers of this node's journal, which hold no record the mark does not cover,
and a committed record is never cut.

A stream with no such file (a single gateway: it removes any stale one on open) is served to its end, as
always; a reader pays one failed open per cursor for knowing that.
"""

from __future__ import annotations

import contextlib
import os
import struct
from pathlib import Path

MARK_NAME = "committed"
_MARK = struct.Struct(">QQ")
_CHECK = 0x5A45_5053_4D41_524B  # "ZEPSMARK"
_RETRIES = 8


class CommittedMark:
    """The writer's side (the gateway of a node): one per stream, kept open."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / MARK_NAME
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.value = _read(self._fd) or 0  # a mark left by an earlier run still holds: commits are never undone
        self._put(self.value)

    def advance(self, seq: int) -> None:
        """Every record through `seq` is committed (a lower `seq` changes nothing)."""
        if seq > self.value:
            self._put(seq)

    def lower(self, seq: int) -> None:
        """The journal was cut to `seq` below the mark: not supposed to happen (cuts drop uncommitted records
        only); the caller logs it, and readers must not serve what replaces the cut records unchecked."""
        self._put(min(seq, self.value))

    def _put(self, seq: int) -> None:
        os.pwrite(self._fd, _MARK.pack(seq, seq ^ _CHECK), 0)
        self.value = seq

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class MarkReader:
    """A reader's side (a sidecar's cursor): the mark of one stream, read with one pread."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._last = 0

    def read(self) -> int | None:
        """The committed mark now; None if the file was removed (the stream is a single gateway's again)."""
        if os.fstat(self._fd).st_nlink == 0:
            return None
        value = _read(self._fd)
        if value is not None:
            self._last = value
        return self._last  # torn every time (a writer rewriting it non-stop): the last good value is safe

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_mark(directory: Path) -> MarkReader | None:
    """The stream's mark for reading, or None when its journal has none (served to its end)."""
    try:
        return MarkReader(os.open(directory / MARK_NAME, os.O_RDONLY))
    except FileNotFoundError:
        return None


def read_mark(directory: Path) -> int | None:
    """The mark's value once (None: no mark)."""
    mark = open_mark(directory)
    if mark is None:
        return None
    try:
        return mark.read()
    finally:
        mark.close()


def remove_mark(directory: Path) -> None:
    """A single gateway opens the stream: no committed mark limits its readers."""
    with contextlib.suppress(FileNotFoundError):
        (directory / MARK_NAME).unlink()


def _read(fd: int) -> int | None:
    for _ in range(_RETRIES):
        data = os.pread(fd, _MARK.size, 0)
        if len(data) < _MARK.size:
            return None
        seq, check = _MARK.unpack(data)
        if seq ^ check == _CHECK:
            return seq
    return None
