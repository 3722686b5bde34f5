"""The gateway's producer table (exactly-once publishing), sans-IO: duplicates, overlaps, gaps, expiry, bounds,
and rebuilding from journaled batches alone."""

from __future__ import annotations

from gateway.sequencer.producers import ProducerTable
from gateway.wire import batch as B

SECOND = 1_000_000_000


def journaled(pid: int, pseq: int, count: int, first_seq: int, ts_ns: int) -> B.Batch:
    """A sequenced FLAG_PRODUCER batch as the journal holds it."""
    raw = B.encode(0, [(0, b"k", b"v")] * count, producer=(pid, pseq))
    return B.Batch.parse(B.resequence(B.Batch.parse(raw), first_seq, ts_ns))


def test_duplicates_overlaps_and_gaps() -> None:
    table = ProducerTable(expiry_ns=60 * SECOND, capacity=10)
    assert table.duplicates(1, 0, 5) == 0  # unknown producer: all new
    table.journaled(journaled(1, 0, 5, first_seq=100, ts_ns=1))
    assert table.get(1) is not None and (table.get(1).last_pseq, table.get(1).last_seq) == (4, 104)  # type: ignore[union-attr]
    assert table.duplicates(1, 0, 5) == 5  # a full re-send
    assert table.duplicates(1, 2, 2) == 2  # a re-sent part
    assert table.duplicates(1, 3, 4) == 2  # overlap: 3 and 4 journaled, 5 and 6 new
    assert table.duplicates(1, 5, 3) == 0  # the next batch
    assert table.duplicates(2, 0, 5) == 0  # producers are independent
    # A gap is refused (the gateway answers "re-send from 5"): 5..8 were refused while 9 was on its way.
    assert table.missing(1, 9) == 5
    assert [table.missing(1, first) for first in (0, 3, 5)] == [None, None, None]  # re-sent, overlapping, next
    assert table.missing(2, 9) is None  # an unknown (or forgotten) producer starts anywhere


def test_expiry_and_capacity_forget_the_least_recently_seen() -> None:
    table = ProducerTable(expiry_ns=10 * SECOND, capacity=2)
    table.journaled(journaled(1, 0, 1, first_seq=1, ts_ns=0))
    table.journaled(journaled(2, 0, 1, first_seq=2, ts_ns=5 * SECOND))
    table.journaled(journaled(1, 1, 1, first_seq=3, ts_ns=6 * SECOND))  # 1 seen again: 2 is now the oldest
    table.journaled(journaled(3, 0, 1, first_seq=4, ts_ns=7 * SECOND))  # over capacity: 2 is forgotten
    assert table.get(2) is None and len(table) == 2
    assert table.expire(16 * SECOND + 1) == 1  # 1 was last seen at 6 s
    assert table.get(1) is None and table.get(3) is not None
    assert table.duplicates(1, 0, 2) == 0  # forgotten: its next batch is new


def test_rebuilt_from_journal_batches_alone() -> None:
    batches = [
        journaled(7, 0, 3, first_seq=1, ts_ns=1),
        B.Batch.parse(B.resequence(B.Batch.parse(B.encode(0, [(0, b"k", b"plain")])), 4, 2)),  # no producer
        journaled(7, 3, 2, first_seq=5, ts_ns=3),
        journaled(8, 10, 1, first_seq=7, ts_ns=4),
    ]
    live, rebuilt = ProducerTable(SECOND, 10), ProducerTable(SECOND, 10)
    for batch in batches:
        live.journaled(batch)
    for batch in batches:  # as read back from the journal after a crash: the same bytes
        rebuilt.journaled(B.Batch.parse(bytes(batch.buf)))
    assert [rebuilt.get(p) for p in (7, 8)] == [live.get(p) for p in (7, 8)]
    assert rebuilt.duplicates(7, 0, 5) == 5 and rebuilt.duplicates(8, 10, 2) == 1


def test_spark_reads_producer_batches_past_their_longer_header() -> None:
    from gateway.spark.arrow import to_record_batch

    tagged = B.Batch.parse(
        B.resequence(B.Batch.parse(B.encode(0, [(5, b"k1", b"v1"), (6, b"k2", b"v2")], producer=(9, 3))), 10, 7)
    )
    plain = B.Batch.parse(B.resequence(B.Batch.parse(B.encode(0, [(8, b"k3", b"v3")])), 12, 8))
    table = to_record_batch("s", [tagged, plain], 0, 100)
    assert table is not None
    got = table.to_pydict()
    assert (got["seq"], got["key"], got["body"]) == ([10, 11, 12], ["k1", "k2", "k3"], [b"v1", b"v2", b"v3"])
