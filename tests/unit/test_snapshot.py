"""Snapshots in process: the TTL batch layout, the SNAPSHOT commands, the sidecar's last-value index and its
snapshot batches, and the client's key -> value view. The index reads journals written here by JournalWriter;
the publisher's TTLs go through a real gateway process."""

from __future__ import annotations

import logging
import random
import struct
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.records import NOW, Rec, last_values, write

from gateway.client.snapshot_view import LastValues
from gateway.errors import JournalCorrupt, NotAJournal
from gateway.journal import JournalReader, JournalWriter, Retention
from gateway.sidecar.snapshots import MAX_DELTA, VALUE, Frozen, SnapshotFeed, SnapshotIndex, SnapshotIndexes
from gateway.wire import batch as B
from gateway.wire import protocol as P

SECOND = 10**9

# --- the batch format with TTLs ------------------------------------------------------------------------------

keys = st.binary(max_size=B.MAX_KEY)
ttl_record = st.tuples(st.integers(0, 2**64 - 1), keys, st.binary(max_size=100), st.integers(0, B.MAX_TTL_MS))
ttl_records = st.lists(ttl_record, min_size=1, max_size=30)


@given(ttl_records, st.integers(0, 2**40))
def test_ttl_round_trip(recs: list[tuple[int, bytes, bytes, int]], first: int) -> None:
    b = B.Batch.parse(B.encode(first, recs, ttl=True))
    assert b.flags == B.FLAG_TTL and b.overhead == B.RECORD_TTL_OVERHEAD
    got = [(seq, ts, k.tobytes(), v.tobytes(), ttl) for seq, ts, k, v, ttl in b.entries()]
    assert got == [(first + i, ts, k, v, ttl) for i, (ts, k, v, ttl) in enumerate(recs)]
    assert [r.ttl_ms for r in b.records()] == [ttl for *_, ttl in recs]
    assert [(seq, ts, k.tobytes()) for seq, ts, k, _ in b.raw()] == [(s, t, k) for s, t, k, _, _ in got]


def test_records_without_ttl_keep_the_original_layout() -> None:
    raw = B.encode(7, [(5, b"key", b"body")], ts_ns=9)
    header = B.HEADER.pack(B.MAGIC, 1, 0, 40 + 17 + 7, 0, 1, 7, 7, 9)
    assert raw[:8] == header[:8] and raw[12:40] == header[12:40]  # flags 0; (bytes 8..12: the CRC)
    assert raw[40:] == struct.pack("<IQBI", 0, 5, 3, 4) + b"keybody"
    assert [ttl for *_, ttl in B.Batch.parse(raw).entries()] == [0]


@given(ttl_records, st.lists(st.binary(max_size=2), max_size=2), st.data())
def test_select_part_and_resequence_keep_ttls(recs, prefixes, data) -> None:
    src = B.Batch.parse(B.encode(100, recs, ttl=True))
    picked = B.Batch.parse(src.select(tuple(prefixes)))
    assert picked.flags == B.FLAG_TTL
    pick = tuple(prefixes)
    want = [(seq, ttl) for seq, _, k, _, ttl in src.entries() if not pick or k.tobytes().startswith(pick)]
    assert [(seq, ttl) for seq, _, _, _, ttl in picked.entries()] == want
    lo = data.draw(st.integers(src.first_seq, src.last_seq))
    hi = data.draw(st.integers(lo, src.last_seq))
    part = B.Batch.parse(src.part(lo, hi))
    assert (part.first_seq, part.last_seq, part.ts_ns, part.flags) == (lo, hi, src.ts_ns, B.FLAG_TTL)
    assert list(part.records()) == list(src.records(lo, hi))
    moved = B.Batch.parse(B.resequence(B.Batch.parse(B.encode(0, recs, ttl=True)), 5, 1))
    assert [r.ttl_ms for r in moved.records()] == [ttl for *_, ttl in recs] and moved.flags == B.FLAG_TTL


@settings(max_examples=200)
@given(ttl_records, st.data())
def test_every_damaged_ttl_batch_is_rejected(recs, data) -> None:
    raw = bytearray(B.encode(1, recs, ttl=True))
    with pytest.raises(B.BatchError):
        B.Batch.parse(raw[: data.draw(st.integers(0, len(raw) - 1))])
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(B.BatchError):
        B.Batch.parse(raw)


