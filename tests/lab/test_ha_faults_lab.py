"""A fault harness in the spirit of Jepsen for a replicated gateway group (docs/ha.md), in a namespace lab:
etcd on a host of its own, two or three nodes multicasting on one group (`udp://`), a confirming Publisher
given every ingest and a Subscriber given the group and every sidecar on hosts of their own, 1.5% loss of
everything reaching the subscriber. Under that load, one fault at a time: the leader's gateway SIGSTOPped for
longer than its lease, the leader partitioned from everyone (on the wire; and by a firewall that refuses its
sends), the leader cut off from etcd only, a follower killed -9 and rejoining, etcd
killed -9 and restarted; each then healed. No node may exit on its own.

Each scenario ends with the checker: `zeps ha check` over every node's journal (one record per sequence, no
gap, no record twice), every confirmed record in the journal exactly once, and the subscriber got 1..head in
order with the journal's content at each sequence, every confirmed record among them; and whatever a deposed
leader (paused, partitioned, cut off from etcd) sent to the group after its successor's first datagram was
harmless: committed batches and older-epoch heartbeats (a plain socket on the subscriber's host decodes every
datagram and its source; see support.hafaults._check_stale for why it may send at all). Each
failover's outage (fault -> the subscriber receives a record published after it; the longest silence) is
printed (`-s`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.hafaults import (
    cut_leader_from_etcd,
    kill_follower,
    partition_leader,
    partitions,
    pause_leader,
    restart_etcd,
    run_group,
)

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

SCENARIOS = {  # name: (fault, nodes, whether another node must lead after it)
    "sigstop-leader": (pause_leader, 3, True),
    "partition-leader": (partition_leader, 3, True),
    "partition-leader-pair": (partition_leader, 2, True),
    "leader-cut-from-etcd": (cut_leader_from_etcd, 3, True),
    "kill-follower-pair": (kill_follower, 2, False),
    "restart-etcd": (restart_etcd, 3, False),
    # a partition the leader's own sockets see (iptables DROP in and out: EPERM at every send): it must not exit
    "partition-leader-firewall": (partitions("drop-both"), 3, True),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_group_survives(make_lab, tmp_path: Path, scenario: str) -> None:
    fault, count, failover = SCENARIOS[scenario]
    lab = make_lab(["etcd", *(f"n{i}" for i in range(1, count + 1)), "pub", "sub"])
    result = run_group(lab, tmp_path, count, fault if isinstance(fault, list) else [fault])
    epochs = result["epochs"]
    assert epochs == sorted(epochs), f"the epoch went backwards: {epochs}"
    if failover:
        assert epochs[-1] > epochs[0], f"no other leader took over: epochs {epochs}"
    summary, link = result["summary"], result["sub_link"]
    print(f"\n{scenario} ({count} nodes): {[what for _, _, what in result['faults']]}: outage {result['outages']} s; "
          f"{result['confirmed']} confirmed, head {result['head']}, epochs {epochs}; subscriber: "
          f"{link.dropped} of {link.seen} packets dropped, {summary['gaps_filled']} gaps filled, "
          f"{summary['from_replay']} records from a sidecar; cuts {result['cuts']}; {result['datagrams']} datagrams "
          f"heard; the deposed leader's after its successor's (s after the fault, payloads): {result['stale']}; "
          f"zeps ha check: "
          f"{result['check']}")  # fmt: skip
