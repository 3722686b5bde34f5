"""Faults for a replicated gateway group in a namespace lab (tests/lab/test_ha_faults_lab.py), on top of
support.halab: a group under load (a confirming Publisher given every ingest, a Subscriber given the group
and every sidecar, loss at the subscriber), one fault at a time, and the checks every scenario ends with.

A fault is a callable given the running group; it returns when the group is healed. The run measures each
fault's outage as the subscriber saw it (`_outage`), and hears every datagram sent to the group from the
subscriber's host, to judge what a deposed leader sent after its successor took over (`_check_stale`).
"""

from __future__ import annotations

import functools
import itertools
import json
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.halab import MCAST_PORT, STREAM, WAIT_S, Node, leader, publish, start_etcd, subscribe
from support.servers import journal_records

from gateway.errors import McastError
from gateway.wire.batch import Batch
from gateway.wire.framing import frame_header
from gateway.wire.heartbeat import Heartbeat, parse_payload
from netlab import Impairment, Lab, impair
from netlab.impair.cuts import cut
from netlab.procs import MP

LOSS_PCT = 1.5  # of everything reaching the subscriber's host (multicast and its sidecar connections)
OUTAGE_WINDOW_S = 10.0  # a fault's outage is looked for this long after it (its hold included)
LEASE_S = 1.0  # the gateway's etcd lease (gateway.replication.elector.DEFAULT_TTL_S)


class FaultNode(Node):
    """halab's node, plus pausing its gateway."""

    def signal_gateway(self, sig: int) -> None:
        self.procs[0].send_signal(sig)


@dataclass
class Group:
    """A running group in a lab: etcd, nodes, a publisher and a subscriber host, and what the run measured."""

    lab: Lab
    root: Path
    nodes: dict[str, FaultNode]
    etcd_proc: subprocess.Popen
    etcd: str
    progress: Any  # MP.Value: records the publisher has had confirmed
    faults: list[tuple[float, int, str]] = field(default_factory=list)  # (when, confirmed then, what)
    deposed: list[tuple[float, str]] = field(default_factory=list)  # (when, the leader a fault deposes)

    def leader(self) -> tuple[str, int]:
        return self.lab.run("etcd", leader, self.etcd)

    def wait_progress(self, beyond: int, timeout: float = WAIT_S) -> float:
        """Until the publisher has had more than `beyond` records confirmed; when that was (time.monotonic)."""
        deadline = time.monotonic() + timeout
        while self.progress.value <= beyond:
            assert time.monotonic() < deadline, f"no record confirmed past {beyond} within {timeout} s\n{self.logs()}"
            time.sleep(0.01)
        return time.monotonic()

    def fault(self, what: str) -> float:
        """Mark a fault starting now; returns its time."""
        now = time.monotonic()
        self.faults.append((now, self.progress.value, what))
        return now

    def depose(self, name: str) -> None:
        """Note that the fault starting now must end `name`'s leadership: it may multicast nothing once another
        node has (checked on what reached the subscriber's host)."""
        self.deposed.append((time.monotonic(), name))

    def restart_etcd(self) -> None:
        """kill -9 of etcd, then etcd again on the same data directory."""
        self.etcd_proc.kill()
        self.etcd_proc.wait(10)
        self.etcd_proc, _ = start_etcd(self.lab, self.root / "etcd")

    def cut_from_etcd(self, name: str, cut: bool) -> None:
        """Drop (or stop dropping) everything between node `name` and etcd, in the node's namespace only: the
        rules go with the namespace when the lab goes down."""
        etcd_ip = self.lab.host("etcd").ip
        op = "-I" if cut else "-D"
        for rule in (["INPUT", "-s", etcd_ip, "-j", "DROP"], ["OUTPUT", "-d", etcd_ip, "-j", "DROP"]):
            argv = ["iptables", "-w", "10", op, *rule]
            assert self.lab.popen(name, argv).wait(15) == 0, argv

    def assert_running(self) -> None:
        """No node's gateway or sidecar has exited on its own (a fault that kills one starts it again)."""
        exited = {n.name: [p.returncode for p in n.procs if p.poll() is not None] for n in self.nodes.values()}
        assert not any(exited.values()), f"exited on their own (exit statuses): {exited}\n{self.logs()}"

    def logs(self) -> str:
        return "\n".join(f"--- {n.name}\n{n.log.read_text()[-3000:]}" for n in self.nodes.values())

    def wait_synced(self, timeout: float = WAIT_S) -> int:
        """Until every node's journal holds the same head (the followers caught up); that head."""
        deadline = time.monotonic() + timeout
        while True:
            heads = {name: _head(node.journal) for name, node in self.nodes.items()}
            if len(set(heads.values())) == 1:
                return next(iter(heads.values()))
            assert time.monotonic() < deadline, f"journals not in step within {timeout} s: {heads}\n{self.logs()}"
            time.sleep(0.05)