def test_unknown_flags_and_bad_ttls_are_refused() -> None:
    raw = bytearray(B.encode(1, [(0, b"k", b"v")]))
    raw[3] = 0x08
    with pytest.raises(B.BatchError, match="unsupported batch flags 0x08"):
        B.Batch.parse(raw, check_crc=False)
    with pytest.raises(B.BatchError, match="ttl_ms 4294967296 outside"):
        B.encode(0, [(0, b"k", b"v", 2**32)], ttl=True)
    with pytest.raises(B.BatchError, match="only a dense batch can be cut"):
        B.Batch.parse(B.encode(1, [(0, b"k", b"v")])).part(1, 2)


# --- protocol ------------------------------------------------------------------------------------------------


def test_snapshot_commands_round_trip_with_golden_bytes() -> None:
    assert P.encode(P.Snapshot(("eu.", "us."))) == b"\xaa\xa5\x16\x02\x03eu.\x03us."
    assert P.encode(P.SnapshotEnd(1000, 7)) == b"\xaa\xa5\x17" + (1000).to_bytes(8, "big") + (7).to_bytes(8, "big")
    for cmd in (P.Snapshot(()), P.Snapshot(("a",)), P.SnapshotEnd(2**64 - 1, 0)):
        assert P.decode(P.encode(cmd)) == cmd
    assert P.Snapshot.FEATURE == P.SnapshotEnd.FEATURE == P.FEATURE_SNAPSHOT
    assert (P.Snapshot.SENDER, P.SnapshotEnd.SENDER) == ("client", "server")
    with pytest.raises(P.ProtocolError, match="truncated SNAPSHOT-END: records number-8 needs 8 bytes, 2 left"):
        P.decode(b"\xaa\xa5\x17" + bytes(10))


# --- the index -------------------------------------------------------------------------------------------------


def served(feed: SnapshotFeed) -> tuple[list[B.Batch], dict[bytes, tuple[int, bytes, int]]]:
    """Run a feed to its end: its batches (coverage checked contiguous) and what they hold."""
    batches: list[B.Batch] = []
    while (part := feed.step()) is not None:
        batch = B.Batch.parse(part[0])
        assert batch.count == part[1] and batch.flags == B.FLAG_TTL
        if batches:
            assert batch.first_seq == batches[-1].last_seq + 1, "snapshot coverage must be contiguous"
        batches.append(batch)
    assert feed.done
    got = {r.key.encode(): (r.seq, r.body, r.ttl_ms) for b in batches for r in b.records()}
    seqs = [r.seq for b in batches for r in b.records()]
    assert seqs == sorted(seqs)
    return batches, got


def index_of(root: Path, stream: str = "s", **kw) -> SnapshotIndex:
    index = SnapshotIndex(JournalReader(root, stream), **kw)
    assert index.follow(10.0)
    return index


record = st.tuples(st.sampled_from([b"a.1", b"a.2", b"b.1", b"b.22", b"c"]), st.sampled_from([b"", b"x", b"yy"]))
ttl = st.sampled_from([0, 0, 1, 5_000])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(record, ttl).map(lambda t: (*t[0], t[1])), max_size=60),
    st.sampled_from([(), (b"a.",), (b"b", b"c")]),
)
def test_snapshot_is_the_last_live_record_of_every_key(tmp_path_factory, recs: list[Rec], prefixes) -> None:
    root = tmp_path_factory.mktemp("j")
    with JournalWriter.open(root, "s") as w:
        write(w, recs)
    later = NOW + 2 * 1_000_000  # 2 ms on: records with a 1 ms TTL have expired
    index = index_of(root, clock=lambda: later)
    batches, got = served(SnapshotFeed(index.freeze, prefixes, batch_bytes=60))
    want = {k: v for k, v in last_values(recs, now_ns=later).items() if not prefixes or k.startswith(prefixes)}
    assert got == want
    assert index.last == len(recs)
    if recs:
        assert (batches[0].first_seq, batches[-1].last_seq) == (1, len(recs))
    else:
        assert batches == []


