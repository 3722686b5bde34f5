"""Promoting a mirror site that is a replicated group (docs/mirroring.md, "Promoting a group"), real processes on
loopback: a source site (gateway + sidecar), a mirror site of two nodes (gateway + sidecar each, etcd), `zeps
mirror` between them.

What is proved: the promotion is the group's, not the node's that took PROMOTE: the follower writes the mark
too; after the leader is killed -9, the new leader accepts publishers continuing the sequence and refuses the
old source's mirror with the promotion line; the same after both nodes are killed and started again in the
other order, one of them without its mark (it writes it again); the mark is in etcd and every node's journal.
The directory in etcd lists both nodes as the same copy of the same source throughout: mirrors of it (the
follower learns the source from the group), then promoted from it, also after both nodes restarted. A mirror
group restarted whole with no mirror running lists its source at once: each node keeps it beside its journal
(`mirror-source`), and the new leader records it for the group again (`<group>/sources/<stream>`), from which a
follower that lost its mark learns it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.etcd import EtcdProcess
from support.servers import STREAM, GatewayProcess, Side, free_port, journal_records, side

from gateway.client.publisher import Publisher
from gateway.journal.crosscheck import check_group
from gateway.journal.promotion import Promotion, read_promotion, read_source
from gateway.replication.group import group_key
from gateway.replication.promotions import promote, take_promotions
from gateway.transport.etcd import Etcd
from gateway.wire import announce as A

pytestmark = pytest.mark.timeout(300)
WAIT_S = 60.0
FENCED = "this site was promoted at sequence {}; it no longer accepts mirror batches"


class Node:
    """A node of the mirror site: `zeps replay` on a fixed port and `zeps gateway --etcd --node --mirror`."""

    def __init__(self, root: Path, name: str, etcd: str) -> None:
        self.name, self.root = name, root / name
        self.root.mkdir()
        self.side = Side(self.root, free_port())
        self.gateway: GatewayProcess | None = None
        self.args = ("--etcd", etcd, "--node", name, "--replay-endpoint", self.side.endpoint, "--mirror", STREAM)
        self.start()

    def start(self) -> None:
        if self.gateway is None:
            self.gateway = GatewayProcess(self.root, *self.args, streams=(STREAM,))
        else:
            self.gateway.restart()
        self.ingest = self.gateway.ingest

    def kill9(self) -> None:
        assert self.gateway is not None
        if self.gateway.proc.poll() is None:
            self.gateway.kill9()

    def close(self) -> None:
        self.kill9()
        self.side.stop()


def leader(etcd: Etcd, nodes: list[Node], timeout_s: float = 20.0) -> Node:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        holder = etcd.holder(f"{group_key([STREAM])}/leader")
        for node in nodes:
            if holder is not None and f'"node": "{node.name}"' in holder.value:
                return node
        time.sleep(0.05)
    raise AssertionError("no leader elected")


def zeps(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60)


def publish(endpoints: list[str], bodies: range) -> int:
    """Publish numbered records, confirmed (the Publisher tries each node in turn); the last sequence."""
    with Publisher(endpoints, STREAM, confirm=True, timeout=20) as pub:
        for i in bodies:
            pub.publish("k", b"record %d" % i)
        return pub.flush()


def wait_records(nodes: list[Node], count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while min(len(journal_records(n.root)) for n in nodes) < count:
        assert time.monotonic() < deadline, {n.name: len(journal_records(n.root)) for n in nodes}
        time.sleep(0.05)


def wait_copies(etcd: Etcd, nodes: list[Node], copy: str, source: str) -> None:
    """Until the directory in etcd lists exactly one gateway entry per node, each holding `copy` of `source` (an
    entry of a node killed -9 stays until its lease ends)."""
    want = [(n.name, copy, source) for n in nodes]
    deadline = time.monotonic() + WAIT_S
    while True:
        entries = [A.decode(e.value) for e in etcd.get_prefix(f"{A.ETCD_PREFIX}{STREAM}/gateway.")]
        listed = sorted((ann.node, ann.streams[0].copy, ann.streams[0].source) for ann in entries)
        if listed == want:
            return
        assert time.monotonic() < deadline, listed
        time.sleep(0.1)


def wait_mark(node: Node, head: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while (mark := read_promotion(node.root / STREAM)) is None or mark.head != head:
        assert time.monotonic() < deadline, f"node {node.name} has no promotion mark"
        time.sleep(0.05)


def source_and_site(tmp_path: Path) -> tuple[Path, Path, GatewayProcess]:
    """The source site's journal folder and gateway, and the mirror site's folder."""
    source_root, site = tmp_path / "source", tmp_path / "site"
    source_root.mkdir()
    site.mkdir()
    return source_root, site, GatewayProcess(source_root, streams=(STREAM,))


def start_group(site: Path, etcd_url: str, client: Etcd, nodes: list[Node]) -> None:
    """The mirror site's two nodes, into `nodes` (closed by the caller): n0 leads, then n1 joins as a follower."""
    nodes.append(Node(site, "n0", etcd_url))
    leader(client, nodes)
    nodes.append(Node(site, "n1", etcd_url))


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    server = EtcdProcess(tmp_path).start()
    yield server
    server.kill()


