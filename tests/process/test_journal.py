"""Journal: sequencing, reading by sequence and time, rolling, recovery, retention, durability, locking, tools."""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from ctypes import c_longlong
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from gateway.errors import JournalCorrupt, JournalError, JournalLocked, JournalTrimmed, NotAJournal
from gateway.journal import (
    Cursor,
    Durability,
    JournalReader,
    JournalWriter,
    Retention,
    inspect_root,
    truncate_at,
    verify_root,
)
from gateway.journal.committed import CommittedMark, remove_mark
from gateway.journal.layout import INDEX_ENTRY, idx_path, list_segments, seg_path
from gateway.journal.syncer import Syncer
from gateway.journal.tools import cut_after
from gateway.wire.batch import HEADER_SIZE, Batch, encode, resequence

ZEPS = Path(sys.executable).with_name("zeps")
FORK = multiprocessing.get_context("fork")
S = "trades"


def pub(n: int, tag: int = 0, body: int = 40) -> Batch:
    """A dense publisher batch of n records of `body` bytes saying "tag:i;", so a reader can check each one."""
    records = [(tag * 1000 + i, b"k.%d" % i, (b"%d:%d;" % (tag, i)).ljust(body, b".")) for i in range(n)]
    return Batch.parse(encode(0, records))


def fill(w: JournalWriter, batches: int, per: int = 3, body: int = 40) -> list[bytes]:
    return [w.append(pub(per, tag, body)) for tag in range(batches)]


def read_all(cursor: Cursor, limit: int = 100_000) -> list[Batch]:
    out = []
    for _ in range(limit):
        if (b := cursor.next_batch()) is None:
            return out
        out.append(b)
    raise AssertionError("cursor did not reach the end")


def clock_from(times: list[int]) -> Callable[[], int]:
    """An injectable clock reading times[0]; tests move it by assigning."""
    return lambda: times[0]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "journal"


def test_append_sequences_and_reads_back_the_same_bytes(root: Path) -> None:
    with JournalWriter.open(root, S) as w:
        assert (w.next_seq, w.last_seq) == (1, 0)
        sealed = fill(w, 20, per=3)
        assert (w.next_seq, w.last_seq) == (61, 60)
    batches = [Batch.parse(b) for b in sealed]
    assert [(b.first_seq, b.last_seq) for b in batches] == [(1 + 3 * i, 3 + 3 * i) for i in range(20)]
    assert all(a.ts_ns <= b.ts_ns for a, b in itertools.pairwise(batches))
    reader = JournalReader(root, S)
    assert (reader.first_seq, reader.last_seq) == (1, 60)
    with reader.cursor(1) as cursor:
        assert [bytes(b) for b in read_all(cursor)] == sealed  # journaled exactly as returned, never re-encoded
    records = [r for b in batches for r in b.records()]
    assert [r.seq for r in records] == list(range(1, 61))
    assert records[4].body.startswith(b"1:1;")


def test_read_from_the_middle(root: Path) -> None:
    with JournalWriter.open(root, S, segment_bytes=4000, index_interval=500) as w:
        fill(w, 100, per=5)
    with JournalReader(root, S).cursor(233) as cursor:
        got = read_all(cursor)
    assert got[0].first_seq <= 233 <= got[0].last_seq  # the first batch may start before: callers trim
    assert [r.seq for b in got for r in b.records(lo=233)] == list(range(233, 501))