def test_deleted_key_comes_back_when_written_again(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path, "s") as w:
        write(w, [(b"k", b"1", 0), (b"j", b"2", 0), (b"k", b"", 0)])
        index = index_of(tmp_path)
        assert list(index.entries) == [b"j"]
        write(w, [(b"k", b"3", 0)])
        assert index.follow(1.0)
    assert served(SnapshotFeed(index.freeze, ()))[1] == {b"j": (2, b"2", 0), b"k": (4, b"3", 0)}


def test_ttl_expires_on_the_sidecar_clock_and_leaves_the_index(tmp_path: Path) -> None:
    now = [NOW]
    with JournalWriter.open(tmp_path, "s") as w:
        write(w, [(b"eph", b"1", 1000), (b"perm", b"2", 0), (b"eph2", b"3", 3000)])
    index = index_of(tmp_path, clock=lambda: now[0])
    assert set(served(SnapshotFeed(index.freeze, ()))[1]) == {b"eph", b"perm", b"eph2"}
    now[0] = NOW + 1000 * 1_000_000  # exactly ts + ttl: expired
    assert index.purge(now[0]) == 1 and set(index.entries) == {b"perm", b"eph2"}
    # A frozen snapshot judges TTLs at its own time, even when served later.
    frozen = Frozen(1, 3, 0, NOW + 5000 * 1_000_000, list(index.entries.values()))
    assert set(served(SnapshotFeed(lambda: frozen, ()))[1]) == {b"perm"}


def test_index_memory_is_bounded_by_keys_not_journal_length(tmp_path: Path) -> None:
    rnd = random.Random(3)
    w = JournalWriter.open(tmp_path, "s")
    index = SnapshotIndex(JournalReader(tmp_path, "s"))
    sizes = []
    tracemalloc.start()
    try:
        for _ in range(4):
            write(w, [(b"k%d" % rnd.randrange(500), b"x" * 50, rnd.choice([0, 60_000])) for _ in range(20_000)], 1000)
            assert index.follow(30.0)
            sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
        w.close()
    assert len(index) == 500 and index.last == 80_000
    # 60,000 more records, 500 keys: the index does not grow with the journal (TTL bookkeeping included).
    assert sizes[-1] - sizes[0] < 200_000, sizes
    assert len(index._expiries._heap) <= 2 * 500 + 1024


def test_retention_drops_keys_whose_last_record_was_trimmed(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path, "s", segment_bytes=4096, retention=Retention(max_bytes=12_000)) as w:
        write(w, [(b"old", b"o" * 20, 0)] + [(b"hot", b"h" * 20, 0)] * 20, per_batch=1)
        index = index_of(tmp_path)
        assert set(index.entries) == {b"old", b"hot"}
        write(w, [(b"hot", b"h" * 20, 0)] * 600, per_batch=1)  # retention deletes the oldest segments
        first = JournalReader(tmp_path, "s").first_seq
        assert first > 1
        assert index.follow(1.0)  # checks retention first (at most once a HOUSEKEEPING_S), then reads on
    assert set(index.entries) == {b"hot"} and index.first == first
    batches, _ = served(SnapshotFeed(index.freeze, ()))
    assert batches[0].first_seq == first  # coverage starts at the first retained sequence


def test_a_lagging_index_survives_retention_under_it(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path, "s", segment_bytes=4096, retention=Retention(max_bytes=12_000)) as w:
        write(w, [(b"k%d" % i, b"v" * 20, 0) for i in range(50)], per_batch=1)
        index = index_of(tmp_path)
        write(w, [(b"k%d" % (i % 60), b"w" * 20, 0) for i in range(600)], per_batch=1)
        assert index.follow(10.0)
    assert index.first == JournalReader(tmp_path, "s").first_seq and index.last == 650
    recs = [(b"k%d" % i, b"v" * 20, 0) for i in range(50)] + [(b"k%d" % (i % 60), b"w" * 20, 0) for i in range(600)]
    want = {k: v for k, v in last_values(recs).items() if v[0] >= index.first}
    assert served(SnapshotFeed(index.freeze, ()))[1] == want