def _head(journal: Path) -> int:
    from gateway.journal import JournalReader

    return JournalReader(journal, STREAM).last_seq if (journal / STREAM).is_dir() else 0


def run_group(
    lab: Lab, root: Path, count: int, faults: list[Callable[[Group], None]], transport: str = "udp"
) -> dict[str, Any]:
    """Start etcd and `count` nodes, a subscriber and a publisher; after 100 confirmed records, each fault in
    turn (and 100 more records after each); then stop the publisher, let the subscriber reach its head, and
    check everything. Returns what was measured."""
    impair.impair(lab, "sub", Impairment(loss_pct=LOSS_PCT))
    etcd_proc, etcd = start_etcd(lab, root / "etcd")
    channel = f"{transport}://{lab.group(1)}:{MCAST_PORT}"
    names = [f"n{i}" for i in range(1, count + 1)]
    nodes = {name: FaultNode(lab, root, name, etcd, channel).start() for name in names}
    group = Group(lab, root, nodes, etcd_proc, etcd, MP.Value("i", 0))
    sub = pub = heard = None
    try:
        for node in nodes.values():
            node.wait_ready()
        ready, until, stop = MP.Queue(), MP.Queue(), MP.Event()
        sub = lab.start("sub", subscribe, f"{transport}://{lab.host('sub').ip};{lab.group(1)}:{MCAST_PORT}",
                        [n.replay for n in nodes.values()], ready, until)  # fmt: skip
        ready.get(timeout=WAIT_S)
        heard = lab.start("sub", listen, lab.group(1), MCAST_PORT, lab.host("sub").ip, stop)
        pub = lab.start("pub", publish, [n.ingest for n in nodes.values()], stop, group.progress)
        epochs = []
        for fault in faults:
            group.wait_progress(group.progress.value + 100)
            epochs.append(group.leader()[1])
            fault(group)
            group.assert_running()
        group.wait_progress(group.progress.value + 100)
        stop.set()
        confirmed, head = pub.result(WAIT_S)
        until.put(head)
        got = sub.result(WAIT_S + 10)
        senders = heard.result(WAIT_S)
        final_leader, final_epoch = group.leader()
        epochs.append(final_epoch)
        synced = group.wait_synced()
        link = impair.counters(lab, "sub")
    finally:
        for proc in (pub, sub, heard):
            if proc is not None:
                proc.terminate()
        for node in nodes.values():
            node.kill9()
        group.etcd_proc.kill()
        group.etcd_proc.wait(10)
    check = _zeps_ha_check([n.journal for n in nodes.values()])
    assert check["ok"] and check["checked"] == synced, f"{check}\n{group.logs()}"
    journal = journal_records(nodes[names[0]].journal, STREAM)  # the same on every node: the checker proved it
    _check_journal(journal, confirmed, head)
    _check_subscriber(got, journal, confirmed, head, group.logs())
    stale = {
        name: _check_stale(senders, when, lab.host(name).ip, journal, final_epoch)
        for when, name in group.deposed
        if name != final_leader
    }
    outages = [_outage(got, when, before) for when, before, _ in group.faults]
    return {"confirmed": len(confirmed), "head": head, "epochs": epochs, "outages": outages, "faults": group.faults,
            "summary": got["summary"], "check": check, "sub_link": link, "cuts": _cuts(group),
            "datagrams": len(senders), "stale": stale}  # fmt: skip