def test_seq_for_time_and_journal_time_never_decreases(root: Path) -> None:
    times = [1_000]
    with JournalWriter.open(root, S, segment_bytes=2000, index_interval=300, clock=clock_from(times)) as w:
        for i in range(60):
            times[0] = 1_000 + 10 * i if i != 30 else 5  # a clock step backwards must not reach the journal
            w.append(pub(2, i))
        assert w.last_ts_ns == 1_590
    reader = JournalReader(root, S)
    stamps = [b.ts_ns for b in read_all(reader.cursor(1))]
    assert stamps == sorted(stamps) and stamps[30] == stamps[29] == 1_290
    assert reader.seq_for_time(0) == 1
    assert reader.seq_for_time(1_000) == 1
    assert reader.seq_for_time(1_001) == 3  # batch 1 (seq 3..4) at 1_010 is the first at or after
    assert reader.seq_for_time(1_290) == 59  # two batches share 1_290: the first of them
    assert reader.seq_for_time(1_295) == 63
    assert reader.seq_for_time(1_590) == 119
    assert reader.seq_for_time(1_591) == 121  # nothing yet: the next sequence
    assert len(list_segments(root / S)) > 3  # the answers crossed segments


def test_sequences_continue_after_reopen_and_after_segments_vanish(root: Path) -> None:
    with JournalWriter.open(root, S) as w:
        fill(w, 5, per=4)
    with JournalWriter.open(root, S) as w:
        assert w.next_seq == 21
        assert Batch.parse(w.append(pub(1))).first_seq == 21
        last_ts = w.last_ts_ns
    with JournalWriter.open(root, S, clock=lambda: 1) as w:  # an older clock: journal time stays monotone
        assert Batch.parse(w.append(pub(1))).ts_ns == last_ts
    for path in [*(root / S).glob("*.seg"), *(root / S).glob("*.idx")]:
        path.unlink()  # every segment removed by hand: the head file still knows what was issued
    with JournalWriter.open(root, S) as w:
        assert w.next_seq == 23
    assert JournalReader(root, S).first_seq == 23


def test_segments_roll_and_reads_cross_them(root: Path) -> None:
    with JournalWriter.open(root, S, segment_bytes=3000, index_interval=1000) as w:
        sealed = fill(w, 60, per=4, body=80)
    segments = list_segments(root / S)
    assert len(segments) > 5
    for seq in segments:
        path = seg_path(root / S, seq)
        assert path.stat().st_size <= 3000
        first = Batch.parse(path.read_bytes()[: len(sealed[0])])  # a segment starts with a whole batch ...
        assert first.first_seq == seq  # ... whose first sequence names the file
    assert [bytes(b) for b in read_all(JournalReader(root, S).cursor(1))] == sealed
    assert verify_root(root).clean


def test_index_makes_reads_seek(root: Path) -> None:
    never = Durability("never")
    with JournalWriter.open(root, S, segment_bytes=8 << 20, index_interval=64 << 10, durability=never) as w:
        for tag in range(2_500):
            w.append(pub(10, tag, body=1600))  # 16 KiB batches, 40 MB
        last = w.last_seq
    assert len(list_segments(root / S)) == 5
    reader = JournalReader(root, S)
    with reader.cursor(last - 5) as cursor:
        got = read_all(cursor)
    assert [b.last_seq for b in got] == [last]
    assert cursor.bytes_read < 128 << 10  # from the index entry before it to the end, not 40 MB
    assert cursor.batches_skipped <= 4  # a short forward scan (64 KiB / 16 KiB)
    assert reader.seq_for_time(got[0].ts_ns) <= got[0].first_seq


def _follow_writer(root: Path, ready: Event, go: Event, batches: int) -> None:
    with JournalWriter.open(root, S, segment_bytes=20_000, index_interval=2000) as w:
        ready.set()
        if not go.wait(10):
            return
        for tag in range(batches):
            w.append(pub(1 + tag % 5, tag))
            if tag % 50 == 0:
                time.sleep(0.002)  # pacing, so the reader also catches up with the tail mid-stream