def test_build_logs_progress_and_readiness(tmp_path: Path, caplog, monkeypatch) -> None:
    monkeypatch.setattr("gateway.sidecar.snapshots.PROGRESS_S", 0.0)
    with JournalWriter.open(tmp_path, "s") as w:
        write(w, [(b"k%d" % (i % 10), b"v", 0) for i in range(2000)], per_batch=100)
    index = SnapshotIndex(JournalReader(tmp_path, "s"))
    assert index.freeze() is None  # not built: a snapshot would be of nothing
    with caplog.at_level(logging.INFO, logger="gateway.sidecar.snapshots"):
        while not index.follow(0.0):
            pass
    text = caplog.text
    assert "snapshot index of s: building, " in text and "(100%)" in text
    assert "snapshot index of s: ready, 10 keys as of sequence 2000" in text


# --- snapshot batches ----------------------------------------------------------------------------------------


def frozen(seqs: list[int], first: int = 1, last: int | None = None, key: bytes = b"k") -> Frozen:
    values = [VALUE.pack(s, NOW, len(key) + 4, 1, 0) + key + b"%04d" % (i % 10_000) + b"v" for i, s in enumerate(seqs)]
    return Frozen(first, seqs[-1] if last is None else last, 77, NOW, values)


def test_batches_are_bounded_and_the_last_reaches_n() -> None:
    seqs = list(range(10, 5000, 3))
    feed = SnapshotFeed(lambda: frozen(seqs, last=6000), (), batch_bytes=1000)
    batches, got = served(feed)
    assert len(got) == feed.records == len(seqs) and batches[0].first_seq == 1 and batches[-1].last_seq == 6000
    assert all(b.nbytes <= 1000 + 40 for b in batches) and {b.ts_ns for b in batches} == {77}


def test_empty_snapshots() -> None:
    assert served(SnapshotFeed(lambda: Frozen(1, 0, 0, NOW, []), ()))[0] == []  # an empty stream: N = 0
    (only,), got = served(SnapshotFeed(lambda: Frozen(5, 90, 0, NOW, []), ()))
    assert (only.first_seq, only.last_seq, only.count, got) == (5, 90, 0, {})


def test_scan_limit_bounds_work_per_step_with_empty_coverage() -> None:
    snap = frozen(list(range(1, 101)), key=b"zz")
    batches, got = served(SnapshotFeed(lambda: snap, (b"a",), scan_limit=30))
    assert got == {} and [(b.first_seq, b.last_seq) for b in batches] == [(1, 30), (31, 60), (61, 90), (91, 100)]


def test_long_sparse_stretches_split_where_a_delta_would_overflow() -> None:
    seqs = [3, MAX_DELTA + 10, 2 * MAX_DELTA + 20]
    batches, got = served(SnapshotFeed(lambda: frozen(seqs), ()))
    assert sorted(v[0] for v in got.values()) == seqs
    assert all(b.last_seq - b.first_seq <= MAX_DELTA for b in batches if b.count)


def test_snapshot_stays_as_of_n_while_the_index_moves_on(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path, "s") as w:
        write(w, [(b"a", b"1", 0), (b"b", b"2", 0)])
        index = index_of(tmp_path)
        feed = SnapshotFeed(index.freeze, (), batch_bytes=1)  # one record a batch
        first = feed.step()
        write(w, [(b"a", b"", 0), (b"b", b"3", 0), (b"c", b"4", 0)])
        assert index.follow(1.0)
        _, got = served(feed)
    assert first is not None and feed.last == 2 and feed.records == 2
    assert got | {r.key.encode(): (r.seq, r.body, 0) for r in B.Batch.parse(first[0]).records()} == {
        b"a": (1, b"1", 0),
        b"b": (2, b"2", 0),
    }


def test_snapshots_asked_together_share_one_frozen_list(tmp_path: Path, monkeypatch) -> None:
    with JournalWriter.open(tmp_path, "s") as w:
        write(w, [(b"a", b"1", 0)])
        index = index_of(tmp_path)
        one = index.freeze()
        write(w, [(b"b", b"2", 0)])
        assert index.follow(1.0)
        assert index.freeze() is one  # within share_s: the same list, as of the same N
        fresh = index.freeze(share_s=0.0)
    assert fresh is not one and (one.last, fresh.last) == (1, 2)