def listen(group: str, port: int, interface: str, stop: Any) -> list[tuple[str, float, list[tuple[Any, ...]]]]:
    """In a lab host: every datagram sent to the multicast group until `stop` is set (at most 300 s, 10^6
    datagrams): (source address, time.monotonic(), what it carried: ("batch", first, last, bytes) or
    ("heartbeat", head, epoch))."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # beside the subscriber's socket
    sock.bind((group, port))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(group) + socket.inet_aton(interface))
    sock.settimeout(0.1)
    heard: list[tuple[str, float, list[tuple[Any, ...]]]] = []
    deadline = time.monotonic() + 300
    with sock:
        while not stop.is_set() and time.monotonic() < deadline and len(heard) < 1_000_000:
            try:
                data, (source, _) = sock.recvfrom(65536)
            except TimeoutError:
                continue
            heard.append((source, time.monotonic(), _payloads(data)))
    return heard


def _payloads(data: bytes) -> list[tuple[Any, ...]]:
    """The batches and heartbeats in one udp:// datagram (its ZeroMQ frames; topics are skipped)."""
    out: list[tuple[Any, ...]] = []
    pos = 0
    while (header := frame_header(data, pos, len(data))) is not None:
        _, _, size, head = header
        frame = data[pos + head : pos + head + size]
        pos += head + size
        try:
            payload = parse_payload(frame)
        except McastError:
            continue
        if isinstance(payload, Heartbeat):
            out.append(("heartbeat", payload.head, payload.epoch))
        else:
            out.append(("batch", payload.first_seq, payload.last_seq, bytes(frame)))
    return out


def _check_stale(senders: list, since: float, deposed: str, journal: list, epoch: int) -> list[tuple]:
    """What `deposed` sent to the group after another node first did, from `since` on: (seconds after `since`,
    payload summaries). A deposed leader may still send for as long as its own authority clock runs (when a
    follower that suspected it revoked its lease, the successor is elected before that clock runs out), so
    what it sends then must be harmless: batches the group committed (the records the journal holds there)
    and heartbeats of its older epoch announcing no more than the group's head."""
    successor = next((t for source, t, _ in senders if t > since and source != deposed), None)
    late = [(t, payloads) for source, t, payloads in senders if source == deposed and successor and t > successor]
    content = {seq: body for seq, _, body in journal}
    for _, payloads in late:
        for payload in payloads:
            if payload[0] == "heartbeat":
                assert payload[2] < epoch and payload[1] <= len(journal), f"a stale heartbeat {payload}"
            else:
                bodies = [(r.seq, r.body) for r in Batch.parse(payload[3]).records()]
                assert all(content.get(seq) == body for seq, body in bodies), f"a stale batch not committed: {bodies}"
    return [(round(t - since, 3), [p[:3] for p in payloads]) for t, payloads in late]


def _cuts(group: Group) -> list[str]:
    """What nodes cut from their journals on rejoining (their logs' "dropped A..B" lines)."""
    return [f"{n.name}: {line.split('ha: ', 1)[-1]}" for n in group.nodes.values()
            for line in n.log.read_text().splitlines() if "which leader" in line]  # fmt: skip


