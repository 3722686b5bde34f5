"""A node that rejoins its group cuts its journal back to where its leader's agrees (docs/ha.md, "Epochs"):
found in few comparisons however long the divergence, and cut once.

ReplicaCopier.cut runs for real on a real lane, journal and committed mark; the leader is a stand-in that says
whether it holds a batch of ours (as Follower.ask and answer do, over its sidecar), each answer only at the
second look (the cut goes on over the loop's turns and never waits), and counts how often it was asked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.journal import JournalReader, JournalWriter
from gateway.journal.committed import CommittedMark
from gateway.journal.layout import FrameScanner, seg_path
from gateway.journal.tools import truncate_at
from gateway.replication.copier import Agreement, ReplicaCopier
from gateway.replication.follower import Question
from gateway.sequencer.lane import Lane
from gateway.sequencer.metrics import GatewayMetrics
from gateway.sequencer.producers import ProducerTable
from gateway.wire import batch as B
from gateway.wire.batch import HEADER

STREAM = "s"
BATCHES, SIZE = 200, 3  # our journal: 200 batches of 3 records


class Leader:
    """Holds our first `agreed` records; asked as the follower asks the leader's sidecar (ask, then answer), it
    answers each question at its second look. `closed`: how often the copier closed the question connection (its
    socket leaves the loop's poller then: gateway.replication.sidecar_race)."""

    def __init__(self, agreed: int) -> None:
        self.agreed, self.asked, self.looks = agreed, 0, 0
        self.leader = SimpleNamespace(node="lead")
        self.client = SimpleNamespace(close=self._close)
        self.closed = 0

    def _close(self) -> None:
        self.closed += 1

    def ask(self, stream: str, own: B.Batch, now: float) -> Question:
        self.asked += 1
        return Question(stream, own, self.client, self.asked, now + 1.0)  # type: ignore[arg-type]

    def answer(self, q: Question, now: float) -> bool | None:
        self.looks += 1
        return None if self.looks % 2 else q.own.last_seq <= self.agreed

    def stop_asking(self) -> list[object]:
        return [self.client]


def cut(copier: ReplicaCopier, leader: Leader) -> int:
    """Run the copier's cut to its end, as the loop's turns do; how many turns it took."""
    turns = 1
    while not copier.cut(leader, 0.0):  # type: ignore[arg-type]
        turns += 1
    return turns


def last_agreed(reader: JournalReader, head: int, leader_has: Callable[[B.Batch], bool]) -> int:
    search = Agreement(reader, head)
    while search.asking is not None:
        search.answer(leader_has(search.asking))
    return search.agreed


def offset_of(directory: Path, seq: int) -> int:
    """Where the batch starting at `seq` lies in the first segment."""
    with open(seg_path(directory, 1), "rb") as f:
        scanner = FrameScanner(f.fileno())
        while (frame := scanner.next_frame()) is not None:
            if HEADER.unpack_from(frame)[6] == seq:
                return scanner.offset - len(frame)
    raise AssertionError(f"no batch starts at {seq}")


def journal(tmp_path: Path) -> Lane:
    writer = JournalWriter.open(tmp_path, STREAM)
    for i in range(BATCHES):
        writer.append(B.Batch.parse(B.encode(0, [(0, b"k", b"r%d" % i)] * SIZE)))
    return Lane(STREAM, writer, ProducerTable(10**12, 100))


def copier_of(tmp_path: Path, lane: Lane, mark: CommittedMark, reopened: list[str]) -> ReplicaCopier:
    """A copier over `lane`, which reopens its writer after a cut (each reopened stream noted in `reopened`)."""

    def reopen(stream: str) -> None:
        reopened.append(stream)
        lane.writer = JournalWriter.open(tmp_path, stream)

    copied = {STREAM: GatewayMetrics([STREAM]).streams[STREAM].copied}
    return ReplicaCopier(tmp_path, {STREAM: lane}, {STREAM: mark}, reopen, copied)


@pytest.mark.parametrize("kept_batches", [BATCHES, BATCHES - 1, BATCHES - 5, 77, 1, 0])
def test_a_rejoining_node_cuts_once_where_the_journals_part(tmp_path: Path, kept_batches: int) -> None:
    lane, leader = journal(tmp_path), Leader(kept_batches * SIZE)
    reopened: list[str] = []
    mark = CommittedMark(tmp_path / STREAM)
    copier = copier_of(tmp_path, lane, mark, reopened)
    try:
        assert cut(copier, leader) == leader.asked + 1  # each question answered at the next turn
        assert leader.closed == 1  # the question connection, closed once the cut is done
        assert lane.head == kept_batches * SIZE
        assert JournalReader(tmp_path, STREAM).last_seq == lane.head
        assert reopened == ([] if kept_batches == BATCHES else [STREAM])  # one cut, or none
        if kept_batches == BATCHES:
            assert leader.asked == 1  # the usual case: our last batch is the leader's too
        else:
            assert leader.asked <= 2 * math.ceil(math.log2(BATCHES * SIZE)) + 2, leader.asked
    finally:
        lane.writer.close()
        mark.close()


def test_the_agreed_point_skips_what_retention_removed(tmp_path: Path) -> None:
    """What retention removed is not ours to compare: a leader that holds none of ours agrees below our first."""
    lane = journal(tmp_path)
    try:
        reader = JournalReader(tmp_path, STREAM)
        assert last_agreed(reader, lane.head, lambda own: False) == reader.first_seq - 1 == 0
        assert last_agreed(reader, 0, lambda own: True) == 0  # an empty journal agrees with anyone at 0
    finally:
        lane.writer.close()


@pytest.mark.parametrize("agreed_batches", [100, 40])
def test_a_node_repaired_by_hand_cuts_at_its_hole_and_reuses_its_sequences(tmp_path: Path, agreed_batches: int) -> None:
    """`zeps journal repair` cut our journal at batch 100 and moved the head past what it discarded (so that a
    lone gateway never reuses a sequence): the journal jumps over that range. Rejoining a group, we agree with
    the leader only below the hole, and cut back to it: the leader's records fill those sequences."""
    lane = journal(tmp_path)
    lane.writer.close()
    hole = 100 * SIZE + 1
    truncate_at(tmp_path, STREAM, 1, offset_of(tmp_path / STREAM, hole))
    lane.writer = JournalWriter.open(tmp_path, STREAM)
    assert lane.head == BATCHES * SIZE  # the head jumped past the discarded range
    reader = JournalReader(tmp_path, STREAM)
    assert reader.held_below(lane.head) == hole - 1
    leader = Leader(agreed_batches * SIZE)
    mark = CommittedMark(tmp_path / STREAM)
    copier = copier_of(tmp_path, lane, mark, [])
    try:
        cut(copier, leader)
        assert lane.head == agreed_batches * SIZE
        assert JournalReader(tmp_path, STREAM).last_seq == lane.head
        assert leader.asked <= 2 * math.ceil(math.log2(BATCHES * SIZE)) + 2, leader.asked
    finally:
        lane.writer.close()
        mark.close()
