"""A follower's copy of its leader's journal, and the one cut that makes ours a prefix of the leader's first.

On following a new leader, a node first drops what its journal holds beyond the leader's (records a former
leader journaled but never got committed): it compares batches of its own with the leader's, byte for byte,
from its last one back, finds where they part (`last_agreed`: galloping, then halving) and cuts there once
(`cut_to_leader`). Then it copies each stream after its head: from the leader's sidecar while behind, from its
pushes once level (gateway.replication.follower says when each), verbatim, acknowledging what it wrote at once and
what is durable once its group commit (on the journal's own timer, run by the syncer thread) covers it.

Threading contract: used by the gateway's loop only. `cut_to_leader` waits on the leader's sidecar (bounded,
a few times per change of leader); the rest never waits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from prometheus_client import Counter

from gateway.errors import JournalError, JournalTrimmed, ReplayError, ReplayRefused
from gateway.journal import JournalReader
from gateway.journal.committed import CommittedMark
from gateway.journal.tools import cut_after
from gateway.replication.follower import Follower
from gateway.replication.peer_server import Unwatch, Watch
from gateway.replication.strategy import ReplicaLane
from gateway.wire import batch as B

log = logging.getLogger(__name__)

RETRY_FOLLOW_S = 0.2  # a leader whose sidecar did not answer is tried again this soon


class Leader(Protocol):
    """What a cut asks of the leader (gateway.replication.follower.Follower)."""

    def matches(self, stream: str, own: B.Batch) -> bool: ...


class ReplicaCopier:
    """Copies the leader's journal into the node's lanes, after cutting them back to it."""

    def __init__(
        self,
        journal: Path,
        lanes: Mapping[str, ReplicaLane],
        marks: Mapping[str, CommittedMark],
        reopen: Callable[[str], None],
        copied: Mapping[str, Mapping[str, Counter]],
        watch: Watch,
        unwatch: Unwatch,
    ) -> None:
        """`journal`: the lanes' journal root; `reopen(stream)`: open a lane's writer again after a cut;
        `copied[stream][source]`: counts batches copied from 'push' or 'sidecar'; `watch`/`unwatch`: the loop's
        poller, for the sidecar tails."""
        self._journal, self._lanes, self._marks, self._reopen = journal, lanes, marks, reopen
        self._copied, self._watch, self._unwatch = copied, watch, unwatch
        self._retry_at = 0.0
        self._refused_by = 0  # the epoch whose leader's sidecar refused us for good, once said

    def run(self, f: Follower, now: float) -> None:
        """One pass while following `f`: start copying once it answers (cut first), or copy what it sent."""
        if not f.copies:
            if f.answering(now) and now >= self._retry_at:
                self._start(f)
            return
        try:
            for stream in f.copies:
                self.copy(f, stream)
        except (ReplayError, JournalError, OSError) as exc:  # the leader's sidecar went away, or our disk is full
            self._failed(f, "replication from %s stopped (%s); starting again", exc, now)

    def copy(self, f: Follower, stream: str) -> None:
        """Journal what the leader sent for `stream`, verbatim, where it continues our journal: its sidecar's
        tail while we are behind, its pushes once level (gateway.replication.follower, which says when each); ack it
        as written at once, and as durable once a group commit covers it (on the journal's own timer, as the
        leader's, run by the syncer thread: the loop copies on meanwhile)."""
        lane = self._lanes[stream]
        writer, copied = lane.writer, self._copied[stream]
        for batch in f.batches(stream):  # the sidecar's tail, in order; what a push brought first is skipped
            if batch.last_seq > writer.last_seq:
                lane.append_replica(batch)
                copied["sidecar"].inc()
        level = gap = False
        for batch in f.pushes(stream):  # the leader's pushes, in its order
            if batch.first_seq == writer.last_seq + 1:
                lane.append_replica(batch)
                copied["push"].inc()
                level = True
            elif batch.first_seq > writer.last_seq + 1:
                gap = True
        writer.take_finished_sync()
        f.journaled(stream, writer.last_seq, writer.durable_seq)
        if f.tailing(stream):
            if level and not gap:
                self._untail(f, stream)  # level with the leader: its pushes carry on, its sidecar rests
        elif gap or f.missed(stream, writer.last_seq):
            log.debug("ha: stream %s: a push after %d went missing; copying from the sidecar", stream, writer.last_seq)
            self.tail(f, stream)

    def tail(self, f: Follower, stream: str) -> None:
        """Copy `stream` from the leader's sidecar, after our head."""
        writer = self._lanes[stream].writer
        self._watch(f.tail(stream, writer.last_seq, writer.durable_seq).sock, 1)

    def _start(self, f: Follower) -> None:
        """Cut our journal back to the leader's, then copy each stream after its head, from the leader's sidecar
        until level (waits, bounded)."""
        try:
            for stream in self._lanes:
                self.cut_to_leader(f, stream, f.leader.node)
            for stream in self._lanes:
                self.tail(f, stream)
        except (ReplayError, JournalError) as exc:
            self._failed(f, "cannot copy from %s yet (%s); trying again", exc, time.monotonic())
            return
        log.info("ha: follows %s (epoch %d)", f.leader.node, f.epoch)

    def _failed(self, f: Follower, what: str, exc: Exception, now: float) -> None:
        """Stop copying and try again soon. A refusal that retrying cannot fix (a CURVE key the leader's sidecar
        does not take, say) is a warning, once per leader: the node stays out of the in-sync set until fixed."""
        if isinstance(exc, ReplayRefused) and self._refused_by != f.epoch:
            self._refused_by = f.epoch
            log.warning("ha: " + what, f.leader.node, exc)
        else:
            log.info("ha: " + what, f.leader.node, exc)
        self.stop(f)
        self._retry_at = now + RETRY_FOLLOW_S

    def _untail(self, f: Follower, stream: str) -> None:
        client = f.untail(stream)
        if client is not None:
            self._unwatch(client.sock)
            client.close()

    def stop(self, f: Follower) -> None:
        """Copy nothing more from `f` (its tails closed and out of the poller)."""
        for stream in f.copies:
            self._untail(f, stream)
        f.drop_copies()

    def cut_to_leader(self, leader: Leader, stream: str, name: str) -> None:
        """Cut our journal of `stream` back to the last batch `leader` (named `name`) holds too, in one cut."""
        lane, mark = self._lanes[stream], self._marks[stream]
        head = lane.head
        keep = last_agreed(JournalReader(self._journal, stream), head, lambda own: leader.matches(stream, own))
        if keep >= head:
            return
        if keep < mark.value:  # committed records are never cut: our journal is not what we thought
            log.error("ha: stream %s: cutting to %d, below the committed mark %d", stream, keep, mark.value)
            mark.lower(keep)
        lane.writer.close()
        cut_after(self._journal, stream, keep)
        self._reopen(stream)
        log.warning("ha: stream %s: dropped %d..%d, which leader %s does not have", stream, keep + 1, head, name)


def last_agreed(reader: JournalReader, head: int, leader_has: Callable[[B.Batch], bool]) -> int:
    """The last sequence of our journal (`reader`, up to `head`) that the leader has too: `leader_has(batch)`
    says whether it has a batch of ours.

    Whether the leader holds a batch of ours is monotone (true up to where the journals part, false after:
    each batch was copied with every batch before it), so the point is found by galloping back from our
    head, then halving: a few asks for a long divergence (a deposed leader that journaled alone for a
    while), one in the usual case (nothing to cut)."""
    # The leader holds our ..agreed, and not the batch that starts at differs. What retention removed is no
    # longer ours to compare or cut.
    agreed = reader.first_seq - 1 if head else 0
    differs = head + 1
    probe, step = head, 1
    while probe > agreed:  # gallop back from the head: 1, 2, 4... sequences below the last batch that differs
        own = _batch_at(reader, probe)
        if leader_has(own):
            agreed = own.last_seq
            break
        differs, probe, step = own.first_seq, own.first_seq - step, step * 2
    while agreed + 1 < differs:  # then halve what is left between them
        middle = (agreed + differs) // 2
        own = _batch_at(reader, middle)
        if own.first_seq >= differs:  # our journal jumps over the rest (a copy that started at a trimmed leader's)
            break
        if leader_has(own):
            agreed = own.last_seq
            if own.last_seq < middle:  # a hole of ours from here on: nothing there for the leader to have
                differs = own.last_seq + 1
        else:
            differs = own.first_seq
    return agreed


def _batch_at(reader: JournalReader, seq: int) -> B.Batch:
    """The batch of `reader`'s journal that holds `seq`, or where the journal jumps over `seq` (a node whose
    power loss left a hole, repaired by hand: JournalReader.held_below) the last batch before it."""
    try:
        with reader.cursor(seq) as cursor:
            batch = cursor.next_batch()
    except JournalTrimmed:
        if seq < reader.first_seq or (below := reader.held_below(seq)) < reader.first_seq:
            raise
        return _batch_at(reader, below)
    if batch is None:
        raise JournalError(f"stream {reader.stream}: no batch holds {seq}, below the journal's head")
    return B.Batch.parse(bytes(batch))