def test_a_promoted_group_stays_promoted_on_every_node_across_kills_and_restarts(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    source_root, site, source = source_and_site(tmp_path)
    nodes: list[Node] = []
    mirror_log = tmp_path / "mirror.log"
    mirror = None
    try:
        with side(source_root) as source_side:
            client = Etcd(etcd.url)
            start_group(site, etcd.url, client, nodes)  # n1: it never hears a mirror session before the promotion
            to = ",".join(n.ingest for n in nodes)
            publish([source.ingest], range(1, 301))
            with open(mirror_log, "ab") as log:
                mirror = subprocess.Popen([sys.executable, "-m", "gateway.cli", "mirror", "-v", "--source",
                                           source_side.endpoint, "--to", to, "--stream", STREAM, "--timeout", "2s"],
                                          stderr=log)  # fmt: skip
            wait_records(nodes, 300)
            wait_copies(client, nodes, A.MIRROR, source_side.endpoint)  # the follower's source: the group's

            # the source site disappears; the group is promoted (the probe finds it gone: no --force)
            source_side.kill9()
            done = zeps("mirror", "promote", "--stream", STREAM, "--gateway", to, "--source", source_side.endpoint)
            assert done.returncode == 0, done.stderr
            assert "promoted at sequence 300" in done.stdout
            promoted = f"300 {source_side.endpoint}"
            assert client.get(f"{group_key([STREAM])}/promoted/{STREAM}") == promoted, "the mark is the group's"
            first = leader(client, nodes)
            second = next(n for n in nodes if n is not first)
            assert read_promotion(first.root / STREAM) == Promotion(300, source_side.endpoint)
            wait_mark(second, 300)  # the follower learns it from the group
            wait_copies(client, nodes, A.PROMOTED, source_side.endpoint)
            assert publish([n.ingest for n in nodes], range(301, 311)) == 310

            # the leader killed -9: the follower, which never took PROMOTE, leads as a promoted site
            first.kill9()
            assert leader(client, [second]) is second
            assert publish([second.ingest], range(311, 321)) == 320, "the sequence continues at the new leader"
            source_side.start()  # the old source comes back and goes on
            publish([source.ingest], range(1001, 1101))
            assert mirror.wait(WAIT_S) == 1, mirror_log.read_text()
            assert FENCED.format(300) in mirror_log.read_text()
            again = zeps("mirror", "--source", source_side.endpoint, "--to", second.ingest, "--stream", STREAM)
            assert again.returncode == 1 and FENCED.format(300) in again.stderr, again.stderr

            # both killed -9, started again in the other order, one without its mark: whoever leads is promoted,
            # and the other writes the mark again as it follows
            second.kill9()
            (first.root / STREAM / "promoted").unlink()
            first.start()
            second.start()
            third = leader(client, nodes)
            assert publish([n.ingest for n in nodes], range(321, 331)) == 330
            again = zeps("mirror", "--source", source_side.endpoint, "--to", third.ingest, "--stream", STREAM)
            assert again.returncode == 1 and FENCED.format(300) in again.stderr, again.stderr
            wait_records(nodes, 330)
            for node in nodes:
                wait_mark(node, 300)
            wait_copies(client, nodes, A.PROMOTED, source_side.endpoint)  # from the marks: journal's, or etcd's
            result = check_group([n.root for n in nodes], STREAM)
            assert result.violation is None and result.checked == 330, result.plain()
            records = journal_records(nodes[0].root)
            assert [body for _, _, body in records[300:]] == [b"record %d" % i for i in range(301, 331)]
    finally:
        if mirror is not None and mirror.poll() is None:
            mirror.send_signal(signal.SIGTERM)
            mirror.wait(15)
        source.stop()
        for node in nodes:
            node.close()


def test_the_groups_promotions_are_written_only_by_its_leader_and_a_leaders_own_marks_join_them(
    etcd: EtcdProcess,
) -> None:
    client, prefix, leader_key = Etcd(etcd.url), "/zeps/ha/t/promoted/", "/zeps/ha/t/leader"
    epoch = client.create(leader_key, "n0", client.grant(5))
    assert epoch is not None
    assert promote(prefix, "s", Promotion(10), leader_key, epoch, client)
    assert not promote(prefix, "s", Promotion(11), leader_key, epoch + 1, client), "another epoch's is fenced out"
    own = {"s": Promotion(99), "t": Promotion(5, "tcp://a:1")}
    known = {"s": Promotion(10), "t": Promotion(5, "tcp://a:1")}
    assert take_promotions(prefix, own, leader_key, epoch, client) == known
    assert client.get(f"{prefix}t") == "5 tcp://a:1", "a mark of the new leader's own journal that etcd lacked"
    client.delete(leader_key)  # deposed: it reads the group's promotions, and adds none
    assert take_promotions(prefix, {"u": Promotion(1)}, leader_key, epoch, client) == known
    assert client.get(f"{prefix}u") is None


def wait_source(node: Node, source: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while read_source(node.root / STREAM) != source:
        assert time.monotonic() < deadline, f"node {node.name} keeps no mirror source"
        time.sleep(0.05)


def test_a_mirror_group_restarted_whole_lists_its_source_with_no_mirror_running(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    source_root, site, source = source_and_site(tmp_path)
    nodes: list[Node] = []
    mirror_log = tmp_path / "mirror.log"
    try:
        with side(source_root) as source_side:
            client = Etcd(etcd.url)
            start_group(site, etcd.url, client, nodes)
            publish([source.ingest], range(1, 101))
            with open(mirror_log, "ab") as log:
                mirror = subprocess.Popen([sys.executable, "-m", "gateway.cli", "mirror", "-v", "--source",
                                           source_side.endpoint, "--to", ",".join(n.ingest for n in nodes),
                                           "--stream", STREAM, "--timeout", "2s"], stderr=log)  # fmt: skip
            try:
                wait_records(nodes, 100)
                wait_copies(client, nodes, A.MIRROR, source_side.endpoint)
                for node in nodes:  # the leader's from its session, the follower's as learnt from the group
                    wait_source(node, source_side.endpoint)
            finally:
                mirror.send_signal(signal.SIGTERM)
                assert mirror.wait(15) == 0, mirror_log.read_text()

            # the whole group down, and the group's record of the source gone with it: no mirror runs
            for node in nodes:
                node.kill9()
            sources_key = f"{group_key([STREAM])}/sources/{STREAM}"
            client.delete(sources_key)
            for node in nodes:
                node.start()
            wait_copies(client, nodes, A.MIRROR, source_side.endpoint)  # from the marks, at once
            first = leader(client, nodes)
            deadline = time.monotonic() + WAIT_S
            while client.get(sources_key) != source_side.endpoint:  # the new leader records it for the group
                assert time.monotonic() < deadline, "the new leader did not record the source for the group"
                time.sleep(0.05)

            # a follower that lost its mark learns the source from the group, and keeps it again
            second = next(n for n in nodes if n is not first)
            second.kill9()
            (second.root / STREAM / "mirror-source").unlink()
            second.start()
            wait_source(second, source_side.endpoint)
            wait_copies(client, nodes, A.MIRROR, source_side.endpoint)
    finally:
        source.stop()
        for node in nodes:
            node.close()
