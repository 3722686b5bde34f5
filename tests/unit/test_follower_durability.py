"""A follower acknowledges what it wrote at once, and as durable only what is as durable as `--fsync` says
(docs/ha.md, "Guarantees"): the leader multicasts on the first, confirms on the second.

ReplicaCopier.copy runs for real on a real lane and journal with a real syncer thread; the link to the leader is
a stand-in that hands it batches and records, at the moment of each acknowledgement, what the journal had synced.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.journal import Durability, JournalWriter
from gateway.journal.syncer import Syncer
from gateway.replication.copier import ReplicaCopier
from gateway.sequencer.lane import Lane
from gateway.sequencer.metrics import GatewayMetrics
from gateway.sequencer.producers import ProducerTable
from gateway.wire import batch as B

STREAM = "s"


class Link:
    """What ReplicaCopier.copy needs of a Follower: the leader's batches, and where the acks go."""

    def __init__(self, batches: list[B.Batch], writer: JournalWriter) -> None:
        self._batches, self._writer = batches, writer
        self.acks: list[tuple[int, int, int]] = []  # (written, durable, synced then)

    def batches(self, stream: str) -> Iterator[B.Batch]:
        yield from self._batches
        self._batches = []  # handed over once, as the leader's sidecar does

    def pushes(self, stream: str) -> Iterator[B.Batch]:
        yield from ()  # this leader pushes nothing: the sidecar's tail alone

    def tailing(self, stream: str) -> bool:
        return True

    def journaled(self, stream: str, written: int, durable: int) -> None:
        if not self.acks or self.acks[-1][:2] != (written, durable):
            self.acks.append((written, durable, self._writer.synced_seq))


def leader_batches(count: int) -> list[B.Batch]:
    out, seq = [], 1
    for i in range(count):
        raw = B.resequence(B.Batch.parse(B.encode(0, [(0, b"k", b"r%d" % i)] * 3)), seq, 10**18 + i)
        out.append(B.Batch.parse(raw))
        seq += 3
    return out


def reopen(stream: str) -> None:
    raise AssertionError("a copy never cuts")


@pytest.mark.parametrize("mode", ["always", "group", "never"])
def test_a_follower_acks_writes_at_once_and_durability_only_once_true(tmp_path: Path, mode: str) -> None:
    durability = Durability(mode, group_ms=20, group_bytes=1 << 30)
    syncer = Syncer()
    writer = JournalWriter.open(tmp_path, STREAM, durability=durability, syncer=syncer)
    try:
        link = Link(leader_batches(4), writer)
        lane = Lane(STREAM, writer, ProducerTable(10**12, 100))
        copied = {STREAM: GatewayMetrics([STREAM]).streams[STREAM].copied}
        copier = ReplicaCopier(tmp_path, {STREAM: lane}, {}, reopen, copied)
        copier.copy(link, STREAM)  # type: ignore[arg-type]
        assert link.acks[0][0] == 12  # all the drain wrote, acknowledged before any sync of it has to end
        deadline = time.monotonic() + 5.0
        while link.acks[-1][1] < 12 and time.monotonic() < deadline:
            time.sleep(0.001)
            writer.maybe_sync()  # the loop's next passes: the group commit starts when due, on the syncer,
            copier.copy(link, STREAM)  # type: ignore[arg-type]  # and its end is acknowledged
        assert link.acks[-1][:2] == (12, 12)
        for written, durable, synced in link.acks:
            assert written == 12
            assert durable <= synced or mode == "never", f"acked {durable} as durable with {synced} on disk ({mode})"
        if mode == "group":
            assert link.acks[0][1] == 0  # the write was acknowledged before its fdatasync (on the syncer) ended
    finally:
        writer.close()
        syncer.close()
