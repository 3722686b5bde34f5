"""The replay sidecar as a real process: `zeps replay` on 127.0.0.1, a journal written by JournalWriter here,
and clients that are raw DEALER sockets speaking gateway.wire.protocol (or gateway.client.replay_client)."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from support.servers import BASE_TS, Raw, Sidecar, Stream, free_port, record_tuple, start_sidecar

from gateway.client.replay_client import ReplayClient, history
from gateway.errors import ReplayError
from gateway.journal import JournalReader, Retention
from gateway.journal.committed import CommittedMark
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire.batch import MAX_SEQ

pytestmark = pytest.mark.timeout(60)

ALL = (P.FEATURE_BATCH, P.FEATURE_RANGE, P.FEATURE_TIME)


# --- the sidecar process -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "journal"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def sidecar(root: Path) -> Iterator[Sidecar]:
    """One sidecar for the module, started on an empty root: every stream a test makes is created after start."""
    port = free_port()
    with start_sidecar(root, "--metrics", f"127.0.0.1:{port}") as side:
        side.metrics = f"http://127.0.0.1:{port}/metrics"
        yield side


# --- writing the journal -----------------------------------------------------------------------------------


# --- a raw client --------------------------------------------------------------------------------------------


@pytest.fixture
def raw(sidecar: Sidecar) -> Iterator[Callable[[], Raw]]:
    made: list[Raw] = []

    def make() -> Raw:
        made.append(Raw(sidecar.endpoint))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _coverage(batches: list[B.Batch]) -> tuple[int, int]:
    """(first, last) covered by consecutive batches, asserting they leave no hole and do not overlap."""
    for a, b in itertools.pairwise(batches):
        assert b.first_seq == a.last_seq + 1, f"coverage hole or overlap between {a!r} and {b!r}"
    return batches[0].first_seq, batches[-1].last_seq


# --- sessions ------------------------------------------------------------------------------------------------


def test_attach_unknown_stream_then_one_created_after_start(sidecar: Sidecar, root: Path, raw) -> None:
    c = raw()
    c.send(P.Attach(P.PROTOCOL, P.VERSION, "late"))
    assert "unknown stream 'late'" in c.expect(P.Invalid).reason
    c.send(P.Subscribe("", 0))
    assert "before ATTACH" in c.expect(P.Invalid).reason
    s = Stream(root, "late")
    s.write(3)
    assert c.attach("late") == frozenset()
    c.subscribe()
    c.pump(c.through(s.head))
    assert c.records == s.expected()
    c.send(P.Detach())
    c.expect(P.DetachOk)
    c.send(P.Credit(10))
    assert "before ATTACH" in c.expect(P.Invalid).reason
    s.writer.close()


def test_replay_from_zero_from_the_middle_and_with_patterns(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "plain")
    s.write(200, per_batch=10)
    for latest, pattern in ((0, ""), (1234, ""), (0, "k1."), (777, "k2.3")):
        c = raw()
        c.attach("plain")
        c.subscribe(pattern, latest, window=30_000)
        want = s.expected(latest, pattern)
        c.pump(lambda c, want=want: len(c.records) >= len(want))
        assert c.records == want
        assert c.quiet(), "records beyond the journal's head"
    s.writer.close()


def test_subscribe_time_starts_at_the_first_batch_journaled_since(sidecar: Sidecar, root: Path, raw) -> None:
    ticks = iter(range(BASE_TS, BASE_TS + 10**12, 10**9))  # journal time: one second per batch
    s = Stream(root, "timed", clock=lambda: next(ticks))
    s.write(40, per_batch=5)
    c = raw()
    c.attach("timed", (P.FEATURE_TIME,))
    c.window = 1 << 20
    c.send(P.SubscribeTime("", BASE_TS + 10 * 10**9 + 1), P.Credit(c.window))  # just after batch 10's time
    c.expect(P.SubscribeOk)
    c.pump(c.through(s.head))
    assert c.records == s.expected(after=55)  # batch 11 (0-based) starts at 56
    plain = raw()
    plain.attach("timed")
    plain.send(P.SubscribeTime("", 0))
    assert "needs the 'time' extension" in plain.expect(P.Invalid).reason
    s.writer.close()


def test_tiny_credit_releases_exactly_one_message_per_grant(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "tiny")
    s.write(5, per_batch=10)
    for features in ((), (P.FEATURE_BATCH,)):
        c = raw()
        c.attach("tiny", features)
        c.subscribe(window=0)
        assert c.quiet(), "initial credit must be 0"
        for _ in range(4):
            c.send(P.Credit(1))
            c.take(c.recv())
            assert c.quiet(0.1), "more than one message for a 1-byte grant"
        if features:
            assert [(b.first_seq, b.last_seq) for b in c.batches] == [(1, 10), (11, 20), (21, 30), (31, 40)]
            continue
        assert [r[0] for r in c.records] == [1, 2, 3, 4]
        size = len(P.encode(P.Deliver(*c.records[0])))  # every record here encodes to the same size
        for grant, released in ((3 * size, 3), (3 * size + 1, 4)):  # stops when spent; overshoots by one at most
            c.send(P.Credit(grant))
            for _ in range(released):
                c.take(c.recv())
            assert c.quiet(0.1), f"a grant of {grant} bytes released more than {released} messages"
        assert [r[0] for r in c.records] == list(range(1, 12))
    s.writer.close()


def test_twenty_concurrent_clients_each_at_its_own_position(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "many")
    s.write(100, per_batch=30)
    clients, wants = [], []
    for i in range(20):
        c = raw()
        c.attach("many", (P.FEATURE_BATCH,) if i % 2 else ())
        pattern = f"k{i % 4}." if i % 3 == 0 else ""
        latest = i * 140 + i % 7
        c.subscribe(pattern, latest, window=3000 + 700 * i)  # small windows: many credit round trips each
        clients.append(c)
        wants.append(s.expected(latest, pattern))
    poller = zmq.Poller()
    for c in clients:
        poller.register(c.sock, zmq.POLLIN)

    def done(c: Raw, want: list) -> bool:
        return len(c.records) >= len(want) and (not c.batches or c.batches[-1].last_seq >= s.head)

    deadline = time.monotonic() + 20
    while not all(done(c, w) for c, w in zip(clients, wants, strict=True)):
        assert time.monotonic() < deadline, [len(c.records) for c in clients]
        for sock, _ in poller.poll(1000):
            c = next(c for c in clients if c.sock is sock)
            for _ in range(100):  # a bounded gulp per client, like the server's turns
                if c.quiet(0):
                    break
                c.take(c.recv())
    for i, (c, want) in enumerate(zip(clients, wants, strict=True)):
        assert c.records == want, f"client {i}"
        if c.batches:
            assert _coverage(c.batches) == (i * 140 + i % 7 + 1, s.head), f"client {i}"
    s.writer.close()


def test_live_tail_follows_a_writer_over_the_same_connection(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "live")
    s.write(20)
    plain, batched = raw(), raw()
    plain.attach("live")
    batched.attach("live", (P.FEATURE_BATCH,))
    for c in (plain, batched):
        c.subscribe(window=50_000)
        c.pump(c.through(s.head))
    lib = ReplayClient(sidecar.endpoint, "live", window=20_000)
    lib.subscribe("k3.", latest=100)

    def keep_writing() -> None:
        for _ in range(150):
            s.write(1, per_batch=7)
            time.sleep(0.002)  # pacing, so that readers catch up with the tail again and again

    writer = threading.Thread(target=keep_writing)
    writer.start()
    got: list[tuple] = []
    covered = 100
    final = 20 * 10 + 150 * 7
    try:
        for c in (plain, batched):
            c.pump(c.through(final), timeout=20)
        deadline = time.monotonic() + 20
        while covered < final:  # batch coverage reaches the head even where nothing matches
            assert time.monotonic() < deadline
            event = lib.recv(timeout=5)
            assert isinstance(event, B.Batch) and event.first_seq == covered + 1, event
            covered = event.last_seq
            got.extend(record_tuple(r) for r in event.records())
    finally:
        writer.join(timeout=30)
        lib.close()
    assert plain.records == batched.records == s.expected()
    assert [bytes(b.buf) for b in batched.batches] == s.batches, "live batches are the journal's bytes"
    assert got == s.expected(100, "k3.")
    s.writer.close()


def test_retention_trimmed_for_extension_clients_a_jump_for_plain_ones(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "trim", segment_bytes=20_000, retention=Retention(max_bytes=60_000))
    s.write(150)
    first = JournalReader(root, "trim").first_seq
    assert first > 100, "retention should have removed the oldest segments"
    ext, plain = raw(), raw()
    ext.attach("trim", (P.FEATURE_RANGE,))
    plain.attach("trim")
    for c in (ext, plain):
        c.subscribe(latest=5)
        c.pump(c.through(s.head))
        assert c.records == s.expected(first - 1)
    assert ext.events == [P.Trimmed(6, first)]
    assert plain.events == []
    ext.send(P.Fetch(7, "", 10, first + 4))
    ext.pump(lambda c: len(c.events) == 3)
    assert ext.events[1:] == [P.Trimmed(10, first), P.FetchEnd(7, 10, first + 4)]
    assert ext.records[-5:] == s.expected(first - 1, upto=first + 4)
    s.writer.close()


def test_retention_deleting_the_segment_under_a_reader(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "trim2", segment_bytes=20_000, retention=Retention(max_bytes=40_000))
    s.write(20)
    c = raw()
    c.attach("trim2", (P.FEATURE_RANGE,))
    c.subscribe(window=0)
    c.send(P.Credit(1))
    c.take(c.recv())
    assert c.records == s.expected()[:1]
    s.write(200)  # rolls segments; retention deletes the one the reader is in
    first = JournalReader(root, "trim2").first_seq
    assert first > 200
    c.window = 1 << 20
    c.send(P.Credit(c.window))
    c.pump(c.through(s.head))
    trims = [e for e in c.events if isinstance(e, P.Trimmed)]
    assert len(trims) == 1 and trims[0].first_retained == first
    seqs = [r[0] for r in c.records]
    jump = seqs.index(first)
    assert seqs[:jump] == list(range(1, trims[0].requested)), "contiguous up to the loss"
    assert seqs[jump:] == list(range(first, s.head + 1)), "contiguous from the first retained"
    assert c.records == [r for r in s.expected() if r[0] < trims[0].requested or r[0] >= first]
    s.writer.close()


def test_fetch_ranges_with_and_without_patterns(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "fetch")
    s.write(50, per_batch=20)
    c = raw()
    assert c.attach("fetch", ALL) == set(ALL)
    c.window = 1 << 20
    c.send(
        P.Fetch(1, "", 105, 333),
        P.Fetch(2, "k1.", 10, 90),
        P.Fetch(3, "k0.1", 1, 1000),
        P.Fetch(4, "", 990, MAX_SEQ),
        P.Fetch(5, "", MAX_SEQ, MAX_SEQ),
        P.Credit(c.window),
    )
    ends: list[tuple[int, list[B.Batch]]] = []
    start = 0
    while len(ends) < 5:
        c.take(c.recv())
        if c.events:
            end = c.events.pop()
            assert isinstance(end, P.FetchEnd), end
            ends.append((end, c.batches[start:]))
            start = len(c.batches)
    assert [e for e, _ in ends] == [
        P.FetchEnd(1, 105, 333),
        P.FetchEnd(2, 10, 90),
        P.FetchEnd(3, 1, 1000),
        P.FetchEnd(4, 990, 1000),  # ends at the head
        P.FetchEnd(5, MAX_SEQ, 1000),  # a range beyond the head: last says where the head is
    ]
    for (end, batches), (prefix, lo, hi) in zip(
        ends, (("", 105, 333), ("k1.", 10, 90), ("k0.1", 1, 1000), ("", 990, 1000)), strict=False
    ):
        assert _coverage(batches) == (lo, hi), end
        assert [record_tuple(r) for b in batches for r in b.records()] == s.expected(lo - 1, prefix, hi)
    assert ends[4][1] == []
    # Ranges holding nothing for the pattern are said so by one empty batch each, not one per journal batch.
    assert all(a.count or b.count for a, b in itertools.pairwise(ends[2][1]))

    plain = raw()
    plain.attach("fetch", (P.FEATURE_RANGE,))
    plain.window = 1 << 20
    plain.send(P.Fetch(9, "k2.", 300, 400), P.Credit(plain.window))
    plain.pump(lambda c: bool(c.events))
    assert plain.events == [P.FetchEnd(9, 300, 400)]
    assert plain.records == s.expected(299, "k2.", 400)

    none = raw()
    none.attach("fetch")
    none.send(P.Fetch(1, "", 1, 2))
    assert "needs the 'range' extension" in none.expect(P.Invalid).reason
    s.writer.close()


def test_outstanding_fetches_are_bounded(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "bound")
    s.write(2)
    c = raw()
    c.attach("bound", (P.FEATURE_RANGE,))
    c.send(*(P.Fetch(i, "", 1, 20) for i in range(17)))  # no credit yet: all stay outstanding
    assert "16 fetches outstanding" in c.expect(P.Invalid).reason
    c.window = 1 << 20
    c.send(P.Credit(c.window))
    c.pump(lambda c: len(c.events) == 16)
    assert [e.request_id for e in c.events] == list(range(16))  # type: ignore[attr-defined]
    assert c.records == s.expected() * 16
    s.writer.close()


def test_batch_delivery_trims_the_first_batch_and_keeps_coverage_when_filtered(
    sidecar: Sidecar, root: Path, raw
) -> None:
    s = Stream(root, "batches")
    s.write(30, per_batch=10)
    c = raw()
    c.attach("batches", (P.FEATURE_BATCH,))
    c.subscribe(latest=25)
    c.pump(c.through(s.head))
    assert (c.batches[0].first_seq, c.batches[0].last_seq, c.batches[0].count) == (26, 30, 5)
    assert c.batches[0].ts_ns == B.Batch.parse(s.batches[2]).ts_ns
    assert [bytes(b.buf) for b in c.batches[1:]] == s.batches[3:], "whole batches go out as journaled"
    assert c.records == s.expected(25)

    f = raw()
    f.attach("batches", (P.FEATURE_BATCH,))
    f.subscribe("k3.5", latest=3)
    f.pump(f.through(s.head))
    assert _coverage(f.batches) == (4, s.head)
    assert f.records == s.expected(3, "k3.5")
    assert all(a.count or b.count for a, b in itertools.pairwise(f.batches)), "empty runs merge"
    s.writer.close()


def test_a_client_without_credit_costs_no_memory_as_the_journal_grows(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "big")
    s.write(1000, per_batch=5, size=10_000)  # 50 MB before the client comes
    other = raw()
    other.attach("big")
    other.send(P.Ping())
    other.expect(P.PingOk)
    before = sidecar.rss_kib()
    c = raw()
    c.attach("big", (P.FEATURE_BATCH,))
    c.subscribe(window=0)
    c.send(P.Credit(1))
    c.take(c.recv())  # then it grants nothing more
    s.write(600, per_batch=5, size=10_000)  # and the journal grows by another 30 MB
    other.subscribe(latest=s.head - 3)
    other.pump(other.through(s.head))  # the server works on; it has handled the stalled client's commands
    after = sidecar.rss_kib()
    assert after - before < 8 * 1024, f"sidecar RSS grew {after - before} KiB with an 80 MB journal"
    assert c.quiet(0.1)
    c.send(P.Credit(1))
    c.take(c.recv())
    assert [(b.first_seq, b.last_seq) for b in c.batches] == [(1, 5), (6, 10)]
    s.writer.close()


def _metric(side: Sidecar, name: str) -> float:
    assert side.metrics
    text = urllib.request.urlopen(side.metrics, timeout=5).read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_slow_client_neither_slows_others_nor_spins_the_server(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "slow")
    s.write(600, per_batch=5, size=10_000)  # 30 MB: more than the slow client's pipes can hold
    stalls = _metric(sidecar, 'zeps_replay_send_stalls_total{stream="slow"}')
    slow = raw()
    slow.sock.setsockopt(zmq.RCVHWM, 1)
    slow.attach("slow", (P.FEATURE_BATCH,))
    slow.subscribe(window=1 << 40)  # and never reads again
    deadline = time.monotonic() + 10
    while _metric(sidecar, 'zeps_replay_send_stalls_total{stream="slow"}') == stalls:
        assert time.monotonic() < deadline, "the slow client's pipe never filled"
        time.sleep(0.05)  # polling a metric: there is no event to wait on
    cpu = _cpu_s(sidecar.proc.pid)
    time.sleep(0.5)
    assert _cpu_s(sidecar.proc.pid) - cpu < 0.25, "the server spins on a full pipe"
    fast = raw()
    fast.attach("slow", (P.FEATURE_BATCH,))
    fast.subscribe(window=4 << 20)
    fast.pump(fast.through(s.head), timeout=10)
    assert fast.records == s.expected()
    s.writer.close()


def test_fuzzed_frames_leave_the_server_serving(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "fuzz")
    s.write(10)
    rng = random.Random(4)
    valid = [
        P.encode(cmd)
        for cmd in (
            P.Attach(P.PROTOCOL, P.VERSION, "fuzz"),
            P.Subscribe("k1", 3),
            P.Credit(500),
            P.Ping(),
            P.Extend(ALL),
            P.Fetch(1, "k", 1, 5),
            P.SubscribeTime("", 5),
            P.Deliver(3, "k", b"body"),
            P.Invalid("x"),
            P.DeliverBatch(s.batches[0]),
        )
    ]
    # A bad frame with the signature is answered with a reason; one without a signature gets nothing.
    probe = raw()
    probe.sock.send(b"GET / HTTP/1.0\r\n\r\n")
    probe.send(P.Ping())
    probe.expect(P.PingOk)
    probe.sock.send(P.SIGNATURE + b"\x63")
    assert probe.expect(P.Invalid).reason == "unknown command 99"

    fuzzers = [raw(), raw()]
    fuzzers[0].attach("fuzz", ALL)
    invalids = 0
    for i in range(3000):
        kind = rng.randrange(5)
        if kind == 0:
            frames = [rng.randbytes(rng.randrange(0, 40))]
        elif kind == 1:
            frames = [P.SIGNATURE + rng.randbytes(rng.randrange(0, 40))]
        elif kind == 2:
            frame = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
            frames = [bytes(frame)]
        elif kind == 3:
            frame = rng.choice(valid)
            frames = [frame[: rng.randrange(len(frame))] if rng.random() < 0.5 else frame + rng.randbytes(3)]
        else:
            frames = [rng.choice(valid), rng.choice(valid)]
        fz = fuzzers[i % 2]
        fz.sock.send_multipart(frames)
        while not fz.quiet(0):  # read as we go: a client that never reads gets dropped
            invalids += isinstance(fz.recv(), P.Invalid)
    for i, fz in enumerate(fuzzers):
        # A marker no mutation can produce, then a PING: once both are answered, the server read everything.
        fz.send(P.Attach(P.PROTOCOL, P.VERSION, f"end-of-fuzz-{i}"), P.Ping())
        seen_marker = False
        for _ in range(100_000):
            cmd = fz.recv()
            invalids += isinstance(cmd, P.Invalid)
            seen_marker = seen_marker or (isinstance(cmd, P.Invalid) and f"end-of-fuzz-{i}" in cmd.reason)
            if seen_marker and isinstance(cmd, P.PingOk):
                break
        assert seen_marker
    assert invalids > 500
    c = raw()
    c.attach("fuzz", (P.FEATURE_BATCH,))
    c.subscribe()
    c.pump(c.through(s.head))
    assert c.records == s.expected()
    s.writer.close()


def test_protocol_errors_are_answered_with_reasons(sidecar: Sidecar, root: Path, raw) -> None:
    Stream(root, "errs").writer.close()
    c = raw()
    c.send(P.Attach(P.PROTOCOL, 2, "errs"))
    assert "version 2" in c.expect(P.Invalid).reason
    c.attach("errs", (P.FEATURE_BATCH,))
    c.send(P.Extend(ALL))
    assert "EXTEND is allowed once" in c.expect(P.Invalid).reason
    c.send(P.Publish("k", b"v"))
    assert "publish to the gateway" in c.expect(P.Invalid).reason
    c.send(P.DeliverBatch(b""))
    assert "sent by servers" in c.expect(P.Invalid).reason
    c.sock.send_multipart([P.encode(P.Ping()), P.encode(P.Ping())])
    assert "one command per message" in c.expect(P.Invalid).reason


def test_metrics(sidecar: Sidecar, root: Path, raw) -> None:
    s = Stream(root, "metered")
    s.write(5)
    c = raw()
    c.attach("metered")
    c.subscribe()
    c.pump(c.through(s.head))
    assert sidecar.metrics
    metered = '{stream="metered"}'
    # The counters move once per turn, after its sends: a scrape may come between the last send and them.
    deadline = time.monotonic() + 5
    while True:
        text = urllib.request.urlopen(sidecar.metrics, timeout=5).read().decode()
        values = dict(re.findall(r"^(zeps_replay_\w+(?:\{[^}]*\})?) (\S+)$", text, re.M))
        if float(values["zeps_replay_served_records_total" + metered]) >= 50 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert float(values["zeps_replay_served_records_total" + metered]) >= 50
    assert float(values["zeps_replay_served_bytes_total" + metered]) > 50 * 100
    assert float(values["zeps_replay_sessions" + metered]) >= 1
    assert "zeps_replay_credit_stalls_total" + metered in values
    s.writer.close()


# --- heartbeats ----------------------------------------------------------------------------------------------


def test_idle_clients_are_pinged_and_silent_ones_dropped(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    Stream(root, "hb").writer.close()
    with start_sidecar(root, "--client-timeout", "0.9") as side:
        silent, alive = Raw(side.endpoint), Raw(side.endpoint)
        try:
            silent.attach("hb")
            alive.attach("hb")
            start = time.monotonic()
            heard: list[P.Command] = []  # by the silent client, which never answers
            while not heard or not isinstance(heard[-1], P.Detach):
                assert time.monotonic() - start < 3, heard
                if not alive.quiet(0.02):
                    alive.take(alive.recv())  # answers PING with PING-OK
                if not silent.quiet(0):
                    heard.append(silent.recv())
            assert time.monotonic() - start > 0.8
            assert 2 <= len(heard) - 1 <= 4 and all(isinstance(c, P.Ping) for c in heard[:-1]), heard
            while time.monotonic() - start < 2:  # alive stays attached past the timeout by answering
                if not alive.quiet(0.02):
                    alive.take(alive.recv())
            alive.send(P.Subscribe("", 0))
            alive.expect(P.SubscribeOk)
            silent.send(P.Subscribe("", 0))
            assert "before ATTACH" in silent.expect(P.Invalid).reason
        finally:
            silent.close()
            alive.close()


# --- the client library and `zeps history` -------------------------------------------------------------------


def _history_cli(endpoint: str, stream: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gateway.cli", "history", "--replay", endpoint, "--stream", stream, *args]
    return subprocess.run(cmd, capture_output=True, timeout=30, check=False)


def test_zeps_history_prints_what_was_written(sidecar: Sidecar, root: Path) -> None:
    ticks = iter(range(BASE_TS, BASE_TS + 10**12, 10**9))
    s = Stream(root, "hist", clock=lambda: next(ticks))
    s.write(60, per_batch=10)
    done = _history_cli(sidecar.endpoint, "hist")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    b64 = base64.b64encode
    assert lines == [
        {"seq": r.seq, "ts_ns": r.ts_ns, "key": r.key, "body_b64": b64(r.body).decode()} for r in s.records
    ]
    assert done.stdout.startswith(b'{"seq":1,"ts_ns":')

    done = _history_cli(sidecar.endpoint, "hist", "--from", "50", "--to", "320", "--topic", "k2.")
    assert [(d["seq"], d["key"]) for d in map(json.loads, done.stdout.decode().splitlines())] == [
        r[:2] for r in s.expected(49, "k2.", 320)
    ]
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(BASE_TS // 10**9 + 30))  # batch 30 (0-based)
    done = _history_cli(sidecar.endpoint, "hist", "--from", iso + "Z")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["seq"] for line in done.stdout.decode().splitlines()] == list(range(301, 601))
    done = _history_cli(sidecar.endpoint, "hist", "--from", "2100-01-01T00:00:00+00:00")
    assert (done.returncode, done.stdout) == (0, b"")

    assert [record_tuple(r) for r in history(sidecar.endpoint, "hist", first=590)] == s.expected(589)
    assert [r.seq for r in history(sidecar.endpoint, "hist", since_ns=BASE_TS + 59 * 10**9, last=595)] == list(
        range(591, 596)
    )
    s.writer.close()


def test_zeps_history_errors_name_the_cause(sidecar: Sidecar, root: Path) -> None:
    Stream(root, "hist-err").writer.close()
    done = _history_cli(sidecar.endpoint, "no-such")
    assert done.returncode == 1 and b"unknown stream 'no-such'" in done.stderr
    done = _history_cli(sidecar.endpoint, "hist-err", "--from", "yesterday")
    assert done.returncode == 2 and b"'yesterday' is not SEQ" in done.stderr
    done = _history_cli(f"tcp://127.0.0.1:{free_port()}", "hist-err", "--timeout", "0.3")
    assert done.returncode == 1 and b"nothing listens at" in done.stderr and b"is `zeps replay` running" in done.stderr
    with (
        pytest.raises(ReplayError, match="did not grant the 'range'"),
        ReplayClient(sidecar.endpoint, "hist-err", features=()) as plain,
    ):
        plain.fetch(1, 2)  # asked at once; the check waits for the handshake and raises from recv()
        plain.recv()


def test_the_live_tail_wakes_on_appends_and_commits_not_on_the_poll(root: Path) -> None:
    """With a tail poll of 5 s, a tailing client still gets each append (and, on a node of a replicated group,
    each advance of the committed mark) within a fraction of a second: the sidecar watches the stream."""
    stream = Stream(root, "woken")
    stream.write(1)
    mark = CommittedMark(root / "woken")
    mark.advance(10)
    with start_sidecar(root, "--tail-poll-ms", "5000") as side, ReplayClient(side.endpoint, "woken") as client:
        client.subscribe("", 0)
        got = 0

        def received_within(seconds: float) -> float:
            nonlocal got
            start = deadline = time.monotonic()
            deadline += seconds
            while time.monotonic() < deadline:
                event = client.recv(0.01)
                if isinstance(event, B.Batch):
                    got = event.last_seq
                    return time.monotonic() - start
            raise AssertionError(f"nothing within {seconds} s (have {got})")

        received_within(5.0)  # the first batch: at subscribe
        delays = []
        for _ in range(5):
            time.sleep(0.05)  # the client is at the tail again
            stream.write(1)
            assert client.recv(0.2) is None  # journaled but not committed: not served
            mark.advance(got + 10)
            delays.append(received_within(1.0))
        assert got == 60
        print(f"commit -> tailing client: max {max(delays) * 1e3:.1f} ms")
    mark.close()
    stream.writer.close()


def _inotify_fds(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            count += os.readlink(fd) == "anon_inode:inotify"
    return count


def _until(predicate: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_a_stream_is_watched_only_while_a_client_reads_it(tmp_path: Path) -> None:
    """The live tail's inotify watch goes when the stream's last client does: a follower gateway that caught up
    from a leader's sidecar and went over to its pushes must not leave the sidecar woken by every write."""
    root = tmp_path / "journal"
    root.mkdir()
    s = Stream(root, "watched")
    s.write(3)
    with start_sidecar(root) as side:
        pid, before = side.proc.pid, _inotify_fds(side.proc.pid)
        for _ in range(2):  # and again: a new reader gets a new watch
            client = ReplayClient(side.endpoint, "watched", window=100_000)
            client.subscribe("", latest=0)
            got = 0
            while got < s.head:
                event = client.recv(timeout=5)
                assert isinstance(event, B.Batch), event
                got = event.last_seq
            assert _until(lambda: _inotify_fds(pid) == before + 1), "no watch while a client waits at the tail"
            s.write(1)
            event = client.recv(timeout=5)  # the watch wakes the tail (the poll is the backstop)
            assert isinstance(event, B.Batch) and event.last_seq == s.head
            client.close()  # DETACH: the stream's last reader
            assert _until(lambda: _inotify_fds(pid) == before), "the watch outlived the stream's last reader"
    s.writer.close()