def test_tail_follow_from_another_process(root: Path) -> None:
    batches = 600
    ready, go = FORK.Event(), FORK.Event()
    proc = FORK.Process(target=_follow_writer, args=(root, ready, go, batches))
    proc.start()
    try:
        assert ready.wait(10), "writer process did not open the journal"
        cursor = JournalReader(root, S).cursor(1)
        assert cursor.next_batch() is None  # nothing yet: tail-follow answers "later", not an error
        go.set()
        expected = [(tag, i) for tag in range(batches) for i in range(1 + tag % 5)]
        got: list[tuple[int, int]] = []
        waits, deadline = 0, time.monotonic() + 20
        while len(got) < len(expected) and time.monotonic() < deadline:
            batch = cursor.next_batch()
            if batch is None:
                waits += 1
                time.sleep(0.001)
                continue
            for record in batch.records():
                assert record.seq == len(got) + 1
                tag, i = record.body.split(b";")[0].split(b":")
                got.append((int(tag), int(i)))
        assert got == expected
        assert waits > 0  # it really did follow a moving tail
        proc.join(10)
        assert proc.exitcode == 0
        assert cursor.next_batch() is None
        assert len(list_segments(root / S)) > 3  # and crossed segment rolls while following
    finally:
        proc.kill()
        proc.join(5)


def _append_forever(root: Path, acked: c_longlong) -> None:
    w = JournalWriter.open(root, S, segment_bytes=1 << 20, durability=Durability("never"))
    deadline = time.monotonic() + 30
    tag = 0
    while time.monotonic() < deadline:
        w.append(pub(1 + tag % 50, tag, body=200 + 50 * (tag % 7)))
        acked.value = w.last_seq
        tag += 1


def test_kill_9_while_appending_then_recover(root: Path) -> None:
    acked = FORK.Value("q", 0, lock=False)  # a lock would stay held by the killed process
    proc = FORK.Process(target=_append_forever, args=(root, acked))
    proc.start()
    try:
        deadline = time.monotonic() + 20
        while acked.value < 20_000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert acked.value >= 20_000, "writer process made no progress"
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
    finally:
        proc.kill()
        proc.join(5)
    with JournalWriter.open(root, S, segment_bytes=1 << 20) as w:  # the kernel dropped the dead writer's lock
        survived = w.last_seq
        assert survived >= acked.value  # what append() returned was in the page cache: a crash keeps it
        assert Batch.parse(w.append(pub(3))).first_seq == survived + 1
    assert verify_root(root).clean
    got = read_all(JournalReader(root, S).cursor(1), limit=1_000_000)
    assert [b.first_seq for b in got[1:]] == [b.last_seq + 1 for b in got[:-1]]
    assert got[-1].last_seq == survived + 3