def test_indexes_of_a_root_cover_its_streams_and_new_ones(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path, "one") as w:
        write(w, [(b"k", b"v", 0)])
    indexes = SnapshotIndexes(tmp_path)
    assert set(indexes.indexes) == {"one"}
    with pytest.raises(NotAJournal, match="no stream 'nope'"):
        indexes.source("nope")()
    with JournalWriter.open(tmp_path, "two") as w:
        write(w, [(b"k", b"w", 0)] * 3)
    freeze = indexes.source("two")
    assert freeze() is None  # created at the first request, built by follow()
    assert indexes.follow(1.0)
    assert freeze().last == 3 and indexes.source("one")().last == 1  # type: ignore[union-attr]
    indexes.close()


def test_a_stream_created_after_start_is_indexed_without_a_request(tmp_path: Path) -> None:
    """What a sidecar indexes does not depend on whether it started before or after the stream was created."""
    indexes = SnapshotIndexes(tmp_path)  # not a journal yet: nothing to index
    assert indexes.follow(1.0) and not indexes.indexes
    with JournalWriter.open(tmp_path, "late") as w:
        write(w, [(b"k", b"v", 0)] * 2)
    assert indexes.follow(1.0) and not indexes.indexes  # looked at again only after DISCOVER_S
    indexes._discover_at = 0.0  # DISCOVER_S has passed
    assert indexes.follow(1.0)
    assert indexes.indexes["late"].ready and indexes.source("late")().last == 2  # type: ignore[union-attr]
    indexes.close()


def test_an_unreadable_journal_fails_its_snapshots_for_a_while_then_is_retried(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path, "s") as w:
        write(w, [(b"k%d" % i, b"v" * 50, 0) for i in range(100)], per_batch=10)
    indexes = SnapshotIndexes(tmp_path)
    (segment,) = (tmp_path / "s").glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[len(data) // 2 + 100] ^= 0x40  # inside a record: the CRC check fails
    segment.write_bytes(data)
    assert indexes.follow(1.0)  # the index is dropped, with the journal's error
    with pytest.raises(JournalCorrupt, match="zeps journal"):  # the message names the repair
        indexes.source("s")()
    data[len(data) // 2 + 100] ^= 0x40  # inside a record: the CRC check fails
    segment.write_bytes(data)
    indexes.failed["s"] = (indexes.failed["s"][0], 0.0)  # RETRY_S has passed
    assert indexes.source("s")() is None and indexes.follow(1.0)
    assert indexes.source("s")().last == 100  # type: ignore[union-attr]


# --- the client's view -----------------------------------------------------------------------------------------


def rec(seq: int, key: str, body: bytes, ttl_ms: int = 0, ts_ns: int = NOW) -> B.Record:
    return B.Record(seq, ts_ns, key, body, ttl_ms)


def test_view_applies_values_deletes_and_ttls() -> None:
    now = [NOW]
    view = LastValues(clock=lambda: now[0])
    for r in (rec(1, "a", b"1"), rec(2, "b", b"2", 500), rec(3, "a", b""), rec(4, "c", b"3", 1000)):
        view.apply(r)
    assert dict(view) == {"b": b"2", "c": b"3"} and view.seq == 4
    assert view.record("c").ttl_ms == 1000
    now[0] = NOW + 500 * 1_000_000
    assert dict(view) == {"c": b"3"} and "b" not in view and len(view) == 1
    view.apply(rec(5, "c", b"4"))  # replaced by a record without TTL: it stays
    now[0] = NOW + 10 * SECOND
    assert dict(view) == {"c": b"4"}
    with pytest.raises(KeyError):
        view.record("b")


def test_view_expiry_bookkeeping_stays_bounded() -> None:
    view = LastValues(clock=lambda: NOW)
    for seq in range(1, 20_001):
        view.apply(rec(seq, f"k{seq % 10}", b"v", ttl_ms=60_000))
    assert len(view) == 10 and len(view._expiries._heap) <= 2 * 10 + 1024
