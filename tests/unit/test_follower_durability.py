"""A follower acknowledges a batch only once it is as durable as `--fsync` says (docs/ha.md, "Guarantees").

HaNode.copy runs for real on a real journal; the link to the leader is a stand-in that hands it batches and
records, at the moment of each acknowledgement, what the journal had synced.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.journal import Durability, JournalWriter
from gateway.server.ha import HaNode
from gateway.server.producers import ProducerTable
from gateway.wire import batch as B

STREAM = "s"


class Link:
    """What HaNode.copy needs of a Follower: the leader's batches, and where the acks go."""

    def __init__(self, batches: list[B.Batch], writer: JournalWriter) -> None:
        self._batches, self._writer = batches, writer
        self.acks: list[tuple[int, int]] = []  # (acked, synced then)

    def batches(self, stream: str) -> Iterator[B.Batch]:
        yield from self._batches

    def journaled(self, stream: str, seq: int) -> None:
        self.acks.append((seq, self._writer.synced_seq))


def leader_batches(count: int) -> list[B.Batch]:
    out, seq = [], 1
    for i in range(count):
        raw = B.resequence(B.Batch.parse(B.encode(0, [(0, b"k", b"r%d" % i)] * 3)), seq, 10**18 + i)
        out.append(B.Batch.parse(raw))
        seq += 3
    return out


@pytest.mark.parametrize("mode", ["always", "group", "never"])
def test_a_follower_acks_only_what_is_durable_as_configured(tmp_path: Path, mode: str) -> None:
    durability = Durability(mode, group_ms=60_000, group_bytes=1 << 30)  # group: no timer would sync in time
    writer = JournalWriter.open(tmp_path, STREAM, durability=durability)
    try:
        link = Link(leader_batches(4), writer)
        lane = SimpleNamespace(writer=writer, producers=ProducerTable(10**12, 100))
        gw = SimpleNamespace(lanes={STREAM: lane}, config=SimpleNamespace(durability=durability))
        node = HaNode.__new__(HaNode)  # only what copy() uses: the gateway's lanes and config, the link
        node.gw, node.follower = gw, link  # type: ignore[assignment]
        node.copy(STREAM)
        assert [seq for seq, _ in link.acks] == [12]  # one ack for all the drain journaled
        for acked, synced in link.acks:
            assert synced >= acked or mode == "never", f"acked {acked} with only {synced} on disk ({mode})"
    finally:
        writer.close()