def _zeps_ha_check(journals: list[Path]) -> dict[str, Any]:
    argv = [sys.executable, "-m", "gateway.cli", "ha", "check", "--stream", STREAM]
    for journal in journals:
        argv += ["--journal", str(journal)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"zeps ha check: exit {run.returncode}\n{run.stdout}{run.stderr}"
    return json.loads(run.stdout)


def _check_journal(journal: list[tuple[int, str, bytes]], confirmed: list[int], head: int) -> None:
    """Every confirmed record is in the journal exactly once; the journal goes at least to the last confirm."""
    assert [seq for seq, _, _ in journal] == list(range(1, len(journal) + 1)) and len(journal) >= head
    counts = Counter(body for _, _, body in journal)
    twice = [body for body, n in counts.items() if n > 1]
    assert not twice, f"records journaled twice: {twice[:5]}"
    missing = [i for i in confirmed if counts[f"record-{i}".encode()] != 1]
    assert not missing, f"confirmed records not in the journal: {missing[:20]}"


def _check_subscriber(
    got: dict[str, Any], journal: list[tuple[int, str, bytes]], confirmed: list[int], head: int, logs: str
) -> None:
    """The subscriber got 1..head in order, each with the journal's content at that sequence, and every
    confirmed record (all at or below the last confirmed sequence)."""
    records = got["records"]
    assert not got["losses"], got["losses"]
    seqs = [seq for seq, _ in records]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= head, f"a gap or a reordering: {got['target']}"
    content = {seq: body for seq, _, body in journal}
    wrong = [(seq, body, content.get(seq)) for seq, body in records if content.get(seq) != body]
    assert not wrong, f"delivered records the group's journal does not hold there: {wrong[:5]}\n{logs}"
    delivered = {body for _, body in records}
    missing = [i for i in confirmed if f"record-{i}".encode() not in delivered]
    assert not missing, f"confirmed records never delivered: {missing[:20]}\n{logs}"


def _outage(got: dict[str, Any], when: float, confirmed_before: int) -> dict[str, float]:
    """A fault's outage as the subscriber saw it: `first_new`, from the fault to its first delivery of a record
    published after it (one past the five the publisher had in flight, which the old leader may have
    confirmed); `silence`, the longest wait between deliveries from the fault to OUTAGE_WINDOW_S after it, and
    `silence_from`, when it began (seconds after the fault)."""
    deliveries = list(zip(got["records"], got["arrived"], strict=True))
    after = (t for (_, body), t in deliveries if int(body.removeprefix(b"record-")) > confirmed_before + 5)
    times = [when] + [t for _, t in deliveries if when < t <= when + OUTAGE_WINDOW_S]
    silence, since = max(((b - a, a - when) for a, b in itertools.pairwise(times)), default=(float("inf"), 0.0))
    first_new = next(after, float("inf")) - when
    return {"first_new": round(first_new, 3), "silence": round(silence, 3), "silence_from": round(since, 3)}


# -- faults: each returns with the group healed ------------------------------------------------------------------


def pause_leader(group: Group) -> None:
    """SIGSTOP of the leader's gateway for 2.5 leases, then SIGCONT."""
    name, epoch = group.leader()
    group.fault(f"SIGSTOP {name} (epoch {epoch}) for {2.5 * LEASE_S} s")
    group.depose(name)
    group.nodes[name].signal_gateway(signal.SIGSTOP)
    time.sleep(2.5 * LEASE_S)
    group.nodes[name].signal_gateway(signal.SIGCONT)


def partition_leader(group: Group, hold_s: float = 3.0, kind: str = "ebpf") -> None:
    """The leader's host cut off from everyone (etcd, followers, clients) for `hold_s`, then healed; cut the
    `kind` way (netlab.impair.cuts: on the wire, by iptables DROP or REJECT, its routes removed, its link down)."""
    name, epoch = group.leader()
    group.fault(f"partition {name} (epoch {epoch}, {kind}) from everyone for {hold_s} s")
    group.depose(name)
    with cut(group.lab, name, kind):
        time.sleep(hold_s)


def partitions(*kinds: str) -> list[Callable[[Group], None]]:
    """One `partition_leader` fault per kind."""
    return [functools.partial(partition_leader, kind=kind) for kind in kinds]


def kill_leader(group: Group) -> None:
    """kill -9 of the leader (gateway and sidecar); it starts again and rejoins as a follower."""
    name, epoch = group.leader()
    group.fault(f"kill -9 leader {name} (epoch {epoch})")
    group.depose(name)
    group.nodes[name].kill9()
    time.sleep(0.5)
    group.nodes[name].start().wait_ready()


def cut_leader_from_etcd(group: Group, hold_s: float = 3.0) -> None:
    """The leader cut off from etcd only (clients and followers still reach it) for `hold_s`, then healed."""
    name, epoch = group.leader()
    group.fault(f"cut {name} (epoch {epoch}) from etcd for {hold_s} s")
    group.depose(name)
    group.cut_from_etcd(name, True)
    try:
        time.sleep(hold_s)
    finally:
        group.cut_from_etcd(name, False)


def kill_follower(group: Group) -> None:
    """kill -9 of a follower (gateway and sidecar); it starts again and rejoins."""
    name, _ = group.leader()
    victim = next(n for n in group.nodes if n != name)
    group.fault(f"kill -9 follower {victim}")
    group.nodes[victim].kill9()
    time.sleep(0.5)
    group.nodes[victim].start().wait_ready()


def restart_etcd(group: Group) -> None:
    """kill -9 of etcd while publishing, then etcd again on its data directory."""
    group.fault("kill -9 etcd, restart")
    group.restart_etcd()
