"""A follower copies from the leader's sidecar while behind and from the leader's pushes once level, and goes
back to the sidecar when a push goes missing, in the middle of a flow or at its end (docs/ha.md, "How
followers copy"): its journal is the leader's, byte for byte, whatever was lost.

A real Follower and ReplicaCopier on a real lane and journal; the leader's end of the peer link is a real listening
socket on loopback (gateway.transport.link) that the test drives frame by frame; the leader's sidecar is a
stand-in serving the leader's batches after the sequence the follower subscribes from, up to what the test
lets it have.
"""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from support.servers import SilentFirst, start_sidecar

from gateway.client.replay_client import DEFAULT_FEATURES, ReplayClient
from gateway.journal import Durability, JournalReader, JournalWriter
from gateway.replication.copier import ReplicaCopier
from gateway.replication.follower import Follower, LeaderInfo
from gateway.sequencer.lane import Lane
from gateway.sequencer.metrics import GatewayMetrics
from gateway.sequencer.producers import ProducerTable
from gateway.transport.link import Link, Listener
from gateway.wire import batch as B
from gateway.wire import protocol as P

STREAM, EPOCH = "s", 7


def leader_batches(count: int, size: int = 2) -> list[B.Batch]:
    out, seq = [], 1
    for i in range(count):
        raw = B.resequence(B.Batch.parse(B.encode(0, [(0, b"k", b"r%d" % i)] * size)), seq, 10**18 + i)
        out.append(B.Batch.parse(raw))
        seq += size
    return out


class Sidecar:
    """The leader's sidecar as a follower's tail sees it (a client whose opening is done at once): every batch
    after the subscribed sequence, in order, up to `available` of them; `opened` records each subscription's
    start."""

    ready = True

    def __init__(self, ctx: zmq.Context, journal: list[B.Batch]) -> None:
        self.ctx, self.journal = ctx, journal
        self.available = 0
        self.opened: list[int] = []
        self.sock: zmq.Socket | None = None
        self._next = 0

    def __call__(self, endpoint: str, stream: str, timeout_s: float, ctx: zmq.Context) -> Sidecar:
        assert self.sock is None, "two tails open at once"
        self.sock = self.ctx.socket(zmq.PAIR)
        return self

    def subscribe(self, pattern: str = "", latest: int = 0) -> None:
        self.opened.append(latest)
        self._next = next(i for i, b in enumerate([*self.journal, None]) if b is None or b.first_seq > latest)

    def recv(self, timeout: float | None = None) -> B.Batch | None:
        if self._next >= min(self.available, len(self.journal)):
            return None
        self._next += 1
        return self.journal[self._next - 1]

    def close(self) -> None:
        assert self.sock is not None
        self.sock.close()
        self.sock = None


