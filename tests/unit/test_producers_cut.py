"""After a follower cuts its journal back to its new leader's, its producer table is the one a full rescan of the
cut journal builds (gateway.sequencer.recovery.after_cut), over generated journals: producers whose last batch
was in the dropped tail, or below it, or both; small segments, small windows, and tables that forgot producers
for capacity. A publisher's re-send of what was dropped is then new, as on a node that never journaled it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.journal import JournalReader, JournalWriter
from gateway.journal.tools import cut_after
from gateway.sequencer.producers import ProducerTable
from gateway.sequencer.recovery import after_cut, recover
from gateway.wire import batch as B

STREAM = "s"
FOREVER_S, ALL_BYTES = 10.0**6, 1 << 40  # no expiry, no byte budget: the reference reads everything


def producer_batch(pid: int | None, pseq: int, count: int) -> B.Batch:
    """An unsequenced batch of `count` records, numbered from `pseq` by producer `pid` (None: a plain batch)."""
    records = [(0, b"k", b"v%d" % i) for i in range(count)]
    return B.Batch.parse(B.encode(0, records, producer=None if pid is None else (pid, pseq)))


def entries(table: ProducerTable) -> list[tuple[int, int, int, int]]:
    """The table's producers, least recently seen first: (id, last number, last sequence, seen)."""
    return [(pid, p.last_pseq, p.last_seq, p.seen_ns) for pid, p in table.items()]


def journal_and_table(
    root: Path, batches: list[tuple[int | None, int]], capacity: int
) -> tuple[list[int], ProducerTable]:
    """Journal `batches` ((producer, count) each, numbered on per producer) in small segments, noting each in a
    table as the gateway does live: the last sequence of each batch, and the table."""
    table, numbers, ends = ProducerTable(int(FOREVER_S * 1e9), capacity), dict[int, int](), []
    writer = JournalWriter.open(root, STREAM, segment_bytes=400)
    try:
        for pid, count in batches:
            pseq = numbers.get(pid, 0) if pid is not None else 0
            if pid is not None:
                numbers[pid] = pseq + count
            table.journaled(B.Batch.parse(writer.append(producer_batch(pid, pseq, count))))
            ends.append(writer.last_seq)
    finally:
        writer.close()
    return ends, table


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 4)), st.integers(1, 4)), min_size=1, max_size=50),
    cut_at=st.integers(0, 50),  # batches kept, modulo their number + 1
    capacity=st.sampled_from([3, 100]),
    window=st.sampled_from([1, 3, 16]),
)
def test_the_table_after_a_cut_is_the_rescanned_one(
    batches: list[tuple[int | None, int]], cut_at: int, capacity: int, window: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ends, table = journal_and_table(root, batches, capacity)
        kept = cut_at % (len(ends) + 1)
        keep = ends[kept - 1] if kept else 0
        cut_after(root, STREAM, keep)
        reader = JournalReader(root, STREAM)
        after = after_cut(table, reader, keep, FOREVER_S, ALL_BYTES, window)
        rescanned = ProducerTable(table.expiry_ns, capacity)
        if keep:
            recover(rescanned, reader, FOREVER_S, ALL_BYTES)
        assert entries(after) == entries(rescanned)


def test_a_resend_of_the_dropped_tail_is_new_and_what_was_kept_a_duplicate(tmp_path: Path) -> None:
    """Producer 1 journaled 0..9 below the cut and 10..19 in the dropped tail (never confirmed); producer 2 only in
    the tail. After the cut 10..19 are new again, 0..9 still duplicates, and producer 2 is unknown."""
    ends, table = journal_and_table(tmp_path, [(1, 5), (1, 5), (1, 10), (2, 3)], 100)
    cut_after(tmp_path, STREAM, ends[1])
    table = after_cut(table, JournalReader(tmp_path, STREAM), ends[1], FOREVER_S, ALL_BYTES, 1)
    assert table.duplicates(1, 0, 10) == 10 and table.duplicates(1, 10, 10) == 0
    assert table.missing(1, 10) is None  # the re-send continues the producer: taken, not refused as a gap
    assert table.get(2) is None


def test_a_producer_first_seen_in_the_dropped_tail_is_looked_for_below_what_the_table_saw(tmp_path: Path) -> None:
    """Producer 1 journaled record 0 long ago, beyond the byte budget of the restart that built the table (which
    then saw only producer 2's batches), and record 1 in the dropped tail: the look back skips what the table saw
    and finds record 0, as a rescan reaching that far does."""
    ends, _ = journal_and_table(tmp_path, [(1, 1), *[(2, 1)] * 40], 100)
    table = ProducerTable(int(FOREVER_S * 1e9), 100)
    recover(table, JournalReader(tmp_path, STREAM), FOREVER_S, 1000)  # a few segments from the end
    assert table.get(1) is None and table.complete_from > ends[0]
    writer = JournalWriter.open(tmp_path, STREAM, segment_bytes=400)
    table.journaled(B.Batch.parse(writer.append(producer_batch(1, 1, 1))))
    writer.close()
    cut_after(tmp_path, STREAM, ends[-1])
    table = after_cut(table, JournalReader(tmp_path, STREAM), ends[-1], FOREVER_S, ALL_BYTES, 1)
    found = table.get(1)
    assert found is not None and (found.last_pseq, found.last_seq) == (0, ends[0])
