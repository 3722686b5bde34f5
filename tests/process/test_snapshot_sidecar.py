"""Snapshots from a real `zeps replay` process on 127.0.0.1: negotiation, credit, consistency with a full
replay while the journal grows, the index built at start, and the `zeps snapshot` command."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.records import NOW, Rec, last_values, write
from support.servers import STREAM, GatewayProcess, Raw, journal_records, start_sidecar

from gateway.client.publisher import Publisher
from gateway.client.replay_client import DEFAULT_FEATURES, ReplayClient, history
from gateway.client.snapshot_view import LastValues
from gateway.client.subscriber import Subscriber
from gateway.errors import NotGranted, PublishError
from gateway.journal import JournalReader, JournalWriter
from gateway.wire import batch as B
from gateway.wire import protocol as P

pytestmark = pytest.mark.timeout(120)

WANT = (P.FEATURE_BATCH, P.FEATURE_SNAPSHOT)


def load(n: int, keys: int, *, body: int = 20, first: int = 0) -> list[Rec]:
    """Records first..first+n-1: keys in turn, every 9th a delete."""
    return [
        (b"k%06d" % (i % keys), b"" if i % 9 == 4 else b"%d:" % i + b"x" * body, 0) for i in range(first, first + n)
    ]


def snapshot_over(client: Raw) -> tuple[dict[bytes, tuple[int, bytes, int]], P.SnapshotEnd]:
    """Pump a raw client through SNAPSHOT-END: what the snapshot held, and its end."""
    client.pump(lambda c: any(isinstance(e, P.SnapshotEnd) for e in c.events), timeout=60)
    (end,) = [e for e in client.events if isinstance(e, P.SnapshotEnd)]
    got = {r.key.encode(): (r.seq, r.body, r.ttl_ms) for b in client.batches for r in b.records()}
    assert len(got) == end.records == sum(b.count for b in client.batches)
    return got, end


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "journal"
    path.mkdir()
    return path


@pytest.fixture
def raw() -> Iterator[list[Raw]]:
    made: list[Raw] = []
    yield made
    for c in made:
        c.close()


def client(made: list[Raw], endpoint: str) -> Raw:
    made.append(Raw(endpoint))
    return made[-1]


def test_snapshot_is_granted_with_batches_only(root: Path, raw: list[Raw]) -> None:
    with JournalWriter.open(root, "s") as w:
        write(w, load(10, 3))
    with start_sidecar(root) as side:
        assert client(raw, side.endpoint).attach("s", WANT) == set(WANT)
        plain = client(raw, side.endpoint)
        assert plain.attach("s", (P.FEATURE_SNAPSHOT,)) == set()  # snapshots come as DELIVER-BATCH
        plain.send(P.Snapshot(()))
        reason = plain.expect(P.Invalid).reason  # type: ignore[attr-defined]
        assert "SNAPSHOT needs the 'snapshot' extension" in reason


def test_snapshot_then_subscribe_equals_a_full_replay_while_the_journal_grows(root: Path) -> None:
    first = load(30_000, 1000)
    more = load(20_000, 1500, first=30_000)
    w = JournalWriter.open(root, "s")
    write(w, first, per_batch=100)
    with start_sidecar(root) as side:
        stop = threading.Event()

        def append() -> None:  # keeps writing while the snapshot is served, bounded by `more`
            for i in range(0, len(more), 500):
                if stop.is_set():
                    return
                write(w, more[i : i + 500], per_batch=100)
                time.sleep(0.005)

        writer = threading.Thread(target=append)
        with ReplayClient(side.endpoint, "s", features=(*DEFAULT_FEATURES, P.FEATURE_SNAPSHOT), window=64 << 10) as c:
            writer.start()
            c.snapshot()
            values: dict[str, tuple[int, bytes]] = {}
            batches = []
            while not isinstance(event := c.recv(), P.SnapshotEnd):
                assert isinstance(event, B.Batch), event
                batches.append(event)
                values.update((r.key, (r.seq, r.body)) for r in event.records())
            n = event.last
            assert batches[0].first_seq == 1 and batches[-1].last_seq == n >= 30_000
            writer.join(timeout=60)
            c.subscribe(latest=n)
            head = w.last_seq
            while True:  # every record after N, one by one, applied in order
                event = c.recv()
                assert isinstance(event, B.Batch), event
                for r in event.records():
                    if r.body:
                        values[r.key] = (r.seq, r.body)
                    else:
                        values.pop(r.key, None)
                if event.last_seq >= head:
                    break
        stop.set()
        full = last_values(first + more)
        assert values == {k.decode(): (seq, body) for k, (seq, body, _) in full.items()}
        everything = list(history(side.endpoint, "s"))
        assert len(everything) == 50_000 and everything[-1].seq == head
    w.close()


def test_snapshot_waits_for_credit_and_does_not_buffer_it(root: Path, raw: list[Raw]) -> None:
    keys = 200_000
    with JournalWriter.open(root, "s") as w:
        write(w, [(b"k%06d" % i, b"v" * 200, 0) for i in range(keys)], per_batch=500)
    with start_sidecar(root) as side:
        probe = client(raw, side.endpoint)
        probe.attach("s", WANT)
        probe.send(P.Snapshot(("k00000",)), P.Credit(1 << 30))  # the index is built once this ends
        assert snapshot_over(probe)[1].records == 10
        before = side.rss_kib()
        slow = client(raw, side.endpoint)
        slow.attach("s", WANT)
        slow.send(P.Snapshot(()), P.Credit(1))  # one byte: exactly one batch
        slow.take(slow.expect(P.DeliverBatch))
        assert slow.quiet(0.5), "the server sent past the credit"
        grown = side.rss_kib() - before
        # The whole snapshot is ~45 MB; a paused one costs the frozen list (8 bytes a key) and one batch.
        assert grown < 8 * 1024, f"sidecar grew {grown} KiB for a paused snapshot"
        slow.window = 256 << 10  # now read it all, topping credit up as it goes
        slow.send(P.Credit(slow.window))
        got, end = snapshot_over(slow)
    assert end.last == keys and len(got) == keys
    assert all(b.nbytes > 64_000 for b in slow.batches[:-1])  # about 64 KiB a batch


def test_first_snapshot_after_start_waits_for_the_index(root: Path, raw: list[Raw]) -> None:
    recs = load(300_000, 50_000)
    with JournalWriter.open(root, "s") as w:
        write(w, recs, per_batch=1000)
    with start_sidecar(root) as side:  # the build starts now; the request below comes during it
        c = client(raw, side.endpoint)
        c.attach("s", WANT)
        c.window = 1 << 20
        c.send(P.Snapshot(()), P.Credit(c.window))
        got, end = snapshot_over(c)
    assert end.last == 300_000
    assert got == last_values(recs)


def test_streams_created_after_start_have_snapshots_too(root: Path, raw: list[Raw]) -> None:
    (root / "placeholder").mkdir()
    with start_sidecar(root) as side, JournalWriter.open(root, "late") as w:
        write(w, [(b"a", b"1", 0), (b"b", b"2", 5000), (b"a", b"3", 0)])
        c = client(raw, side.endpoint)
        c.attach("late", WANT)
        c.send(P.Snapshot(("a",)), P.Credit(1 << 20))
        got, end = snapshot_over(c)
    assert (got, end.last) == ({b"a": (3, b"3", 0)}, 3)


def zeps(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_zeps_snapshot_prints_the_last_values_as_json_lines(root: Path) -> None:
    recs: list[Rec] = [(b"eu.fr", b"1", 0), (b"us.ny", b"2", 0), (b"eu.de", b"3", 60_000), (b"eu.fr", b"4", 0)]
    with JournalWriter.open(root, "s") as w:
        for k, body, ttl in recs:
            w.append(B.Batch.parse(B.encode(0, [(NOW, k, body, ttl)], ttl=True)))
        w.append(B.Batch.parse(B.encode(0, [(NOW, b"us.ny", b"")])))
    with start_sidecar(root) as side:
        out = zeps("snapshot", "--replay", side.endpoint, "--stream", "s", "--topic", "eu.")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(x["seq"], x["key"], base64.b64decode(x["body_b64"]), x.get("ttl_ms")) for x in lines] == [
        (3, "eu.de", b"3", 60_000),
        (4, "eu.fr", b"4", None),
    ]
    assert "zeps snapshot: as of sequence 5; follow on with --from 6" in out.stderr


def test_no_snapshots_refuses_them_and_says_why(root: Path) -> None:
    with JournalWriter.open(root, "s") as w:
        write(w, load(10, 3))
    with start_sidecar(root, "--no-snapshots") as side:
        with ReplayClient(side.endpoint, "s", features=WANT) as c:
            c.wait_ready()
            assert c.features == {P.FEATURE_BATCH}
            with pytest.raises(NotGranted, match="did not grant the 'snapshot' extension"):
                c.snapshot()
        out = zeps("snapshot", "--replay", side.endpoint, "--stream", "s")
    assert out.returncode == 1 and out.stdout == ""
    assert "did not grant the 'snapshot' extension" in out.stderr and "restart it without" in out.stderr


def test_a_second_snapshot_replaces_the_first(root: Path, raw: list[Raw]) -> None:
    with JournalWriter.open(root, "s") as w:
        write(w, [(b"a.%d" % i, b"v", 0) for i in range(3000)] + [(b"b.1", b"w", 0)], per_batch=100)
    with start_sidecar(root) as side:
        c = client(raw, side.endpoint)
        c.attach("s", WANT)
        c.send(P.Snapshot(("a.",)), P.Credit(1))  # one batch of the first, then no credit
        c.take(c.expect(P.DeliverBatch))
        c.batches.clear()
        c.send(P.Snapshot(("b.",)), P.Credit(1 << 20))
        got, end = snapshot_over(c)
    assert (got, end.last) == ({b"b.1": (3001, b"w", 0)}, 3001)


def test_subscriber_from_snapshot_keeps_its_view_current(root: Path) -> None:
    w = JournalWriter.open(root, "s")
    recs = load(5000, 100)
    write(w, recs, per_batch=50)
    mine = {k.decode(): v for k, v in last_values(recs).items() if k.startswith(b"k00000")}
    with start_sidecar(root) as side:
        with Subscriber("s", replay=side.endpoint, start="snapshot", topics=["k00000"]) as sub:
            assert sub.view is not None
            deadline = time.monotonic() + 30
            while sub.view.seq != max(seq for seq, _, _ in mine.values()) and time.monotonic() < deadline:
                sub.update(0.2)
            assert dict(sub.view) == {k: body for k, (_, body, _) in mine.items()}
            assert sub.summary()["from_snapshot"] == len(mine)
            # Then the records after the snapshot: a delete, a value, and a value whose TTL ran out 10 s ago.
            write(w, [(b"k000001", b"", 0), (b"k000002", b"new", 0)])
            write(w, [(b"k000003", b"eph", 1000)], ts_ns=time.time_ns() - 10 * 10**9)
            while sub.view.seq != 5003 and time.monotonic() < deadline:
                sub.update(0.2)
            want = {k: body for k, (_, body, _) in mine.items() if k not in ("k000001", "k000003")}
            assert dict(sub.view) == want | {"k000002": b"new"}
        out = zeps("subscribe", "--replay", side.endpoint, "--stream", "s", "--from", "snapshot", "--timeout", "1")
    w.close()
    assert out.returncode == 0, out.stderr
    view = LastValues()  # what the printed records amount to (the snapshot may be as of 5000: shared for 1 s)
    for line in out.stdout.splitlines():
        x = json.loads(line)
        view.apply(B.Record(x["seq"], x["ts_ns"], x["key"], base64.b64decode(x["body_b64"]), x.get("ttl_ms", 0)))
    live = last_values([*recs, (b"k000001", b"", 0), (b"k000002", b"new", 0), (b"k000003", b"", 0)])  # k3 expired
    assert dict(view) == {k.decode(): body for k, (_, body, _) in live.items()}
    assert "from_snapshot=" in out.stderr


def test_subscriber_from_snapshot_without_snapshots_fails_at_once(root: Path) -> None:
    with JournalWriter.open(root, "s") as w:
        write(w, load(10, 3))
    with start_sidecar(root, "--no-snapshots") as side, Subscriber("s", replay=side.endpoint, start="snapshot") as sub:
        began = time.monotonic()
        with pytest.raises(NotGranted, match="'snapshot'"):
            sub.next(timeout=10)
        assert time.monotonic() - began < 5
        with pytest.raises(NotGranted):  # and at every later call
            sub.next(timeout=0)


# --- publishing TTLs through a real gateway ------------------------------------------------------------------


def test_publisher_ttls_reach_the_journal_and_batches_without_stay_plain(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    try:
        with Publisher(gw.ingest, STREAM, confirm=True, batch_records=2) as pub:
            pub.publish("plain", b"1")
            pub.publish("plain", b"2")
            pub.publish("eph", b"3", ttl=1.5)
            pub.publish("gone", b"")
            pub.flush()
            with pytest.raises(PublishError, match="ttl -1 s is outside"):
                pub.publish("bad", b"x", ttl=-1)
    finally:
        gw.stop()
    with JournalReader(tmp_path, STREAM).cursor(1) as cursor:
        first, second = cursor.next_batch(), cursor.next_batch()
    assert first is not None and second is not None
    assert (first.flags, second.flags) == (B.FLAG_PRODUCER, B.FLAG_PRODUCER | B.FLAG_TTL)
    assert [(r.key, r.body, r.ttl_ms) for r in second.records()] == [("eph", b"3", 1500), ("gone", b"", 0)]
    assert [body for _, _, body in journal_records(tmp_path)] == [b"1", b"2", b"3", b""]


def test_publish_cli_ttl(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path)
    try:
        argv = [sys.executable, "-m", "gateway.cli", "publish", "--ingest", gw.ingest, "--stream", STREAM]
        subprocess.run([*argv, "--key", "k", "--body", "v", "--ttl", "2.5", "--confirm"], check=True, timeout=30)
    finally:
        gw.stop()
    (only,) = [r for b in _batches(tmp_path) for r in b.records()]
    assert (only.key, only.body, only.ttl_ms) == ("k", b"v", 2500)
    assert time.time_ns() - only.ts_ns < 60 * 10**9


def _batches(root: Path) -> list[B.Batch]:
    with JournalReader(root, STREAM).cursor(1) as cursor:
        out = []
        while (batch := cursor.next_batch()) is not None:
            out.append(batch)
        return out
