"""Site mirroring from a replicated source (docs/mirroring.md): `zeps mirror` given every sidecar of a source
group (docs/ha.md), the group's leader killed -9 mid-run. Real processes on loopback, a real etcd.

What is proved: the mirror moves to another sidecar of the group and goes on, and so does a mirror killed -9
and restarted afterwards with the former leader's sidecar first; the mirror site's journal equals
the survivors' over the whole range (`zeps ha check` across the sites); a subscriber at the mirror site gets
1..N exactly once, in order. Two ways to lose the leader: the whole node (gateway and its sidecar), and the
gateway alone, whose sidecar lives on serving a journal that no longer grows: the mirror must not stay there.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.etcd import EtcdProcess
from support.servers import STREAM, GatewayProcess, Side, assert_exactly_once, free_port, journal_records

from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.journal import JournalReader
from gateway.replication.group import group_key
from gateway.transport.etcd import Etcd

pytestmark = pytest.mark.timeout(240)

WAIT_S = 60.0
NODES = 3


@dataclass
class GroupNode:
    """A node of the source group: `zeps gateway --etcd --node` and `zeps replay` on its own journal."""

    name: str
    journal: Path
    gateway: GatewayProcess
    sidecar: Side


def start_node(tmp_path: Path, etcd: EtcdProcess, name: str) -> GroupNode:
    journal = tmp_path / name
    journal.mkdir()
    sidecar = Side(journal, free_port(), "--tail-poll-ms", "1")
    gateway = GatewayProcess(journal, "--etcd", etcd.url, "--node", name, "--replay-endpoint", sidecar.endpoint,
                             "--min-insync", "1", "--linger-ms", "0", streams=(STREAM,))  # fmt: skip
    return GroupNode(name, journal, gateway, sidecar)


def leader(etcd: EtcdProcess, nodes: list[GroupNode]) -> GroupNode:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        holder = Etcd(etcd.url).holder(f"{group_key([STREAM])}/leader")
        found = [n for n in nodes if holder is not None and f'"node": "{n.name}"' in holder.value]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("no leader elected")


def head(root: Path) -> int:
    return JournalReader(root, STREAM).last_seq


@pytest.mark.parametrize("lost", ["node", "gateway"])
def test_the_mirror_follows_a_source_group_across_its_leaders_kill_9(
    etcd: EtcdProcess, tmp_path: Path, lost: str
) -> None:
    nodes: list[GroupNode] = []
    b_root = tmp_path / "b"
    b_root.mkdir()
    b = GatewayProcess(b_root, "--mirror", STREAM, streams=(STREAM,))
    b_side = Side(b_root, free_port())
    mirror = None
    bodies: list[bytes] = []
    try:
        nodes = [start_node(tmp_path, etcd, f"n{i}") for i in range(NODES)]
        first = leader(etcd, nodes)
        with Publisher([n.gateway.ingest for n in nodes], STREAM, confirm=True, timeout=30) as pub:

            def publish(count: int) -> None:
                for _ in range(count):
                    bodies.append(b"record %d" % (len(bodies) + 1))
                    pub.publish("k", bodies[-1])
                pub.flush()

            publish(3000)
            # The leader's sidecar first: the one the mirror reads is the one that goes.
            sources = [first.sidecar.endpoint] + [n.sidecar.endpoint for n in nodes if n is not first]
            log = open(tmp_path / "mirror.log", "ab")  # noqa: SIM115 - written until it ends
            argv = [sys.executable, "-m", "gateway.cli", "mirror", "-v", "--source", ",".join(sources),
                    "--to", b.ingest, "--stream", STREAM, "--timeout", "2s", "--log-every", "1s"]  # fmt: skip
            mirror = subprocess.Popen(argv, stderr=log)
            deadline = time.monotonic() + WAIT_S
            while head(b_root) < 1000:
                assert time.monotonic() < deadline and mirror.poll() is None, mirror_log(tmp_path)
                time.sleep(0.02)
            publish(1000)  # live, while the mirror may still be catching up
            first.gateway.kill9()
            if lost == "node":
                first.sidecar.kill9()
            for _ in range(4):  # the live tail, from the next leader
                publish(500)
            wait_mirrored(b_root, len(bodies), mirror, tmp_path)
            # Restarted with the same sidecars, the former leader's first: it no longer holds the mirror
            # site's head (if it still answers), which is no fork here: the mirror goes on from the next one.
            mirror.kill()
            mirror.wait(5)
            publish(500)
            mirror = subprocess.Popen(argv, stderr=log)
            publish(500)
        wait_mirrored(b_root, len(bodies), mirror, tmp_path)
        survivors = [n for n in nodes if n is not first]

        check = zeps_ha_check([b_root, *(n.journal for n in survivors)])
        assert check.returncode == 0, check.stderr
        compared = json.loads(check.stdout)
        assert compared["checked"] == len(bodies), compared
        assert_exactly_once(b_root, bodies)
        assert journal_records(b_root) == journal_records(survivors[0].journal)[: len(bodies)]
        with Subscriber(STREAM, replay=b_side.endpoint, start="earliest") as sub:
            got = []
            while len(got) < len(bodies) and (rec := sub.next(timeout=10.0)) is not None:
                got.append((rec.seq, bytes(rec.body)))
        assert got == list(enumerate(bodies, 1))
    finally:
        if mirror is not None and mirror.poll() is None:
            mirror.send_signal(signal.SIGTERM)
            assert mirror.wait(15) == 0, mirror_log(tmp_path)
        for node in nodes:
            node.gateway.stop()
            node.sidecar.stop()
        b.stop()
        b_side.stop()


def wait_mirrored(b_root: Path, n: int, mirror: subprocess.Popen, tmp_path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while head(b_root) < n:
        assert time.monotonic() < deadline and mirror.poll() is None, (head(b_root), mirror_log(tmp_path))
        time.sleep(0.05)


def mirror_log(tmp_path: Path) -> str:
    return (tmp_path / "mirror.log").read_text(errors="replace")


def zeps_ha_check(journals: list[Path]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "gateway.cli", "ha", "check", "--stream", STREAM]
    for journal in journals:
        argv += ["--journal", str(journal)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)