@pytest.mark.parametrize("tail", ["half a batch", "zeros"])
def test_torn_tail_is_truncated_and_reported(root: Path, tail: str, caplog: pytest.LogCaptureFixture) -> None:
    with JournalWriter.open(root, S) as w:
        fill(w, 10, per=2)
        next_bytes = resequence(pub(2), w.next_seq, w.last_ts_ns)
    path = seg_path(root / S, 1)
    good = path.stat().st_size
    junk = next_bytes[: len(next_bytes) // 2] if tail == "half a batch" else bytes(4096)
    with open(path, "ab") as f:
        f.write(junk)
    if tail == "half a batch":
        with JournalReader(root, S).cursor(19) as cursor:  # a batch being written: readers wait, not fail
            assert [b.first_seq for b in read_all(cursor)] == [19]
    with caplog.at_level(logging.WARNING, logger="gateway.journal"), JournalWriter.open(root, S) as w:
        report = w.recovery
        assert report is not None
        assert (report.segment, report.offset, report.bytes_dropped) == (path, good, len(junk))
        assert report.last_good_seq == 20
        assert path.stat().st_size == good
        assert Batch.parse(w.append(pub(1))).first_seq == 21
    assert "torn tail" in caplog.text
    assert verify_root(root).clean


def test_flipped_byte_in_the_middle_is_never_skipped(root: Path) -> None:
    with JournalWriter.open(root, S) as w:
        sealed = fill(w, 20, per=3)
    path = seg_path(root / S, 1)
    bad = sum(len(b) for b in sealed[:7])  # batch 8 starts here
    data = bytearray(path.read_bytes())
    data[bad + HEADER_SIZE + 20] ^= 0x40
    path.write_bytes(bytes(data))

    with pytest.raises(JournalCorrupt) as info:
        JournalWriter.open(root, S)
    assert (info.value.path, info.value.offset) == (path, bad)
    assert "CRC32C" in str(info.value) and f"zeps journal repair {root} --stream {S}" in str(info.value)
    assert path.stat().st_size == len(data)  # nothing was changed

    report = verify_root(root)
    assert not report.clean
    assert [(p.path, p.offset) for p in report.problems] == [(path, bad)]
    assert f"{path} @ byte {bad}" in report.describe()
    cli = subprocess.run([ZEPS, "journal", "verify", str(root)], capture_output=True, text=True, timeout=30)
    assert cli.returncode == 1
    assert f"{path} @ byte {bad}" in cli.stdout

    with JournalReader(root, S).cursor(1) as cursor, pytest.raises(JournalCorrupt) as info:
        read_all(cursor)
    assert info.value.offset == bad

    repair = truncate_at(root, S, path.name, bad)  # the explicit way out
    assert (repair.last_good_seq, repair.bytes_dropped) == (21, len(data) - bad)
    with JournalWriter.open(root, S) as w:
        assert w.next_seq == 61  # the discarded sequences are never reused
        w.append(pub(1))
    reader = JournalReader(root, S)
    with reader.cursor(1) as cursor:
        before: list[Batch | None] = []
        with pytest.raises(JournalTrimmed) as gap:
            while len(before) < 100 and (before[-1:] != [None]):
                before.append(cursor.next_batch())
        assert before[-1] is not None and before[-1].last_seq == 21
        assert (gap.value.seq, gap.value.first_retained) == (22, 61)
        assert [b.first_seq for b in read_all(cursor)] == [61]
    with reader.cursor(30) as cursor, pytest.raises(JournalTrimmed) as gap:  # asked for a sequence in the gap
        cursor.next_batch()
    assert (gap.value.seq, gap.value.first_retained) == (30, 61)
    assert [p.message.startswith("sequences 22..60 are missing") for p in verify_root(root).problems] == [True]


def test_retention_by_size_deletes_whole_old_segments(root: Path) -> None:
    limit = 20_000
    with JournalWriter.open(root, S, segment_bytes=5000, retention=Retention(max_bytes=limit)) as w:
        sealed = fill(w, 200, per=3)
    segments = list_segments(root / S)
    assert segments[0] > 1
    assert sum(seg_path(root / S, s).stat().st_size for s in segments) <= limit + 5000  # + the active one
    assert {int(p.stem) for p in (root / S).glob("*.idx")} == set(segments)  # indexes went with them
    reader = JournalReader(root, S)
    assert reader.first_seq == segments[0]
    with pytest.raises(JournalTrimmed) as info:
        reader.cursor(1)
    assert (info.value.seq, info.value.first_retained) == (1, segments[0])
    with reader.cursor(reader.first_seq) as cursor:
        kept = [bytes(b) for b in read_all(cursor)]
    assert kept == sealed[-len(kept) :] and Batch.parse(kept[0]).first_seq == segments[0]  # whole segments
    assert verify_root(root).clean


def test_retention_by_age_never_deletes_the_active_segment(root: Path) -> None:
    now = [10**18]
    hour = 3600 * 10**9
    retention = Retention(max_age_s=3600)
    with JournalWriter.open(root, S, segment_bytes=2000, retention=retention, clock=clock_from(now)) as w:
        fill(w, 20, per=3)
        old = list_segments(root / S)
        now[0] += hour // 2
        fill(w, 20, per=3)
        both = list_segments(root / S)
        now[0] += hour // 2 + 10**9  # the first half is now older than an hour; the second is not
        w.maybe_sync()
        kept = list_segments(root / S)
        assert kept == [s for s in both if s not in old[:-1]]  # the one rolled into at the boundary stays
        now[0] += 10 * hour
        w.maybe_sync()
        assert list_segments(root / S) == [both[-1]]  # everything is old: the active segment stays anyway
    assert verify_root(root).clean


def test_reader_in_a_deleted_segment_gets_trimmed(root: Path) -> None:
    now = [10**18]
    retention = Retention(max_age_s=60)
    with JournalWriter.open(root, S, segment_bytes=3 << 20, retention=retention, clock=clock_from(now)) as w:
        for tag in range(2000):
            w.append(pub(10, tag, body=400))  # ~4.3 KiB batches: several segments larger than one read
        reader = JournalReader(root, S)
        cursor = reader.cursor(1)
        first = cursor.next_batch()
        assert first is not None and first.first_seq == 1
        segments = list_segments(root / S)
        assert len(segments) >= 3
        now[0] += 3600 * 10**9
        w.maybe_sync()
        assert list_segments(root / S) == segments[-1:]
        with pytest.raises(JournalTrimmed) as info:
            read_all(cursor)  # bytes of its segment were still unread when it was deleted
        assert info.value.first_retained == segments[-1] == reader.first_seq
        assert cursor.next_batch().first_seq == segments[-1]  # it stands at the first retained batch
        cursor.close()


def test_durability_modes_count_fsyncs(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])

    with JournalWriter.open(root, "always", durability=Durability("always")) as w:
        syncs.clear()
        fill(w, 5)
        assert len(syncs) == 5 and w.synced_seq == w.last_seq
        assert w.last_sync_latency_s > 0

    with JournalWriter.open(root, "never", durability=Durability("never")) as w:
        syncs.clear()
        fill(w, 50)
        assert syncs == [] and w.synced_seq == 0 and w.sync_deadline is None
    assert len(syncs) == 1  # close() syncs

    batch_bytes = len(resequence(pub(3), 1, 0))
    group = Durability("group", group_ms=60_000, group_bytes=3 * batch_bytes)
    with JournalWriter.open(root, "bytes", durability=group) as w:
        syncs.clear()
        fill(w, 2)
        assert syncs == [] and w.synced_seq == 0
        fill(w, 1)  # the third batch reaches group_bytes
        assert len(syncs) == 1 and w.synced_seq == 9

    with JournalWriter.open(root, "time", durability=Durability("group", group_ms=200)) as w:
        syncs.clear()
        fill(w, 2)
        assert syncs == [] and not w.maybe_sync()
        deadline = w.sync_deadline
        assert deadline is not None and w.sync_due(deadline) and not w.sync_due(deadline - 0.01)
        while not w.sync_due(time.monotonic()):  # bounded: the deadline is 0.2 s away
            time.sleep(0.005)
        fill(w, 1)  # a due sync is not made inside append: the caller sends the batch first
        assert syncs == [] and w.synced_seq == 0
        assert w.maybe_sync()  # the gateway's timer
        assert len(syncs) == 1 and w.synced_seq == 9 and w.sync_deadline is None


