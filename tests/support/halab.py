"""A replicated gateway group in a namespace lab for the tests: gateway.tools.hagroup with the tests' stream
("ha") and defaults. Hosts: "etcd", the nodes, a publisher and a subscriber host. Functions run in lab hosts
are module-level (Lab.start pickles them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.replication.group import group_key
from gateway.tools import hagroup
from gateway.tools.hagroup import INGEST_PORT, MCAST_PORT, REPLAY_PORT, WAIT_S, start_etcd, wait_healthy, zeps
from netlab import Lab

__all__ = ["INGEST_PORT", "LEADER_KEY", "MCAST_PORT", "REPLAY_PORT", "STREAM", "WAIT_S", "Node", "leader",
           "publish", "start_etcd", "subscribe", "wait_healthy", "zeps"]  # fmt: skip

STREAM = "ha"
LEADER_KEY = f"{group_key([STREAM])}/leader"


class Node(hagroup.Node):
    """A node of the tests' group: stream "ha", `--min-insync 1`, verbose logs."""

    def __init__(self, lab: Lab, root: Path, name: str, etcd: str, channel: str) -> None:
        super().__init__(lab, root, name, etcd, channel, stream=STREAM)


def leader(etcd: str, timeout: float = 15.0) -> tuple[str, int]:
    """Inside a lab host: (the leader node's name, its epoch), once there is one."""
    return hagroup.leader(etcd, STREAM, timeout)


def publish(ingests: list[str], stop: Any, progress: Any, limit: int = 5_000) -> tuple[list[int], int]:
    """hagroup.publish_confirmed on the tests' stream."""
    return hagroup.publish_confirmed(ingests, STREAM, stop, progress, limit)


def subscribe(multicast: str, replays: list[str], ready: Any, until: Any) -> dict[str, Any]:
    """hagroup.subscribe_all on the tests' stream."""
    return hagroup.subscribe_all(multicast, replays, STREAM, ready, until)
