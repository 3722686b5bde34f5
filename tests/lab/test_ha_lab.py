"""Failover with multicast in a namespace lab: etcd on its own host, three nodes multicasting on one group, a
confirming publisher and a subscriber on hosts of their own (with and without 2% loss of the multicast reaching
the subscriber), the leader killed -9 (gateway and sidecar) twice
and restarted as a follower.

The checker: the subscriber got sequences 1..head in order with no gap and no loss, every confirmed record
exactly once and in publishing order, no record twice; part of the stream came over multicast; epochs grew.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.halab import MCAST_PORT, STREAM, WAIT_S, Node, leader, publish, start_etcd, subscribe

from gateway.tools.hagroup import outage, wait_confirmed
from netlab.procs import MP

pytestmark = [pytest.mark.lab, pytest.mark.timeout(180)]

KILLS = 2


@pytest.mark.parametrize("loss", [0.0, 0.02], ids=["no-loss", "2%-loss"])
@pytest.mark.parametrize("transport", ["udp", "epgm"])
def test_subscribers_ride_through_leader_kills_on_multicast(
    make_lab, tmp_path: Path, transport: str, loss: float
) -> None:
    lab = make_lab(["etcd", "n1", "n2", "n3", "pub", "sub"])
    if loss:  # of the multicast reaching the subscriber's host (the rule goes with the namespace)
        drop = f"INPUT -p udp --dport {MCAST_PORT} -m statistic --mode random --probability {loss} -j DROP"
        assert lab.popen("sub", ["iptables", "-I", *drop.split()]).wait(10) == 0
    etcd_proc, etcd = start_etcd(lab, tmp_path / "etcd")
    channel = f"{transport}://{lab.group(1)}:{MCAST_PORT}"
    nodes = {name: Node(lab, tmp_path, name, etcd, channel).start() for name in ("n1", "n2", "n3")}
    try:
        for node in nodes.values():
            node.wait_ready()
        ready, until, stop, progress = MP.Queue(), MP.Queue(), MP.Event(), MP.Value("i", 0)
        sub = lab.start("sub", subscribe, f"{transport}://{lab.host('sub').ip};{lab.group(1)}:{MCAST_PORT}",
                        [n.replay for n in nodes.values()], ready, until)  # fmt: skip
        ready.get(timeout=WAIT_S)
        pub = lab.start("pub", publish, [n.ingest for n in nodes.values()], stop, progress)
        epochs: list[int] = []
        failovers: list[float] = []
        kills: list[tuple[float, int]] = []
        for _ in range(KILLS):
            wait_confirmed(progress, progress.value + 100)
            name, epoch = lab.run("etcd", leader, etcd)
            epochs.append(epoch)
            before = progress.value
            nodes[name].kill9()
            killed = time.monotonic()
            kills.append((killed, before))
            wait_confirmed(progress, before + 5)  # confirms resumed: a successor leads
            failovers.append(time.monotonic() - killed)
            nodes[name].start().wait_ready()  # it rejoins as a follower
        wait_confirmed(progress, progress.value + 100)
        stop.set()
        confirmed, head = pub.result(WAIT_S)
        until.put(head)
        got = sub.result(WAIT_S + 10)
        status_run = lab.popen("etcd", [sys.executable, "-m", "gateway.cli", "ha", "status", "--etcd", etcd,
                                        "--stream", STREAM], stdout=subprocess.PIPE, text=True)  # fmt: skip
        status = json.loads(status_run.communicate(timeout=30)[0])
        epochs.append(lab.run("etcd", leader, etcd)[1])
    finally:
        for node in nodes.values():
            node.kill9()
        etcd_proc.kill()
        etcd_proc.wait(10)
    logs = "\n".join(f"--- {n.name}\n{n.log.read_text()[-3000:]}" for n in nodes.values())
    records = got["records"]
    assert not got["losses"], got["losses"]
    assert [seq for seq, _ in records] == list(range(1, head + 1)), f"a gap or a reordering; target {got['target']}"
    bodies = [body for _, body in records]
    assert len(set(bodies)) == len(bodies), "a record delivered twice"
    numbers = [int(body.removeprefix(b"record-")) for body in bodies]
    assert numbers == sorted(numbers), "records out of publishing order"
    missing = set(confirmed) - set(numbers)
    assert not missing, f"confirmed records never delivered: {sorted(missing)[:20]}\n{logs}"
    assert got["summary"]["from_live"] > 0, got["summary"]  # multicast carried part of the stream
    if loss and transport == "udp":
        assert got["summary"]["gaps_filled"] > 0, got["summary"]  # holes filled from a sidecar
    assert epochs == sorted(set(epochs)), f"the epoch did not grow with each failover: {epochs}"
    assert status["epoch"] == epochs[-1] and status["leader"] in nodes, status
    outages = [round(outage(got, *kill), 3) for kill in kills]
    print(f"{transport} loss {loss}: {len(confirmed)} confirmed, head {head}, kill -9 -> confirms again "
          f"{[round(f, 3) for f in failovers]} s, -> subscriber receives again {outages} s, epochs {epochs}, "
          f"subscriber {got['summary']}")  # fmt: skip


def test_starting_a_running_node_again_starts_nothing(make_lab, tmp_path: Path) -> None:
    """A second start of a running node (overlapping nemesis faults restart it) is a no-op: a second gateway would
    find the journal's writer lock held and exit, and pass for a process that exited on its own."""
    lab = make_lab(["etcd", "n1"])
    etcd_proc, etcd = start_etcd(lab, tmp_path / "etcd")
    node = Node(lab, tmp_path, "n1", etcd, f"udp://{lab.group(1)}:{MCAST_PORT}")
    try:
        running = node.start().wait_ready().procs
        assert node.start().wait_ready().procs is running
        assert all(p.poll() is None for p in running)
        node.kill9()
        assert node.start().wait_ready().procs is not running  # killed: started afresh
    finally:
        node.kill9()
        etcd_proc.kill()
        etcd_proc.wait(10)
