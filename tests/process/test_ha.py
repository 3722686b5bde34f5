"""A replicated gateway group on loopback: real etcd, a gateway and a sidecar per node, leaders killed -9.

The checker: every confirmed record is in the survivors' journals exactly once, at the sequence it was
confirmed with; the journals are prefixes of one another; no sequence holds two contents; epochs grow.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import zmq
from support.certs import make_certs
from support.etcd import EtcdCluster, EtcdProcess
from support.powerloss import Ledger, kill_traced, strace
from support.servers import GatewayProcess, assert_exactly_once, free_port, journal_records, side

from gateway import EtcdDirectory, Subscriber
from gateway import Publisher as Client
from gateway.client.ingest_session import CONFIRM_STALL_S
from gateway.errors import JournalTrimmed, PublishError
from gateway.journal.crosscheck import check_group
from gateway.journal.epochs import read_epochs
from gateway.replication.group import group_key
from gateway.replication.insync_keeper import REPORT_EVERY_S
from gateway.tools.deployment import Keys
from gateway.transport.etcd import Cluster, Etcd
from gateway.transport.link import Link
from gateway.transport.tls import EtcdTls, make_ca, make_node
from gateway.wire import batch as B
from gateway.wire import protocol as P

pytestmark = pytest.mark.timeout(300)
ZEPS = [sys.executable, "-m", "gateway.cli"]

STREAM = "ha"
LEADER_KEY = f"{group_key([STREAM])}/leader"
KILLS = 10


class Node:
    """`zeps gateway --etcd --node` and `zeps replay` beside it, on their own journal."""

    def __init__(self, root: Path, name: str, etcd: str, *extra: str, replay_extra: Sequence[str] = ()) -> None:
        self.name, self.journal = name, root / name
        self.ingest = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"
        self.log = root / f"{name}.log"
        cli = [sys.executable, "-m", "gateway.cli"]
        self.gateway_argv = [*cli, "-v", "gateway", "--stream", STREAM, "--journal", str(self.journal), "--ingest",
                             self.ingest, "--replay-endpoint", self.replay, "--etcd", etcd, "--node", name,
                             "--linger-ms", "0", *extra]  # fmt: skip
        self.replay_argv = [
            *cli,
            "replay",
            "--journal",
            str(self.journal),
            "--bind",
            self.replay,
            "--tail-poll-ms",
            "1",
            "--etcd",
            etcd,
            *replay_extra,
        ]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *, sidecar: bool = True) -> Node:
        """The gateway, and (`sidecar`) the sidecar beside it (else `start_sidecar` later)."""
        self.journal.mkdir(parents=True, exist_ok=True)
        self.procs = [self._spawn(self.gateway_argv)]
        STARTED.append(self)
        if sidecar:
            self.start_sidecar()
        return self

    def start_sidecar(self) -> None:
        self.procs.append(self._spawn(self.replay_argv))

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        out = open(self.log, "ab")  # noqa: SIM115 (the child keeps it)
        return subprocess.Popen(argv, stdout=out, stderr=out)

    def wait_ready(self, timeout_s: float = 30.0) -> Node:
        """Until the gateway answers PING (a follower does too) and its journal exists."""
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.ingest)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                assert all(p.poll() is None for p in self.procs), self.log.read_text()
                sock.send(P.encode(P.Ping()))
                if sock.poll(200) and (self.journal / STREAM).is_dir():
                    return self
            raise AssertionError(f"node {self.name} not ready within {timeout_s} s")
        finally:
            sock.close()

    def signal(self, sig: int, which: int = 0) -> None:
        os.kill(self.procs[which].pid, sig)

    def kill9(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        self.procs = []

    def records(self) -> list[tuple[int, str, bytes]]:
        return journal_records(self.journal, STREAM)


class Publisher:
    """A ZEPS producer that tries each ingest in turn and re-sends a record until one confirms it."""

    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = endpoints
        self.producer = random.getrandbits(63)
        self.turn = 0
        self.sock: zmq.Socket | None = None

    def _connect(self) -> bool:
        if self.sock is not None:
            self.sock.close()
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoints[self.turn % len(self.endpoints)])
        self.turn += 1
        self.sock.send(P.encode(P.Attach(P.PROTOCOL, P.VERSION, STREAM)))
        if not self._answer(P.AttachOk, 0.1):  # refused at once by a follower; a dead node says nothing
            return False
        self.sock.send(P.encode(P.Extend((P.FEATURE_BATCH, P.FEATURE_CONFIRM, P.FEATURE_PRODUCER))))
        return self._answer(P.ExtendOk, 0.1) is not None

    def _answer(self, kind: type[P.Command], timeout: float) -> P.Command | None:
        assert self.sock is not None
        if not self.sock.poll(int(timeout * 1000)):
            return None
        cmd = P.decode(self.sock.recv())
        return cmd if isinstance(cmd, kind) else None

    def send(self, n: int, deadline_s: float = 30.0) -> int:
        """Publish record number n (producer sequence n) until confirmed; its stream sequence."""
        raw = B.encode(0, [(0, b"k", f"record-{n}".encode())], producer=(self.producer, n))
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.sock is None and not self._connect():
                self.sock = None
                continue
            assert self.sock is not None
            self.sock.send(P.encode(P.PublishBatch(raw)))
            ok = self._answer(P.PublishOk, 0.1)  # a confirm takes ms; a re-send is deduplicated
            if isinstance(ok, P.PublishOk):
                return ok.sequence + ok.count - 1
            self.sock.close()
            self.sock = None  # refused (a follower) or silent (dead, paused): the next ingest
        raise AssertionError(f"record {n} not confirmed within {deadline_s} s")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


STARTED: list[Node] = []  # every node a test started: killed when it ends, however it ends


@pytest.fixture(autouse=True)
def _no_node_outlives_its_test() -> Iterator[None]:
    """A test that fails before its own `finally` (in start_group's wait, say) leaves no process running."""
    yield
    while STARTED:
        STARTED.pop().kill9()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    server = EtcdProcess(tmp_path).start()
    yield server
    server.kill()


def leader(etcd: EtcdProcess | Etcd, nodes: list[Node], timeout_s: float = 15.0) -> tuple[Node, int]:
    client = etcd if isinstance(etcd, Etcd) else Etcd(etcd.url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        holder = client.holder(LEADER_KEY)
        if holder is not None:
            for node in nodes:
                if f'"node": "{node.name}"' in holder.value:
                    return node, holder.create_revision
        time.sleep(0.02)
    raise AssertionError("no leader elected")


def start_group(tmp_path: Path, etcd: EtcdProcess, count: int, *extra: str) -> list[Node]:
    nodes = [Node(tmp_path, f"n{i}", etcd.url, *extra).start() for i in range(count)]
    return [node.wait_ready() for node in nodes]


def wait_synced(nodes: list[Node], timeout_s: float = 30.0) -> None:
    """Until every node's journal is as long as the longest (the followers caught up). A journal with a gap
    below its head (sequences `zeps journal repair` discarded, until the node cuts it back) has not."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            lengths: set[object] = {len(node.records()) for node in nodes}
        except JournalTrimmed as exc:
            lengths = {f"a gap: {exc}"}
        if len(lengths) == 1 and not isinstance(next(iter(lengths)), str):
            return
        time.sleep(0.1)
    raise AssertionError(f"journals of {[n.name for n in nodes]} did not converge: {lengths}")


def ha_status(etcd: EtcdProcess) -> dict:
    argv = [sys.executable, "-m", "gateway.cli", "ha", "status", "--etcd", etcd.url, "--stream", STREAM]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    assert len(out.splitlines()) == 1, out
    return json.loads(out)


def check(survivors: list[Node], confirmed: dict[int, int]) -> None:
    journals = [node.records() for node in survivors]
    for records in journals:
        assert [seq for seq, _, _ in records] == list(range(1, len(records) + 1)), "a gap or a reused sequence"
    longest = max(journals, key=len)
    for records in journals:
        assert records == longest[: len(records)], "journals differ"
    bodies = [body for _, _, body in longest]
    for n, seq in confirmed.items():
        assert longest[seq - 1][2] == f"record-{n}".encode(), f"record {n} is not at its confirmed sequence {seq}"
        assert bodies.count(f"record-{n}".encode()) == 1, f"record {n} journaled twice"


def test_leader_killed_repeatedly_loses_no_confirmed_record(etcd: EtcdProcess, tmp_path: Path) -> None:
    nodes = start_group(tmp_path, etcd, 3, "--min-insync", "1")
    pub = Publisher([n.ingest for n in nodes])
    confirmed: dict[int, int] = {}
    failovers: list[float] = []
    epochs: list[int] = []
    try:
        n = 0
        for _ in range(KILLS):
            for _ in range(30):
                n += 1
                confirmed[n] = pub.send(n)
            victim, epoch = leader(etcd, nodes)
            epochs.append(epoch)
            victim.kill9()
            killed = time.monotonic()
            n += 1
            confirmed[n] = pub.send(n)
            failovers.append(time.monotonic() - killed)
            victim.start().wait_ready()  # it rejoins as a follower: cuts what it never replicated, catches up
        for _ in range(30):
            n += 1
            confirmed[n] = pub.send(n)
        epochs.append(leader(etcd, nodes)[1])
        wait_synced(nodes)
        time.sleep(REPORT_EVERY_S * 3)  # the nodes reported their heads
        assert epochs == sorted(set(epochs)), f"epochs did not grow: {epochs}"
        check(nodes, confirmed)
        current, epoch = leader(etcd, nodes)
        led = {node.name: read_epochs(node.journal / STREAM) for node in nodes}
        assert led[current.name][-1][0] == epoch, "the leader's epoch checkpoint lacks its epoch"
        for entries in led.values():
            assert [e for e, _ in entries] == sorted({e for e, _ in entries})
        status = ha_status(etcd)
        assert (status["leader"], status["epoch"]) == (current.name, epoch)
        assert set(status["insync"]) == {n.name for n in nodes} - {current.name}
        head = len(current.records())
        assert {name: s["heads"][STREAM] for name, s in status["nodes"].items()} == {n.name: head for n in nodes}
        print(f"failover kill -9 -> first confirm: median {statistics.median(failovers):.3f} s, "
              f"max {max(failovers):.3f} s over {len(failovers)}")  # fmt: skip
    finally:
        pub.close()
        for node in nodes:
            node.kill9()


@pytest.mark.parametrize("pause_s", [0.7, 2.5], ids=["shorter-than-lease", "past-lease"])
def test_a_paused_leader_never_confirms_after_its_successor_took_over(
    etcd: EtcdProcess, tmp_path: Path, pause_s: float
) -> None:
    nodes = start_group(tmp_path, etcd, 3, "--min-insync", "1")
    pub = Publisher([n.ingest for n in nodes])
    confirmed: dict[int, int] = {}
    try:
        for n in range(1, 31):
            confirmed[n] = pub.send(n)
        paused, epoch = leader(etcd, nodes)
        stale = Publisher([paused.ingest])  # attached before the pause; its record waits in the socket
        stale_n = 1000
        confirmed[stale_n] = stale.send(stale_n)
        paused.signal(signal.SIGSTOP)
        assert stale.sock is not None
        raw = B.encode(0, [(0, b"k", b"record-1001")], producer=(stale.producer, 1001))
        stale.sock.send(P.encode(P.PublishBatch(raw)))
        for n in range(31, 61):  # the others elect a successor and go on
            confirmed[n] = pub.send(n)
        successor, new_epoch = leader(etcd, nodes)
        assert successor is not paused and new_epoch > epoch
        paused.signal(signal.SIGCONT)
        answer = stale._answer(P.PublishOk, 3.0)  # the record sent to the paused leader
        if isinstance(answer, P.PublishOk):
            confirmed[1001] = answer.sequence
        print(f"paused {pause_s} s: the record sent to the paused leader got {answer}")
        for n in range(61, 91):
            confirmed[n] = pub.send(n)
        wait_synced(nodes)
        check(nodes, confirmed)
        stale.close()
    finally:
        pub.close()
        for node in nodes:
            node.kill9()


def test_a_node_stands_for_leader_only_once_its_sidecar_answers(etcd: EtcdProcess, tmp_path: Path) -> None:
    """A gateway up before its sidecar (started in either order) does not lead a journal nobody serves: it says
    why, once, and campaigns as soon as the sidecar listens."""
    node = Node(tmp_path, "n0", etcd.url).start(sidecar=False)
    deadline = time.monotonic() + 30
    while "not standing for leader" not in node.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, node.log.read_text()
        assert node.procs[0].poll() is None, node.log.read_text()
        time.sleep(0.05)
    time.sleep(1.0)  # several elections' worth (the key is polled every 50 ms)
    assert Etcd(etcd.url).holder(LEADER_KEY) is None, "a node led with no sidecar serving its journal"
    assert f"sidecar at {node.replay} does not answer" in node.log.read_text()
    node.start_sidecar()
    assert leader(etcd, [node], timeout_s=30)[0] is node
    assert f"sidecar at {node.replay} answers: standing for leader again" in node.log.read_text()


@pytest.mark.parametrize("min_insync", [1, 0])
def test_a_killed_follower_stops_confirms_below_min_insync(etcd: EtcdProcess, tmp_path: Path, min_insync: int) -> None:
    nodes = start_group(tmp_path, etcd, 2, "--min-insync", str(min_insync))
    pub = Publisher([n.ingest for n in nodes])
    confirmed: dict[int, int] = {}
    try:
        for n in range(1, 21):
            confirmed[n] = pub.send(n)
        head, _ = leader(etcd, nodes)
        follower = next(node for node in nodes if node is not head)
        asking = Publisher([follower.ingest])
        assert not asking._connect()  # a follower refuses ATTACH, naming the leader
        assert asking.sock is not None
        asking.sock.send(P.encode(P.Attach(P.PROTOCOL, P.VERSION, STREAM)))
        refusal = asking._answer(P.Invalid, 5.0)
        assert isinstance(refusal, P.Invalid) and f"the leader is {head.name} at {head.ingest}" in refusal.reason
        assert refusal.reason.endswith(P.RETRY_LATER)
        asking.close()
        follower.kill9()
        if min_insync:
            with pytest.raises(AssertionError, match="not confirmed"):
                pub.send(21, deadline_s=3.0)  # journaled by the leader, held: its only follower is gone
            flood = Publisher([head.ingest])
            assert flood._connect()
            assert flood.sock is not None
            for _ in range(300):  # more batches than the leader holds uncommitted (max_out_queue, 256)
                flood.sock.send(P.encode(P.PublishBatch(B.encode(0, [(0, b"f", b"flood")]))))
            refused = flood._answer(P.Invalid, 5.0)  # the leader reads on (acks come that way) but refuses
            assert isinstance(refused, P.Invalid) and refused.reason.endswith(P.RETRY_LATER), refused
            flood.close()
            follower.start().wait_ready()
        confirmed[21] = pub.send(21)  # min-insync 0: once the follower left the in-sync set; 1: once it is back
        for n in range(22, 41):
            confirmed[n] = pub.send(n)
        if not min_insync:
            follower.start().wait_ready()
        wait_synced(nodes)
        check(nodes, confirmed)
    finally:
        pub.close()
        for node in nodes:
            node.kill9()


def test_a_lagging_follower_makes_publishers_wait_not_fail(etcd: EtcdProcess, tmp_path: Path) -> None:
    """A flood of more batches than a leader may hold uncommitted, while its in-sync follower is paused for less
    than the lag limit: the leader stops reading publishes (they wait in ZeroMQ's queues) but goes on hearing
    its follower on the peer link, so it refuses nothing, is not deposed, and confirms every batch once the
    follower is back."""
    nodes = start_group(tmp_path, etcd, 2, "--min-insync", "1")
    pub = Publisher([n.ingest for n in nodes])
    flood = Publisher([])
    try:
        confirmed = {n: pub.send(n) for n in range(1, 21)}
        head, epoch = leader(etcd, nodes)
        follower = next(node for node in nodes if node is not head)
        flood.endpoints = [head.ingest]
        assert flood._connect() and flood.sock is not None
        follower.signal(signal.SIGSTOP)  # its gateway: no copy, no ack, no ping for 0.6 s (the lag limit is 1 s)
        sent_at = time.monotonic()
        for n in range(1, 301):  # more batches than the leader holds uncommitted (max_out_queue, 256)
            raw = B.encode(0, [(0, b"f", b"flood-%d" % n)], producer=(flood.producer, n))
            flood.sock.send(P.encode(P.PublishBatch(raw)))
        pause_ms = max(0, int((0.6 - (time.monotonic() - sent_at)) * 1000))
        assert not flood.sock.poll(pause_ms), "no confirm can come, nor a refusal, while the follower is paused"
        follower.signal(signal.SIGCONT)
        got = 0
        while got < 300:
            assert flood.sock.poll(10_000), f"nothing for 10 s after {got} records confirmed"
            ok = P.decode(flood.sock.recv())
            assert isinstance(ok, P.PublishOk), f"after {got} records confirmed: {ok}"  # never an INVALID
            got += ok.count
        assert got == 300
        confirmed[21] = pub.send(21)
        assert leader(etcd, nodes) == (head, epoch)  # the flood never made the leader look silent
        wait_synced(nodes)
        check(nodes, confirmed)
        assert len([r for r in head.records() if r[2].startswith(b"flood-")]) == 300
    finally:
        flood.close()
        pub.close()
        for node in nodes:
            node.kill9()


def test_forged_replica_acks_never_make_the_leader_confirm(etcd: EtcdProcess, tmp_path: Path) -> None:
    """A client of the leader's peer link that sends REPLICA-ACKs in a follower's name, for sequences that
    follower has not copied (it is SIGSTOPped), must not get them confirmed; the follower's own acks still count.
    The leader's ingest takes no REPLICA-ACK at all."""
    nodes = start_group(tmp_path, etcd, 2, "--min-insync", "1")
    pub = Publisher([n.ingest for n in nodes])
    confirmed: dict[int, int] = {}
    stop = threading.Event()
    rogue: Link | None = None

    def forge(node: str, epoch: int) -> None:
        assert rogue is not None
        while not stop.wait(0.01):  # faster than the follower's own acks, for every sequence to come
            for mac in (b"", bytes(16), os.urandom(16)):
                assert rogue.send(P.encode(P.ReplicaAck(node, STREAM, epoch, 1 << 40, 1 << 40, mac))) != "gone"
            rogue.flush()
            for _ in rogue.frames(100):  # the leader's answers (none expected): read, so it never waits on us
                pass

    forger: threading.Thread | None = None
    try:
        for n in range(1, 21):
            confirmed[n] = pub.send(n)
        head, epoch = leader(etcd, nodes)
        follower = next(node for node in nodes if node is not head)
        holder = Etcd(etcd.url).holder(LEADER_KEY)
        assert holder is not None
        rogue = Link.connect(json.loads(holder.value)["peer"], max_frame=1 << 20, max_queued=1000)
        misplaced = Publisher([head.ingest])
        assert misplaced._connect() and misplaced.sock is not None
        misplaced.sock.send(P.encode(P.ReplicaAck(follower.name, STREAM, epoch, 1 << 40, 1 << 40, bytes(16))))
        refused = misplaced._answer(P.Invalid, 5.0)
        misplaced.close()
        assert isinstance(refused, P.Invalid) and "REPLICA-ACK is not allowed here" in refused.reason, refused
        zeromq = zmq.Context.instance().socket(zmq.DEALER)  # a node of an older version: ZeroMQ on the peer link
        zeromq.setsockopt(zmq.LINGER, 0)
        zeromq.connect(json.loads(holder.value)["peer"])
        zeromq.send(P.encode(P.ReplicaAck(follower.name, STREAM, epoch, 1 << 40, 1 << 40, bytes(16))))
        deadline = time.monotonic() + 5
        while "not in this version's framing" not in head.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        zeromq.close()
        assert "run one version of zeps on every node" in head.log.read_text()
        follower.signal(signal.SIGSTOP)
        forger = threading.Thread(target=forge, args=(follower.name, epoch), daemon=True)
        forger.start()
        with pytest.raises(AssertionError, match="not confirmed"):
            pub.send(21, deadline_s=3.0)  # journaled by the leader; its only in-sync follower does not have it
        assert "dropped a REPLICA-ACK" in head.log.read_text()
        follower.signal(signal.SIGCONT)  # the forger goes on: the genuine acks alone commit
        confirmed[21] = pub.send(21)
        for n in range(22, 41):
            confirmed[n] = pub.send(n)
        assert not rogue.closed, rogue.error  # the leader kept the forger's connection: it checked every ack
        assert leader(etcd, nodes) == (head, epoch)
        wait_synced(nodes)
        check(nodes, confirmed)
    finally:
        stop.set()
        if forger is not None:
            forger.join(5)
        if rogue is not None:
            rogue.close()
        pub.close()
        for node in nodes:
            node.kill9()


def test_etcd_down_stops_confirms_and_they_resume_with_etcd(etcd: EtcdProcess, tmp_path: Path) -> None:
    nodes = start_group(tmp_path, etcd, 3, "--min-insync", "1")
    pub = Publisher([n.ingest for n in nodes])
    confirmed: dict[int, int] = {}
    try:
        for n in range(1, 21):
            confirmed[n] = pub.send(n)
        _, epoch = leader(etcd, nodes)
        etcd.kill()
        time.sleep(1.5)  # past the lease: no node may act
        with pytest.raises(AssertionError, match="not confirmed"):
            pub.send(21, deadline_s=2.0)
        etcd.start()
        for n in range(21, 41):
            confirmed[n] = pub.send(n)
        assert leader(etcd, nodes)[1] > epoch
        wait_synced(nodes)
        check(nodes, confirmed)
    finally:
        pub.close()
        for node in nodes:
            node.kill9()


def test_the_loop_keeps_serving_while_etcd_is_paused(etcd: EtcdProcess, tmp_path: Path) -> None:
    """Every etcd request runs on the elector's thread: with etcd SIGSTOPped (requests hang until their timeout)
    while the leader is dropping a silent follower from the in-sync set (a write to etcd), the nodes' loops still
    answer PING at once, and a publisher gets its answer (a refusal once the lease is gone) without delay."""
    # --fsync never: an fdatasync on a disk shared with other jobs can hold a loop too, which is not the point here
    nodes = start_group(tmp_path, etcd, 3, "--min-insync", "0", "--fsync", "never")
    pub = Publisher([n.ingest for n in nodes])
    confirmed: dict[int, int] = {}
    probe = zmq.Context.instance().socket(zmq.DEALER)
    probe.setsockopt(zmq.LINGER, 0)
    try:
        for n in range(1, 21):
            confirmed[n] = pub.send(n)
        head, _ = leader(etcd, nodes)
        silent, other = [node for node in nodes if node is not head]
        assert etcd.proc is not None
        probe.connect(head.ingest)
        probe.connect(other.ingest)
        silent.signal(signal.SIGSTOP)
        time.sleep(0.8)  # the leader drops it from the in-sync set after 1 s (ha_lag_s): a write to etcd
        os.kill(etcd.proc.pid, signal.SIGSTOP)
        worst = 0.0
        end = time.monotonic() + 2.5  # past the lease: the leader steps down meanwhile
        while time.monotonic() < end:
            for _ in range(2):  # one PING to each node (round robin)
                sent = time.monotonic()
                probe.send(P.encode(P.Ping()))
                assert probe.poll(2000), "a node's loop did not answer PING within 2 s"
                assert isinstance(P.decode(probe.recv()), P.PingOk)
                worst = max(worst, time.monotonic() - sent)
            time.sleep(0.01)
        asking = Publisher([head.ingest])
        asking.sock = zmq.Context.instance().socket(zmq.DEALER)
        asking.sock.setsockopt(zmq.LINGER, 0)
        asking.sock.connect(head.ingest)
        sent = time.monotonic()
        asking.sock.send(P.encode(P.Attach(P.PROTOCOL, P.VERSION, STREAM)))
        answered = asking._answer(P.Invalid, 2.0)
        answer_s = time.monotonic() - sent
        asking.close()
        os.kill(etcd.proc.pid, signal.SIGCONT)
        silent.signal(signal.SIGCONT)
        print(f"etcd paused: slowest PING {worst * 1000:.1f} ms, ATTACH refused in {answer_s * 1000:.1f} ms")
        assert isinstance(answered, P.Invalid) and answered.reason.endswith(P.RETRY_LATER), answered
        assert worst < 0.2, f"a loop stalled {worst:.3f} s while etcd was paused"
        for n in range(21, 41):
            confirmed[n] = pub.send(n)
        wait_synced(nodes)
        check(nodes, confirmed)
    finally:
        if etcd.proc is not None:
            os.kill(etcd.proc.pid, signal.SIGCONT)
        probe.close()
        pub.close()
        for node in nodes:
            node.kill9()


def test_clients_given_only_etcd_find_the_group_and_follow_each_new_leader(etcd: EtcdProcess, tmp_path: Path) -> None:
    """A `Publisher` and a `Subscriber` given only etcd (the directory, as `zeps publish/subscribe --etcd`) find
    the leader's ingest and the nodes' sidecars there, and follow each new leader: the leader killed -9 twice,
    every record journaled exactly once and delivered once, in order."""
    nodes = start_group(tmp_path, etcd, 3, "--min-insync", "1")
    sent: list[bytes] = []
    outages: list[float] = []
    try:
        with EtcdDirectory([etcd.url], poll_s=0.1) as found, EtcdDirectory([etcd.url], poll_s=0.1) as heard:
            pub = Client(None, STREAM, directory=found, confirm=True, linger_ms=1, timeout=30)
            sub = Subscriber(STREAM, directory=heard, start="earliest")
            try:
                first, _ = leader(etcd, nodes)
                assert pub.endpoint == first.ingest  # the leader's, not a follower's
                for kill in range(3):
                    for i in range(100):
                        sent.append(f"{kill}-{i}".encode())
                        pub.publish("k", sent[-1])
                    pub.flush()
                    if kill == 2:
                        break
                    victim, epoch = leader(etcd, nodes)
                    victim.kill9()
                    killed = time.monotonic()
                    sent.append(f"{kill}-after-kill".encode())
                    pub.publish("k", sent[-1])
                    pub.flush()
                    outages.append(time.monotonic() - killed)
                    successor, new_epoch = leader(etcd, nodes)
                    assert new_epoch > epoch and pub.endpoint == successor.ingest
                    victim.start().wait_ready()
                got: list[bytes] = []
                deadline = time.monotonic() + 30
                while len(got) < len(sent) and time.monotonic() < deadline:
                    rec = sub.next(timeout=0.2)
                    if rec is not None:
                        got.append(rec.body)
                assert got == sent, f"{len(got)} of {len(sent)} delivered"
            finally:
                pub.close()
                sub.close()
        cli = [sys.executable, "-m", "gateway.cli"]
        published = subprocess.run([*cli, "publish", "--etcd", etcd.url, "--stream", STREAM, "--body", "by-cli"],
                                   capture_output=True, text=True, timeout=60)  # fmt: skip
        assert published.returncode == 0, published.stderr
        sent.append(b"by-cli")
        heard_all = subprocess.run([*cli, "subscribe", "--etcd", etcd.url, "--stream", STREAM, "--from", "earliest",
                                    "--count", str(len(sent)), "--timeout", "20"],
                                   capture_output=True, text=True, timeout=60)  # fmt: skip
        assert heard_all.returncode == 0, heard_all.stderr
        lines = [json.loads(line) for line in heard_all.stdout.splitlines()]
        assert [(r["seq"], base64.b64decode(r["body_b64"])) for r in lines] == list(enumerate(sent, 1))
        wait_synced(nodes)
        for node in nodes:
            assert_exactly_once(node.journal, sent, STREAM)
        print("a publisher given only etcd: kill -9 -> confirmed by the new leader in", [f"{o:.3f}" for o in outages])
    finally:
        for node in nodes:
            node.kill9()


class Tail:
    """A live-tail subscriber of one sidecar, from the first record, kept for the whole test (never restarted)."""

    def __init__(self, endpoint: str) -> None:
        from gateway.client.replay_client import ReplayClient

        self.client = ReplayClient(endpoint, STREAM, timeout=5.0, ctx=zmq.Context())
        self.client.subscribe("", 0)
        self.got: list[tuple[int, bytes]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                event = self.client.recv(0.05)
                if isinstance(event, B.Batch):
                    self.got.extend(
                        (seq, bytes(body)) for seq, _, _, body in event.raw(event.first_seq, event.last_seq)
                    )
        except BaseException as exc:
            self.error = exc

    def wait_for(self, head: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.error is None and (not self.got or self.got[-1][0] < head):
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.client.close()


def test_a_former_leaders_sidecar_serves_only_committed_records_across_its_rejoin(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """The leader journals records its followers never get (they are paused, then killed), then is paused itself;
    a successor assigns other records to those sequences; the old leader wakes, rejoins and cuts them. A subscriber that
    tails the old leader's sidecar all along (the sidecar is never restarted) gets every sequence once, in
    order, with the content every journal agrees on: never one of the records journaled alone."""
    nodes = start_group(tmp_path, etcd, 3, "--min-insync", "1")
    pub = Publisher([n.ingest for n in nodes])
    confirmed: dict[int, int] = {}
    tail: Tail | None = None
    try:
        for n in range(1, 31):
            confirmed[n] = pub.send(n)
        old, epoch = leader(etcd, nodes)
        followers = [node for node in nodes if node is not old]
        tail = Tail(old.replay)
        tail.wait_for(confirmed[30])
        stale = Publisher([old.ingest])
        confirmed[1000] = stale.send(1000)
        for node in followers:
            node.signal(signal.SIGSTOP)
        assert stale.sock is not None
        for n in (1001, 1002, 1003):  # journaled by the leader alone: its followers copy nothing now
            stale.sock.send(P.encode(P.PublishBatch(B.encode(0, [(0, b"k", f"record-{n}".encode())],
                                                             producer=(stale.producer, n)))))  # fmt: skip
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(old.records()) < confirmed[1000] + 3:
            time.sleep(0.01)
        assert len(old.records()) == confirmed[1000] + 3, "the leader did not journal the records sent to it"
        time.sleep(0.1)  # its sidecar polls its journal every ms: time enough to serve them, were it to
        old.signal(signal.SIGSTOP)
        for node in followers:  # they lose what the old leader's sidecar had sent them (not journaled yet)
            node.kill9()
            node.start()
        for node in followers:
            node.wait_ready()
        for n in range(31, 61):  # the followers elect a successor, which assigns those sequences to these
            confirmed[n] = pub.send(n)
        successor, new_epoch = leader(etcd, nodes)
        assert successor is not old and new_epoch > epoch
        old.signal(signal.SIGCONT)  # it steps down, cuts what it journaled alone, follows
        for n in range(61, 91):
            confirmed[n] = pub.send(n)
        wait_synced(nodes)
        check(nodes, confirmed)
        journal = [(seq, body) for seq, _, body in successor.records()]
        assert b"record-1001" not in {body for _, body in journal}
        tail.wait_for(journal[-1][0])
        assert tail.error is None, f"the subscriber of the old leader's sidecar failed: {tail.error!r}"
        assert tail.got == journal, "the old leader's sidecar served other records than the group committed"
        assert "journal corrupt" not in old.log.read_text()
        stale.close()
    finally:
        if tail is not None:
            tail.close()
        pub.close()
        for node in nodes:
            node.kill9()


def test_a_publisher_whose_confirms_stall_attaches_again_and_loses_nothing(etcd: EtcdProcess, tmp_path: Path) -> None:
    """A leader that holds confirms (its only follower, needed by --min-insync 1, is paused) still answers pings,
    so the connection stays up: the Publisher gives it a new session every CONFIRM_STALL_S and re-sends. Once the
    follower is back everything is confirmed, each record journaled once on both nodes."""
    nodes = start_group(tmp_path, etcd, 2, "--min-insync", "1")
    bodies = [f"stall-{n}".encode() for n in range(60)]
    try:
        head, _ = leader(etcd, nodes)
        follower = next(node for node in nodes if node is not head)
        with Client([head.ingest, follower.ingest], STREAM, confirm=True, timeout=10.0) as pub:
            for body in bodies[:20]:
                pub.publish("k", body)
            pub.flush()
            follower.signal(signal.SIGSTOP)
            try:
                for body in bodies[20:40]:
                    pub.publish("k", body)
                with pytest.raises(PublishError, match="not confirmed"):
                    pub.flush(timeout=CONFIRM_STALL_S + 1.5)
                assert pub.reconnects >= 1  # without the stall deadline it waits on the same session for ever
            finally:
                follower.signal(signal.SIGCONT)
            for body in bodies[40:]:
                pub.publish("k", body)
            pub.flush(timeout=30.0)
        wait_synced(nodes)
        for node in nodes:
            assert_exactly_once(node.journal, bodies, STREAM)
    finally:
        for node in nodes:
            node.kill9()


def copied(node: Node, port: int) -> dict[str, float]:
    """The node's zeps_gateway_copied_batches, by source (its gateway's --metrics at `port`)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for source in ("push", "sidecar"):
        line = f'zeps_gateway_copied_batches_total{{source="{source}",stream="{STREAM}"}} '
        out[source] = next(float(x[len(line) :]) for x in text.splitlines() if x.startswith(line))
    return out


def test_a_level_follower_copies_from_the_leaders_pushes_and_a_restarted_one_catches_up_first(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """A follower level with its leader takes each batch the leader pushes on the peer link, not its sidecar's
    tail; one killed -9 while the leader goes on (nothing required it) starts from the sidecar, then takes the
    pushes once level. Every batch copied exactly once, journals identical."""
    ports = [free_port(), free_port()]
    nodes = [Node(tmp_path, f"n{i}", etcd.url, "--min-insync", "0", "--metrics", f"127.0.0.1:{ports[i]}").start()
             for i in range(2)]  # fmt: skip
    pub = Publisher([n.ingest for n in nodes])
    try:
        for node in nodes:
            node.wait_ready()
        confirmed = {n: pub.send(n) for n in range(1, 201)}
        head, _ = leader(etcd, nodes)
        i = 1 - nodes.index(head)
        follower = nodes[i]
        wait_synced(nodes)
        first = copied(follower, ports[i])
        assert first["push"] + first["sidecar"] == len(follower.records()), first  # each batch once
        assert first["push"] >= 150, f"a level follower copied from the sidecar: {first}"

        follower.kill9()
        confirmed |= {n: pub.send(n) for n in range(201, 301)}  # journaled by the leader alone
        follower.start().wait_ready()
        confirmed |= {n: pub.send(n) for n in range(301, 501)}
        wait_synced(nodes)
        second = copied(follower, ports[i])
        assert second["sidecar"] >= 100, f"the restarted follower did not catch up from the sidecar: {second}"
        assert second["push"] >= 150, f"the restarted follower never took pushes once level: {second}"
        assert second["push"] + second["sidecar"] == 300, second
        check(nodes, confirmed)
    finally:
        pub.close()
        for node in nodes:
            node.kill9()


def test_a_group_whose_sidecars_require_curve_copies_with_a_client_key(etcd: EtcdProcess, tmp_path: Path) -> None:
    """A follower behind its leader catches up through the leader's sidecar (a level one takes the leader's
    pushes on the peer link, whose acks carry macs). With CURVE on the sidecars (`zeps replay --curve-secret
    --curve-allow`), a node given a client key they allow (`zeps gateway --curve-key --curve-server`) catches up;
    one without stays behind, never joins the in-sync set, and says why once; given the key, it catches up."""
    keys = Keys.create(tmp_path / "keys")
    client = ("--curve-key", str(keys.dir / "client.key_secret"), "--curve-server", str(keys.dir / "server.key"))

    def node(name: str, *extra: str) -> Node:
        return Node(tmp_path, name, etcd.url, "--min-insync", "0", *extra, replay_extra=keys.server_args())

    head = node("k0", *client).start().wait_ready()
    pub = Publisher([head.ingest])
    follower = node("k1", *client)
    try:
        confirmed = {n: pub.send(n) for n in range(1, 21)}  # the leader alone: --min-insync 0
        follower.start().wait_ready()
        wait_synced([head, follower])  # the 20 came through the leader's sidecar, over CURVE
        follower.kill9()
        confirmed |= {n: pub.send(n) for n in range(21, 41)}
        follower = node("k1").start().wait_ready()  # no client key: it cannot catch up
        time.sleep(2.0)
        assert len(follower.records()) == 20
        said = [line for line in follower.log.read_text().splitlines() if "security mismatch" in line]
        warned = [line for line in said if " WARNING " in line]  # once; its retries are quiet (INFO, with -v)
        assert len(warned) == 1 and "give --curve-key and --curve-server" in warned[0] and len(said) > 1, said
        follower.kill9()
        follower = node("k1", *client).start().wait_ready()
        confirmed[41] = pub.send(41)
        wait_synced([head, follower])
        check([head, follower], confirmed)
    finally:
        pub.close()
        head.kill9()
        follower.kill9()


def test_a_pair_on_tls_keeps_a_leader_and_serves_when_the_etcd_leader_is_killed(tmp_path: Path) -> None:
    """The default recipe of docs/ha.md: a 3-member etcd cluster with TLS and client-certificate auth, nodes whose
    peer link is mutual TLS. Every confirm (--min-insync 1) crossed the TLS peer link; etcd's leader member
    killed -9 mid-run: the group keeps a leader and confirms on, nothing lost. A client without a certificate
    of the CA is refused by etcd with one line; a node whose peer certificate another CA signed is refused by
    the leader's peer link, and neither follows nor deposes it. The leader killed -9: a follower over TLS takes
    over, and confirms resume once the restarted node is in sync again."""
    certs = make_certs(tmp_path / "certs", ["m0", "m1", "m2", "n0", "n1", "n2", "n3"])
    cluster = EtcdCluster(tmp_path, certs).start()
    urls = ",".join(cluster.urls)

    def node(name: str, *extra: str) -> Node:
        etcd_tls = certs.etcd_args(name)
        return Node(tmp_path, name, urls, "--min-insync", "1", *etcd_tls, *extra, replay_extra=etcd_tls)

    nodes = [node(f"n{i}", *certs.gateway_args(f"n{i}")).start() for i in range(2)]
    client = Etcd(Cluster(cluster.urls, EtcdTls.load(certs.ca, certs.cert("n0"), certs.key("n0"))))
    pub = Publisher([n.ingest for n in nodes])
    confirmed: dict[int, int] = {}
    try:
        for n in nodes:
            n.wait_ready()
        for n in range(1, 201):
            confirmed[n] = pub.send(n)
        head, epoch = leader(client, nodes)
        victim = cluster.leader()
        victim.kill()
        slowest = 0.0
        for n in range(201, 401):
            sent = time.monotonic()
            confirmed[n] = pub.send(n)
            slowest = max(slowest, time.monotonic() - sent)
        now_leads, now_epoch = leader(client, nodes)
        print(f"etcd leader {victim.name} killed: slowest confirm after it {slowest * 1000:.0f} ms; group leader "
              f"{head.name} (epoch {epoch}) -> {now_leads.name} (epoch {now_epoch})")  # fmt: skip
        wait_synced(nodes)
        check(nodes, confirmed)

        # a client finds the group in etcd with its certificate ...
        argv = [*ZEPS, "streams", "--etcd", urls, "--json", "--wait", "1", *certs.etcd_args("n0")]
        found = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert found.returncode == 0 and f'"{STREAM}"' in found.stdout, found.stderr
        # ... and one without a certificate of the CA is refused: one line, exit 1
        other_ca = make_ca(tmp_path / "other")
        make_node(tmp_path / "rogue", other_ca, [])
        rogue = ["--etcd-ca", str(certs.ca), "--etcd-cert", str(tmp_path / "rogue.crt"),
                 "--etcd-key", str(tmp_path / "rogue.key")]  # fmt: skip
        for options in ([], rogue):
            argv = [*ZEPS, "ha", "status", "--etcd", urls, "--stream", STREAM, *options]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
            assert "TLS refused" in done.stderr and "--etcd-cert" in done.stderr, done.stderr

        # a node whose peer certificate another CA signed: refused on the peer link, deposes nobody
        intruder = node("n2", "--peer-tls-cert", str(tmp_path / "rogue.crt"), "--peer-tls-key",
                        str(tmp_path / "rogue.key"), "--peer-tls-ca", str(other_ca[0])).start()  # fmt: skip
        intruder.wait_ready()
        for n in range(401, 421):
            confirmed[n] = pub.send(n)
        time.sleep(1.0)  # three times --suspect-ms: long enough to have deposed the leader, were it suspected
        # (a loaded machine may still make etcd slow past the lease, and the pair elect again: not the intruder)
        assert "campaigning" not in intruder.log.read_text()
        now_leads, now_epoch = leader(client, nodes)
        assert "refused a connection to the peer link" in "".join(n.log.read_text() for n in nodes)
        assert "check this node's --peer-tls-cert" in intruder.log.read_text()

        # the group's leader killed -9 and restarted: its successor leads, and confirms resume once the restarted
        # node caught up over the TLS peer link and is in sync again
        now_leads.kill9()
        killed = time.monotonic()
        now_leads.start()
        for n in range(421, 441):
            confirmed[n] = pub.send(n)
        print(f"group leader killed -9 and restarted: confirms resumed after {time.monotonic() - killed:.2f} s")
        assert leader(client, nodes)[1] > now_epoch
        wait_synced(nodes)
        check(nodes, confirmed)

        # a node of the CA presenting another node's certificate: the leader does not count its acks as its own
        misnamed = node("n3", *certs.gateway_args("n0")).start()
        misnamed.wait_ready()
        for n in range(441, 461):
            confirmed[n] = pub.send(n)
        time.sleep(1.0)
        assert "dropped a REPLICA-ACK for node 'n3' from a link whose certificate is" in "".join(
            n.log.read_text() for n in nodes
        )
        assert "campaigning" not in misnamed.log.read_text()
        misnamed.kill9()
        check(nodes, confirmed)
    finally:
        pub.close()
        cluster.kill()


def test_a_mirror_site_that_is_a_group_journals_the_source_on_every_node_across_a_failover(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """Site mirroring (docs/mirroring.md) into a replicated group: mirror batches take the leader's ordinary path
    (journaled, copied by the followers); after the leader is killed the mirror resumes at the new leader's head."""
    source_root = tmp_path / "source"
    source_root.mkdir()
    source = GatewayProcess(source_root, streams=(STREAM,))
    nodes = start_group(tmp_path, etcd, 2, "--mirror", STREAM)
    log = open(tmp_path / "mirror.log", "ab")  # noqa: SIM115 (the child keeps it)
    mirror = None
    try:
        with side(source_root) as sidecar:
            to = ",".join(n.ingest for n in nodes)
            mirror = subprocess.Popen([*ZEPS, "mirror", "-v", "--source", sidecar.endpoint, "--to", to, "--stream",
                                       STREAM, "--timeout", "2s"], stderr=log)  # fmt: skip
            sent = 0
            for victim_killed in (False, True):
                with Client(source.ingest, STREAM, confirm=True, timeout=20) as pub:
                    for i in range(sent + 1, sent + 1001):
                        pub.publish("k", f"record-{i}".encode())
                    assert pub.flush() == sent + 1000
                sent += 1000
                survivors = [n for n in nodes if n.procs]
                deadline = time.monotonic() + 60
                while min(len(n.records()) for n in survivors) < sent:
                    assert time.monotonic() < deadline and mirror.poll() is None, (tmp_path / "mirror.log").read_text()
                    time.sleep(0.1)
                result = check_group([source_root, *(n.journal for n in survivors)], STREAM)
                assert result.violation is None and result.checked == sent, result.plain()
                if not victim_killed:
                    leader(etcd, nodes)[0].kill9()
    finally:
        if mirror is not None:
            mirror.send_signal(signal.SIGTERM)
            assert mirror.wait(15) == 0, (tmp_path / "mirror.log").read_text()
        source.stop()
        for node in nodes:
            node.kill9()


def test_a_node_whose_power_loss_left_a_hole_is_repaired_by_hand_and_rejoins_its_pair(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """The leader of a pair loses power while a burst is written and not yet synced, and the disk kept a later
    write and lost an earlier one ("reorder", tests/support/powerloss.py): a hole with valid batches after it.
    The follower takes over and confirms alone; the old leader refuses to start, naming `zeps journal repair`;
    once repaired it rejoins as a follower and catches up. No confirmed record lost, nothing journaled twice,
    and `zeps ha check` finds the two journals agreeing."""
    log = tmp_path / "strace.log"
    opts = ("--min-insync", "0", "--fsync", "group", "--fsync-ms", "200")  # a burst's writes stay unsynced
    nodes = [Node(tmp_path, f"n{i}", etcd.url, *opts) for i in range(2)]
    victim = nodes[0]
    plain_argv = victim.gateway_argv
    victim.gateway_argv = [*strace(log), *plain_argv]
    victim.start().wait_ready()
    assert leader(etcd, nodes)[0] is victim  # the only node yet
    nodes[1].start().wait_ready()
    pub = Publisher([n.ingest for n in nodes])
    try:
        confirmed = {n: pub.send(n) for n in range(1, 31)}
        wait_synced(nodes)
        burst = Publisher([victim.ingest])
        for half in (range(1001, 1021), range(1021, 1041)):  # two writes at least: one lost, one kept
            for n in half:
                raw = B.encode(0, [(0, b"k", f"record-{n}".encode())], producer=(burst.producer, n))
                if burst.sock is None:
                    assert burst._connect()
                assert burst.sock is not None
                burst.sock.send(P.encode(P.PublishBatch(raw)))
            time.sleep(0.02)
        kill_traced(victim.procs[0].pid)
        victim.kill9()
        burst.close()
        lost = Ledger.read(log, victim.journal).lose("reorder", random.Random(34))
        assert sum(lost.values()), "nothing was unsynced at the kill"

        confirmed |= {n: pub.send(n) for n in range(31, 61)}  # the follower took over
        assert leader(etcd, nodes)[0] is nodes[1]
        victim.gateway_argv = plain_argv
        victim.start()
        assert victim.procs[0].wait(30) == 1
        refused = victim.log.read_text()
        assert "journal corrupt" in refused and "zeps journal repair" in refused, refused[-2000:]
        victim.kill9()
        repair = subprocess.run([*ZEPS, "journal", "repair", str(victim.journal), "--yes"], capture_output=True,
                                timeout=60, check=False)  # fmt: skip
        assert b"discard from" in repair.stdout, repair.stdout + repair.stderr

        victim.start().wait_ready()
        confirmed |= {n: pub.send(n) for n in range(61, 91)}
        wait_synced(nodes)
        check(nodes, confirmed)
        ha = subprocess.run([*ZEPS, "ha", "check", *(a for n in nodes for a in ("--journal", str(n.journal)))],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert ha.returncode == 0, ha.stdout + ha.stderr
    finally:
        pub.close()
        for node in nodes:
            node.kill9()