class Leader:
    """The leader's end of the peer link: pushes and commits, frame by frame."""

    def __init__(self) -> None:
        self.listener = Listener("tcp://127.0.0.1:*")
        self.link: Link | None = None
        self.acked = 0

    def read(self) -> None:
        """Take the follower's pings and acks (the first time, its connection), and what it wrote."""
        deadline = time.monotonic() + 5.0
        while self.link is None and time.monotonic() < deadline:
            links = self.listener.accept(max_frame=4096, max_queued=16)
            self.link = links[0] if links else None
        assert self.link is not None, "the follower never connected"
        for frame in self.link.frames(1000):
            cmd = P.decode(frame)
            if isinstance(cmd, P.ReplicaAck):
                self.acked = max(self.acked, cmd.sequence)

    def push(self, batch: B.Batch) -> None:
        self.send(P.ReplicaBatch(STREAM, EPOCH, batch.first_seq - 1, bytes(batch)))

    def commit(self, seq: int, head: int) -> None:
        self.send(P.ReplicaCommit(STREAM, EPOCH, seq, head))

    def send(self, cmd: P.Command) -> None:
        assert self.link is not None and self.link.send(P.encode(cmd)) == "sent"
        time.sleep(0.02)  # on the follower's side of loopback before its next tick

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        self.listener.close()


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_a_follower_takes_pushes_once_level_and_the_sidecar_fills_what_pushes_lost(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    b = leader_batches(12)
    leader = Leader()
    sidecar = Sidecar(ctx, b)
    info = LeaderInfo("L", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", leader.listener.endpoint, secrets.token_hex(32))
    polled: dict[object, int] = {}  # the follower's peer link in the loop's poller
    f = Follower(ctx, sidecar, "F", info, EPOCH, suspect_s=60.0, watch=polled.__setitem__, unwatch=polled.pop,
                 max_frame=1 << 20)  # fmt: skip
    writer = JournalWriter.open(tmp_path, STREAM, durability=Durability("never"))
    lane = Lane(STREAM, writer, ProducerTable(10**12, 100))
    metrics = GatewayMetrics([STREAM])

    def never_cut(stream: str) -> None:
        raise AssertionError("a copy never cuts")

    copier = ReplicaCopier(tmp_path, {STREAM: lane}, {}, never_cut, {STREAM: metrics.streams[STREAM].copied})

    def loop_pass() -> None:
        """One pass of a follower's loop; then the leader reads what it was told."""
        f.tick(time.monotonic())
        copier.copy(f, STREAM)
        leader.read()

    try:
        f.tick(time.monotonic())  # the first ping: the leader learns where we are on its link
        leader.read()
        time.sleep(0.02)
        f.tick(time.monotonic())  # connected: the ping went out, nothing waits for the kernel
        assert polled == {f.link: zmq.POLLIN}
        leader.read()
        copier.tail(f, STREAM)  # as the copier starts a copy, after its cut
        sidecar.available = 2
        loop_pass()
        assert (writer.last_seq, f.tailing(STREAM)) == (b[1].last_seq, True)  # behind: from the sidecar

        leader.push(b[3])  # journaled before we are level: a gap, kept out; the sidecar brings it
        loop_pass()
        assert (writer.last_seq, f.tailing(STREAM)) == (b[1].last_seq, True)
        sidecar.available = 4
        leader.push(b[4])  # continues what the sidecar brought: level now, the sidecar's tail ends
        loop_pass()
        assert (writer.last_seq, f.tailing(STREAM)) == (b[4].last_seq, False)
        assert sidecar.sock is None and set(polled) == {f.link}  # closed, and out of the loop's poller

        sidecar.available = 10
        leader.push(b[5])
        leader.push(b[7])  # b[6] lost on the way: the gap sends us back to the sidecar, from our head
        loop_pass()
        assert (writer.last_seq, f.tailing(STREAM), sidecar.opened) == (b[5].last_seq, True, [0, b[5].last_seq])
        loop_pass()  # the sidecar brings b[6] ... b[9]
        assert (writer.last_seq, f.tailing(STREAM)) == (b[9].last_seq, True)
        leader.push(b[10])  # level again
        loop_pass()
        assert (writer.last_seq, f.tailing(STREAM)) == (b[10].last_seq, False)
        assert f.committed[STREAM] == b[10].first_seq - 1  # the push carried the leader's commit point

        # The end of a flow: the last push is lost and nothing follows it but a commit, which says the head.
        leader.commit(b[10].last_seq, b[11].last_seq)
        sidecar.available = 12
        loop_pass()
        assert f.tailing(STREAM) and sidecar.opened[-1] == b[10].last_seq
        loop_pass()
        assert writer.last_seq == leader.acked == b[11].last_seq
        leader.commit(b[11].last_seq, b[11].last_seq)  # nothing missing: the tail stays until a push levels us
        loop_pass()
        assert len(sidecar.opened) == 3
        copied = {
            source: metrics.registry.get_sample_value(
                "zeps_gateway_copied_batches_total", {"stream": STREAM, "source": source}
            )
            for source in ("push", "sidecar")
        }
        assert copied == {"push": 3, "sidecar": 9}  # b4, b5, b10 pushed; the rest from the sidecar
        with JournalReader(tmp_path, STREAM).cursor(1) as cursor:
            got = b"".join(bytes(batch) for batch in iter(cursor.next_batch, None))
        assert got == b"".join(bytes(x) for x in b)  # the leader's journal, byte for byte
        f.close()
        assert not polled  # out of the poller before its descriptor closed
    finally:
        f.close()
        leader.close()
        writer.close()


def test_a_tail_whose_first_connection_to_the_sidecar_goes_silent_copies_over_a_raced_second_one(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    """A lost segment of a fresh connection (its ZMTP greeting, the ATTACH, READY) waits for TCP's retransmission,
    0.2 s and more: the copier's connection to the leader's real sidecar opens a second one after 0.2 s
    (gateway.replication.sidecar_race) and copies over it, instead of failing at the first one's 0.5 s deadline
    and starting over (0.2 s later, with a new cut)."""
    b = leader_batches(6)
    journal = JournalWriter.open(tmp_path / "leader", STREAM, durability=Durability("never"))
    for batch in b:
        journal.append_replica(batch)
    journal.close()
    leader = Leader()
    writer = JournalWriter.open(tmp_path / "follower", STREAM, durability=Durability("never"))
    lane = Lane(STREAM, writer, ProducerTable(10**12, 100))
    polled: dict[object, int] = {}

    def replay(endpoint: str, stream: str, timeout_s: float, ctx: zmq.Context) -> ReplayClient:
        """As `zeps gateway` makes a follower's: the leader's uncommitted records too."""
        return ReplayClient(endpoint, stream, timeout=timeout_s, ctx=ctx,
                            features=(*DEFAULT_FEATURES, P.FEATURE_UNCOMMITTED))  # fmt: skip

    def never_cut(stream: str) -> None:
        raise AssertionError("a copy never cuts")

    with start_sidecar(tmp_path / "leader") as sidecar:
        proxy = SilentFirst(sidecar.endpoint)
        info = LeaderInfo("L", "tcp://127.0.0.1:1", proxy.endpoint, leader.listener.endpoint, secrets.token_hex(32))
        f = Follower(ctx, replay, "F", info, EPOCH, suspect_s=60.0, watch=polled.__setitem__, unwatch=polled.pop,
                     max_frame=1 << 20)  # fmt: skip
        copier = ReplicaCopier(tmp_path / "follower", {STREAM: lane}, {}, never_cut,
                               {STREAM: GatewayMetrics([STREAM]).streams[STREAM].copied})  # fmt: skip
        try:
            copier.tail(f, STREAM)
            deadline = time.monotonic() + 5.0
            while writer.last_seq < b[-1].last_seq and time.monotonic() < deadline:
                f.tick(time.monotonic())
                copier.copy(f, STREAM)  # raised ReplayError at the first connection's deadline, before the race
                time.sleep(0.005)
            assert writer.last_seq == b[-1].last_seq
            assert proxy.accepted == 2  # the silent one, and the one raced after it
        finally:
            f.close()
            proxy.close()
            leader.close()
            writer.close()
    assert not polled  # every connection out of the poller before it closed
    with JournalReader(tmp_path / "follower", STREAM).cursor(1) as cursor:
        got = b"".join(bytes(batch) for batch in iter(cursor.next_batch, None))
    assert got == b"".join(bytes(x) for x in b)


def follower_of(leader: Leader, ctx: zmq.Context, polled: dict[object, int]) -> Follower:
    info = LeaderInfo("L", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", leader.listener.endpoint, secrets.token_hex(32))
    return Follower(ctx, Sidecar(ctx, []), "F", info, EPOCH, suspect_s=60.0, watch=polled.__setitem__,
                    unwatch=polled.pop, max_frame=1 << 20)  # fmt: skip


def ticks_until(f: Follower, seconds: float) -> str:
    """The follower's loop for up to `seconds`: why it suspects its leader, or "" if it never did."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if suspected := f.tick(time.monotonic()):
            return suspected
        time.sleep(0.005)
    return ""


def test_a_leader_whose_process_exits_is_suspected_at_once_and_one_that_only_hangs_up_is_not(
    ctx: zmq.Context,
) -> None:
    """Suspicion by silence takes `suspect_s` (60 s here); a leader that closed the link it answered on and then
    refuses a connection has exited (a kill -9 on a live host), and is suspected within a tick or two."""
    leader, polled = Leader(), {}
    f = follower_of(leader, ctx, polled)
    try:
        f.tick(time.monotonic())
        leader.read()
        leader.send(P.PingOk())
        assert ticks_until(f, 0.1) == "" and f.heard_at > f.started_at
        assert leader.link is not None
        leader.link.close()  # hangs up, but still listens: it takes us back, and is not suspected
        leader.link = None
        assert ticks_until(f, 0.3) == ""
        leader.read()  # our new connection
        leader.send(P.PingOk())
        assert ticks_until(f, 0.1) == ""
        started = time.monotonic()
        leader.close()  # the process exits: the link closes, the port refuses
        assert ticks_until(f, 5.0).startswith("exited")
        assert time.monotonic() - started < 0.5
    finally:
        f.close()
        leader.close()
    assert not polled


def test_a_connect_to_the_leader_whose_syn_is_lost_is_made_again_without_the_kernels_second(
    ctx: zmq.Context,
) -> None:
    """A leader's port whose accept queue is full drops SYNs, as a lossy network does: the kernel would send the
    SYN again only after 1 s (the follower, unconnected, would copy and acknowledge nothing meanwhile); the
    follower gives the connect up after 0.2 s and connects again (gateway.transport.connect_retry)."""
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    port.listen(0)  # room for one connection waiting to be accepted
    host, number = port.getsockname()
    filler = socket.create_connection((host, number))  # ... taken: the next SYN is dropped
    info = LeaderInfo("L", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", f"tcp://{host}:{number}", secrets.token_hex(32))
    polled: dict[object, int] = {}
    f = Follower(ctx, Sidecar(ctx, []), "F", info, EPOCH, suspect_s=60.0, watch=polled.__setitem__,
                 unwatch=polled.pop, max_frame=1 << 20)  # fmt: skip
    accepted: list[socket.socket] = []
    try:
        started = time.monotonic()
        assert ticks_until(f, 0.1) == "" and f.link.connecting  # its SYN was dropped
        accepted.append(port.accept()[0])  # room again: a SYN sent from now on is taken
        while f.link.connecting and time.monotonic() - started < 5.0:
            f.tick(time.monotonic())
            time.sleep(0.005)
        assert not f.link.connecting and not f.link.closed
        assert time.monotonic() - started < 0.9  # a new SYN, not the kernel's retransmission at 1 s
    finally:
        f.close()
        filler.close()
        for sock in accepted:
            sock.close()
        port.close()
    assert not polled
