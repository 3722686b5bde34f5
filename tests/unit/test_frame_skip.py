"""Reaching a range in a journal segment: batches before it are passed over by header, in bulk
(`FrameScanner.skip`), and a cursor moved on with `Cursor.skip_to` returns the batch holding the range next,
never one the committed mark does not cover yet."""

from __future__ import annotations

from pathlib import Path

from gateway.journal import JournalReader, JournalWriter
from gateway.journal.committed import CommittedMark
from gateway.journal.layout import FrameScanner, seg_path
from gateway.wire.batch import HEADER, Batch, encode


def journal(root: Path, batches: int, per: int) -> Path:
    """Stream "s": `batches` batches of `per` records from sequence 1."""
    with JournalWriter.open(root, "s") as w:
        for first in range(1, batches * per + 1, per):
            w.append(Batch.parse(encode(first, [(0, b"k", b"%d" % s) for s in range(first, first + per)])))
    return root


def first_last(frame: memoryview) -> tuple[int, int]:
    first, last = HEADER.unpack_from(frame)[6:8]
    return first, last


def test_skip_passes_whole_batches_before_the_range_and_stops_at_the_one_holding_it(tmp_path: Path) -> None:
    root = journal(tmp_path, 10, 3)  # 1-3, 4-6, ..., 28-30
    with open(seg_path(root / "s", 1), "rb") as f:
        scanner = FrameScanner(f.fileno())
        assert scanner.skip(1, 100) == (1, 0)  # nothing read yet: nothing to pass over
        frame = scanner.next_frame()
        assert frame is not None and first_last(frame) == (1, 3)
        assert scanner.skip(4, 10) == (10, 2)  # 4-6 and 7-9; 10-12 holds 10
        frame = scanner.next_frame()
        assert frame is not None and first_last(frame) == (10, 12)
        assert scanner.skip(14, 100) == (14, 0)  # 13-15 does not continue at 14: left to the caller
        assert scanner.skip(13, 100) == (31, 6)
        assert scanner.next_frame() is None


def test_a_cursor_moved_on_returns_the_batch_holding_the_range(tmp_path: Path) -> None:
    root = journal(tmp_path, 2000, 1)
    reader = JournalReader(root, "s")
    with reader.cursor(5) as cursor:
        assert (batch := cursor.next_batch()) is not None and batch.first_seq == 5
        cursor.skip_to(1990)
        assert (batch := cursor.next_batch()) is not None and batch.first_seq == 1990
        assert cursor.batches_skipped == 4 + 1984  # 1-4 from the segment start to 5, then 6-1989
        cursor.skip_to(3)  # behind it: nothing changes
        assert (batch := cursor.next_batch()) is not None and batch.first_seq == 1991


def test_a_cursor_moved_on_waits_for_the_committed_mark(tmp_path: Path) -> None:
    root = journal(tmp_path, 100, 1)
    mark = CommittedMark(root / "s")
    mark.advance(50)
    reader = JournalReader(root, "s", committed=True)
    with reader.cursor(10) as cursor:
        assert (batch := cursor.next_batch()) is not None and batch.first_seq == 10
        cursor.skip_to(80)
        assert cursor.next_batch() is None  # 80 is journaled, not committed
        assert cursor.next_seq == 51  # passed over what the mark covers, no further
        mark.advance(90)
        assert (batch := cursor.next_batch()) is not None and batch.first_seq == 80
    mark.close()