def test_a_group_commit_with_a_syncer_runs_off_the_callers_thread(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow disk (an fdatasync held here until released) holds back `synced_seq` only: appends and the timer
    hook return at once, a second group waits for the first, and the syncer's pipe says when one finished."""
    held, entered, threads = threading.Event(), threading.Event(), list[str]()
    real = os.fdatasync

    def slow(fd: int) -> None:
        threads.append(threading.current_thread().name)
        entered.set()
        assert held.wait(10.0), "the test never released the sync"
        real(fd)

    def finished(w: JournalWriter, syncer: Syncer) -> bool:
        assert select.select([syncer], [], [], 10.0)[0], "the syncer's pipe never became readable"
        syncer.drain()
        return w.maybe_sync()

    syncer = Syncer()
    group = Durability("group", group_ms=0)
    try:
        with JournalWriter.open(root, S, durability=group, syncer=syncer) as w:
            monkeypatch.setattr(os, "fdatasync", slow)
            fill(w, 2)  # 6 records
            assert not w.maybe_sync()  # started on the syncer's thread; this thread did not wait for it
            assert entered.wait(10.0) and threading.current_thread().name not in threads
            assert w.synced_seq == 0 and w.sync_deadline is None  # none due while one runs: the pipe wakes us
            fill(w, 1)  # records 7-9: the next group
            assert not w.maybe_sync() and w.synced_seq == 0 and len(threads) == 1
            held.set()
            assert finished(w, syncer)
            assert w.synced_seq == 6  # what was appended before the sync began, not after
            assert w.last_sync_latency_s > 0
            w.maybe_sync()  # the next group starts
            assert finished(w, syncer) and w.synced_seq == 9 and len(threads) == 2
            fill(w, 1)
            w.maybe_sync()
        assert len(threads) == 3  # close() waited for the last one rather than closing its descriptor under it
        assert w.synced_seq == 12
    finally:
        syncer.close()


def test_second_writer_is_refused(root: Path) -> None:
    first = JournalWriter.open(root, S)
    with pytest.raises(JournalLocked) as info:
        JournalWriter.open(root, S)
    assert info.value.pid == os.getpid() and f"pid {os.getpid()}" in str(info.value)
    with JournalWriter.open(root, "other"):
        pass  # other streams are independent
    first.close()
    with JournalWriter.open(root, S) as w:
        assert w.next_seq == 1


def test_indexes_that_disagree_are_rebuilt(root: Path) -> None:
    with JournalWriter.open(root, S, segment_bytes=3000, index_interval=500) as w:
        fill(w, 40)
    segments = list_segments(root / S)
    idx_path(root / S, segments[0]).unlink()
    active = idx_path(root / S, segments[-1])
    active.write_bytes(active.read_bytes() + INDEX_ENTRY.pack(999, 0, 12))  # an entry naming nothing
    report = verify_root(root)
    assert {p.path for p in report.problems} == {idx_path(root / S, segments[0]), active}
    with JournalWriter.open(root, S, segment_bytes=3000, index_interval=500) as w:
        assert w.next_seq == 121
    assert verify_root(root).clean


def test_inspect_and_cli(root: Path) -> None:
    with JournalWriter.open(root, S, segment_bytes=2000, clock=lambda: 1_700_000_000_123_456_789) as w:
        fill(w, 30)
    JournalWriter.open(root, "empty").close()
    infos = {i.stream: i for i in inspect_root(root)}
    trades = infos[S]
    assert (trades.first_seq, trades.last_seq, trades.segments) == (1, 90, len(list_segments(root / S)))
    assert trades.first_time == trades.last_time == "2023-11-14T22:13:20.123456789Z"
    assert (infos["empty"].first_seq, infos["empty"].last_seq) == (1, 0)
    out = subprocess.run([ZEPS, "journal", "inspect", str(root)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "sequences  1 .. 90  (90)" in out.stdout and "none retained" in out.stdout
    out = subprocess.run([ZEPS, "journal", "verify", str(root)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "clean" in out.stdout


def test_paths_that_are_not_journals(root: Path, tmp_path: Path) -> None:
    with pytest.raises(NotAJournal, match="not a directory"):
        inspect_root(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(NotAJournal, match="holds no journal streams"):
        verify_root(tmp_path / "plain")
    JournalWriter.open(root, S).close()
    with pytest.raises(NotAJournal, match="pass its parent"):
        inspect_root(root / S)
    with pytest.raises(NotAJournal, match="no stream 'nope'"):
        JournalReader(root, "nope")
    with pytest.raises(ValueError, match="not allowed"):
        JournalWriter.open(root, "../escape")


def test_reader_waiting_at_a_torn_tail_reads_what_recovery_writes_there(root: Path) -> None:
    with JournalWriter.open(root, S) as w:
        fill(w, 3, per=2)
        torn = resequence(pub(40, body=200), w.next_seq, w.last_ts_ns)  # a large batch, half written
    with open(seg_path(root / S, 1), "ab") as f:
        f.write(torn[: len(torn) // 2])
    with JournalReader(root, S).cursor(1) as cursor:
        assert [b.first_seq for b in read_all(cursor)] == [1, 3, 5]
        assert cursor.next_batch() is None  # waits at the torn batch
        with JournalWriter.open(root, S) as w:  # recovery cuts it; a smaller batch takes its place
            sealed = w.append(pub(1))
        assert [bytes(b) for b in read_all(cursor)] == [sealed]


def _tags(batches: list[Batch]) -> list[tuple[int, int, bytes]]:
    """(first, last, first body's tag) of each batch: which content a reader got at which sequences."""
    return [
        (b.first_seq, b.last_seq, bytes(next(iter(b.raw(b.first_seq, b.first_seq)))[3]).split(b":")[0]) for b in batches
    ]


def test_a_committed_reader_serves_only_up_to_the_mark(root: Path) -> None:
    with JournalWriter.open(root, S) as w:
        fill(w, 5)  # 1..15, batches of 3
        plain = JournalReader(root, S, committed=True)  # no mark (a single gateway): to the end, as always
        assert len(read_all(plain.cursor(1))) == 5 and plain.last_seq == 15
        mark = CommittedMark(root / S)
        mark.advance(6)
        reader = JournalReader(root, S, committed=True)
        assert reader.last_seq == 6 and JournalReader(root, S).last_seq == 15
        cursor = reader.cursor(1)
        assert [b.last_seq for b in read_all(cursor)] == [3, 6]
        assert cursor.next_batch() is None  # stays before 7..9
        mark.advance(8)  # inside a batch: the batch waits for all of it
        assert cursor.next_batch() is None
        mark.advance(12)
        assert [b.last_seq for b in read_all(cursor)] == [9, 12]
        assert [b.last_seq for b in read_all(reader.cursor(10))] == [12]  # a new cursor, from the middle
        remove_mark(root / S)  # the stream is a single gateway's again: served to its end
        assert [b.last_seq for b in read_all(cursor)] == [15]
        cursor.close()
        mark.close()


@pytest.mark.parametrize("segment_bytes", [64 << 20, 1], ids=["one-segment", "segment-per-batch"])
def test_a_committed_reader_across_a_cut_gets_the_records_that_replaced_the_cut_ones(
    root: Path, segment_bytes: int
) -> None:
    """A node that rejoins its group cuts what it journaled alone and journals its leader's records there: a
    sidecar's cursor kept open across it (it read ahead past its bound, or stands in a segment now deleted)
    returns the new records, and never the cut ones."""
    with JournalWriter.open(root, S, segment_bytes=segment_bytes) as w:
        fill(w, 2)  # 1..6, tags 0, 1
        w.append(pub(3, 7))  # 7..9: journaled alone, never committed
        w.append(pub(3, 8))  # 10..12: the same
    mark = CommittedMark(root / S)
    mark.advance(6)
    cursor = JournalReader(root, S, committed=True).cursor(1)
    assert _tags(read_all(cursor)) == [(1, 3, b"0"), (4, 6, b"1")]
    assert cut_after(root, S, 6) > 0
    with JournalWriter.open(root, S, segment_bytes=segment_bytes) as w:
        w.append(pub(2, 5))  # 7..8: the leader's records at those sequences
        w.append(pub(4, 6))  # 9..12
    mark.advance(8)
    assert _tags(read_all(cursor)) == [(7, 8, b"5")]
    mark.advance(12)
    assert _tags(read_all(cursor)) == [(9, 12, b"6")]
    cursor.close()
    mark.close()


def test_a_reader_that_returned_records_since_cut_says_so(root: Path) -> None:
    with JournalWriter.open(root, S) as w:
        fill(w, 3)
    cursor = JournalReader(root, S).cursor(1)
    assert len(read_all(cursor)) == 3
    cut_after(root, S, 3)
    with JournalWriter.open(root, S) as w:
        w.append(pub(9, 4))  # 4..12: longer than what was cut
    with pytest.raises(JournalError, match="was cut to"):
        cursor.next_batch()
    cursor.close()
