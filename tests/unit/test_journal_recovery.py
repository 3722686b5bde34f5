"""Recovery of the active segment when the batch its last index entry points at is the fault (found by fuzzing,
tests/fuzz/targets.py `journal`): the head comes from batches recovery checked, never from an unchecked header."""

from __future__ import annotations

from pathlib import Path

from gateway.journal import Durability, JournalReader, JournalWriter
from gateway.journal.layout import HEAD_NAME, idx_path, read_index, seg_path
from gateway.wire.batch import Batch, encode

S = "s"


def write(root: Path, sizes: tuple[int, ...]) -> list[int]:
    """Batches of `sizes` records, an index entry for each; their offsets."""
    with JournalWriter.open(root, S, durability=Durability("never"), index_interval=1) as w:
        for n in sizes:
            w.append(Batch.parse(encode(0, [(i, b"k", b"body %d" % i) for i in range(n)])))
    (root / S / HEAD_NAME).unlink()  # as a crash leaves it: the head file lags the segment
    offsets = [offset for _, _, offset in read_index(idx_path(root / S, 1))]
    assert len(offsets) == len(sizes)
    return offsets


def read(root: Path) -> list[tuple[int, int]]:
    reader = JournalReader(root, S)
    with reader.cursor(reader.first_seq) as cursor:
        out = []
        while (b := cursor.next_batch()) is not None:
            out.append((b.first_seq, b.last_seq))
        return out


def test_a_torn_last_batch_after_a_damaged_one_cuts_both(tmp_path: Path) -> None:
    offsets = write(tmp_path, (1, 3, 2))
    path = seg_path(tmp_path / S, 1)
    data = bytearray(path.read_bytes())
    data[offsets[2] - 1] ^= 0xFF  # the second batch's last body byte: its CRC no longer checks out
    path.write_bytes(data[:-5])  # and the third is torn
    with JournalWriter.open(tmp_path, S, durability=Durability("never")) as w:
        assert w.last_seq == 1  # was 4: the head came from the damaged batch's header, unchecked
        assert w.recovery is not None and w.recovery.offset == offsets[1] and "CRC32C" in w.recovery.reason
        w.append(Batch.parse(encode(0, [(0, b"k", b"v")])))
    assert read(tmp_path) == [(1, 1), (2, 2)]  # was JournalCorrupt at the damaged batch


def test_a_torn_last_batch_alone_keeps_everything_before_it(tmp_path: Path) -> None:
    offsets = write(tmp_path, (1, 3, 2))
    path = seg_path(tmp_path / S, 1)
    path.write_bytes(path.read_bytes()[:-5])
    with JournalWriter.open(tmp_path, S, durability=Durability("never")) as w:
        assert w.last_seq == 4
        assert w.recovery is not None and w.recovery.offset == offsets[2]
    assert read(tmp_path) == [(1, 1), (2, 4)]
