"""Recovery of the active segment when the batch its last index entry points at is the fault (found by fuzzing,
tests/fuzz/targets.py `journal`): the head comes from batches recovery checked, never from an unchecked header."""

from __future__ import annotations

from pathlib import Path

from gateway.journal import Durability, JournalReader, JournalWriter, verify_root
from gateway.journal.layout import HEAD_NAME, INDEX_ENTRY, idx_path, read_index, seg_path
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


def test_a_torn_index_entry_is_cut_so_later_entries_stay_aligned(tmp_path: Path) -> None:
    """The active segment's index is synced only when the segment is sealed: a power loss can leave part of its
    last entry, which recovery kept, and every entry appended after it was misaligned (tests/process/
    test_power_loss.py, "torn")."""
    write(tmp_path, (1, 3, 2))
    idx, seg = idx_path(tmp_path / S, 1), seg_path(tmp_path / S, 1)
    idx.write_bytes(idx.read_bytes()[:-5])  # the last batch's entry torn
    seg.write_bytes(seg.read_bytes()[:-5])  # and the batch too
    with JournalWriter.open(tmp_path, S, durability=Durability("never"), index_interval=1) as w:
        assert w.last_seq == 4
        w.append(Batch.parse(encode(0, [(0, b"k", b"v")])))
    assert verify_root(tmp_path).clean
    assert [seq for seq, _, _ in read_index(idx)] == [1, 2, 5]


def test_a_zeroed_early_index_entry_is_not_kept_behind_good_ones(tmp_path: Path) -> None:
    """A power loss that wrote back later index entries and lost an earlier one: recovery kept the zeroed entry
    because the last one checked out (tests/process/test_power_loss.py, "reorder")."""
    write(tmp_path, (1, 3, 2))
    idx = idx_path(tmp_path / S, 1)
    idx.write_bytes(bytes(24) + idx.read_bytes()[24:])
    JournalWriter.open(tmp_path, S, durability=Durability("never"), index_interval=1).close()
    assert verify_root(tmp_path).clean
    assert [seq for seq, _, _ in read_index(idx)] == [1, 2, 5]


def test_an_index_entry_at_the_largest_offset_is_ignored(tmp_path: Path) -> None:
    """An entry whose offset plus a header passes off_t made pread fail with EINVAL: an OSError out of a reader
    (found by tests/fuzz/targets.py `journal`)."""
    write(tmp_path, (1, 3, 2))
    idx = idx_path(tmp_path / S, 1)
    idx.write_bytes(INDEX_ENTRY.pack(1, 0, 2**63 - 1) + idx.read_bytes()[INDEX_ENTRY.size :])
    assert read(tmp_path) == [(1, 1), (2, 4), (5, 6)]
