"""A node that rejoins its group cuts its journal back to where its leader's agrees (docs/ha.md, "Epochs"):
found in few comparisons however long the divergence, and cut once.

HaNode._reconcile runs for real on a real journal; the leader is a stand-in that says whether it holds a batch
of ours (as Follower.matches does, over its sidecar) and counts how often it was asked.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.journal import JournalReader, JournalWriter
from gateway.server.ha import HaNode
from gateway.wire import batch as B

STREAM = "s"
BATCHES, SIZE = 200, 3  # our journal: 200 batches of 3 records


class Leader:
    """Holds our first `agreed` records; asked through `matches`, as the follower asks the leader's sidecar."""

    def __init__(self, agreed: int) -> None:
        self.agreed, self.asked = agreed, 0
        self.leader = SimpleNamespace(node="lead")

    def matches(self, stream: str, own: B.Batch) -> bool:
        self.asked += 1
        return own.last_seq <= self.agreed


def node(tmp_path: Path) -> HaNode:
    writer = JournalWriter.open(tmp_path, STREAM)
    for i in range(BATCHES):
        writer.append(B.Batch.parse(B.encode(0, [(0, b"k", b"r%d" % i)] * SIZE)))
    lanes = {STREAM: SimpleNamespace(writer=writer)}

    def reopen(stream: str) -> None:
        lanes[stream].writer = JournalWriter.open(tmp_path, stream)

    mark = SimpleNamespace(value=0, lower=lambda seq: None)
    gw = SimpleNamespace(lanes=lanes, marks={STREAM: mark}, config=SimpleNamespace(journal=tmp_path), reopen=reopen)
    ha = HaNode.__new__(HaNode)  # only what _reconcile uses: the gateway's lanes, marks, journal and reopen
    ha.gw = gw  # type: ignore[assignment]
    return ha


@pytest.mark.parametrize("kept_batches", [BATCHES, BATCHES - 1, BATCHES - 5, 77, 1, 0])
def test_a_rejoining_node_cuts_once_where_the_journals_part(tmp_path: Path, kept_batches: int) -> None:
    ha, leader = node(tmp_path), Leader(kept_batches * SIZE)
    try:
        ha._reconcile(leader, STREAM)  # type: ignore[arg-type]
        head = ha.gw.lanes[STREAM].writer.last_seq
        assert head == kept_batches * SIZE
        assert JournalReader(tmp_path, STREAM).last_seq == head
        if kept_batches == BATCHES:
            assert leader.asked == 1  # the usual case: our last batch is the leader's too
        else:
            assert leader.asked <= 2 * math.ceil(math.log2(BATCHES * SIZE)) + 2, leader.asked
    finally:
        ha.gw.lanes[STREAM].writer.close()
