"""A follower's copy of its leader's journal, and the one cut that makes ours a prefix of the leader's first.

On following a new leader, a node first drops what its journal holds beyond the leader's (records a former
leader journaled but never got committed): it compares batches of its own with the leader's, byte for byte,
from its last one back, finds where they part (`last_agreed`: galloping, then halving) and cuts there once
(`cut_to_leader`). Then it copies each stream after its head: from the leader's sidecar while behind, from its
pushes once level (gateway.replication.follower says when each), verbatim, acknowledging what it wrote at once and
what is durable once its group commit (on the journal's own timer, run by the syncer thread) covers it.

Every connection to the leader's sidecar (a question's, a tail's) races a second one while its opening has
no answer after 0.2 s (gateway.replication.sidecar_race): a lost segment of a fresh connection costs TCP's
retransmission timeout, and a failed opening a restart of the copy with a new cut.

Threading contract: used by the gateway's loop only; nothing waits. The cut asks the leader's sidecar one
question at a time and goes on at the next turn of the loop that finds the answer (`cut`): a follower that
waited for those answers (up to a second each, a few per change of leader) answered no publisher meanwhile,
and publishers learn from the followers where a new leader is.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from gateway.errors import JournalError, JournalTrimmed, ReplayError, ReplayRefused
from gateway.journal import JournalReader
from gateway.journal.committed import CommittedMark
from gateway.journal.tools import cut_after
from gateway.replication.follower import Follower, Question
from gateway.replication.strategy import ReplicaLane
from gateway.wire import batch as B

log = logging.getLogger(__name__)

RETRY_FOLLOW_S = 0.2  # a leader whose sidecar did not answer is tried again this soon


@dataclass
class _Cut:
    """The streams still to cut back to the leader's journal, the search under way and its open question. The
    connections questions are asked on are the follower's (`Follower.stop_asking`), each in the loop's poller
    while open (gateway.replication.sidecar_race)."""

    streams: deque[str]
    search: Agreement | None = None
    question: Question | None = None


class ReplicaCopier:
    """Copies the leader's journal into the node's lanes, after cutting them back to it."""

    def __init__(
        self,
        journal: Path,
        lanes: Mapping[str, ReplicaLane],
        marks: Mapping[str, CommittedMark],
        reopen: Callable[[str], None],
        copied: Mapping[str, Mapping[str, Counter]],
    ) -> None:
        """`journal`: the lanes' journal root; `reopen(stream)`: open a lane's writer again after a cut;
        `copied[stream][source]`: counts batches copied from 'push' or 'sidecar'."""
        self._journal, self._lanes, self._marks, self._reopen = journal, lanes, marks, reopen
        self._copied = copied
        self._retry_at = 0.0
        self._refused_by = 0  # the epoch whose leader's sidecar refused us for good, once said
        self._cut: _Cut | None = None  # a cut under way

    def run(self, f: Follower, now: float) -> None:
        """One pass while following `f`: start copying once it answers and the cut is done, or copy what it sent."""
        if not f.copies:
            if (self._cut is not None or (f.answering(now) and now >= self._retry_at)) and self.cut(f, now):
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
        f.tail(stream, writer.last_seq, writer.durable_seq)

    def cut(self, f: Follower, now: float) -> bool:
        """Go on cutting each stream back to the leader's journal (a cut starts at the first call): True once every
        stream is cut. Never waits: a question the leader's sidecar has not answered yet is looked at again at
        the next call (the loop wakes when its connection is readable). A failure stops the cut; the next call
        starts again (`_failed`)."""
        cut = self._cut = self._cut or _Cut(deque(self._lanes))
        try:
            while cut.streams:
                stream = cut.streams[0]
                if cut.search is None:
                    cut.search = Agreement(JournalReader(self._journal, stream), self._lanes[stream].head)
                while (own := cut.search.asking) is not None:
                    if cut.question is None:
                        cut.question = f.ask(stream, own, now)
                    has = f.answer(cut.question, now)
                    if has is None:
                        return False
                    cut.question = None
                    cut.search.answer(has)
                self._cut_after(stream, cut.search.agreed, f.leader.node)
                cut.search = None
                cut.streams.popleft()
        except (ReplayError, JournalError) as exc:
            self._failed(f, "cannot copy from %s yet (%s); trying again", exc, now)
            return False
        self._end_cut(f)
        return True

    def _end_cut(self, f: Follower) -> None:
        """Close the question connections; no cut is under way after this."""
        for client in f.stop_asking():
            client.close()
        self._cut = None

    def _start(self, f: Follower) -> None:
        """Copy each stream after its head (cut), from the leader's sidecar until level."""
        try:
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
            client.close()

    def stop(self, f: Follower) -> None:
        """Copy nothing more from `f`, and end a cut under way (its connections closed)."""
        for stream in f.copies:
            self._untail(f, stream)
        f.drop_copies()
        self._end_cut(f)

    def _cut_after(self, stream: str, keep: int, name: str) -> None:
        """Cut our journal of `stream` after `keep`, the last sequence the leader (named `name`) holds too, in one
        cut."""
        lane, mark = self._lanes[stream], self._marks[stream]
        head = lane.head
        if keep >= head:
            return
        if keep < mark.value:  # committed records are never cut: our journal is not what we thought
            log.error("ha: stream %s: cutting to %d, below the committed mark %d", stream, keep, mark.value)
            mark.lower(keep)
        lane.writer.close()
        started = time.monotonic()
        dropped = cut_after(self._journal, stream, keep)
        cut = time.monotonic()
        self._reopen(stream)
        log.info(
            "ha: stream %s: cut %d bytes in %.3f s, reopened in %.3f s",
            stream,
            dropped,
            cut - started,
            time.monotonic() - cut,
        )
        log.warning("ha: stream %s: dropped %d..%d, which leader %s does not have", stream, keep + 1, head, name)


class Agreement:
    """The last sequence of our journal (`reader`, up to `head`) that the leader has too, found one question at a
    time (sans-IO): `asking` is the batch of ours to ask the leader about (None: found, in `agreed`), and
    `answer(has)` says whether it holds it.

    Whether the leader holds a batch of ours is monotone (true up to where the journals part, false after:
    each batch was copied with every batch before it), so the point is found by galloping back from our
    head, then halving: a few questions for a long divergence (a deposed leader that journaled alone for a
    while), one in the usual case (nothing to cut)."""

    def __init__(self, reader: JournalReader, head: int) -> None:
        self._reader = reader
        # The leader holds our ..agreed, and not the batch that starts at differs. What retention removed is no
        # longer ours to compare or cut.
        self.agreed = reader.first_seq - 1 if head else 0
        self._differs = head + 1
        self._step = 1  # galloping back from the head: 1, 2, 4... sequences below the last batch that differs
        self._galloping = True
        self._middle = 0
        self.asking: B.Batch | None = None
        self._next(head)

    def answer(self, has: bool) -> None:
        """The leader holds `asking` (`has`), or not: the next question, or the end."""
        own = self.asking
        assert own is not None, "no question is open"
        if self._galloping:
            if has:
                self.agreed, self._galloping = own.last_seq, False
                self._next(0)
            else:
                self._differs = own.first_seq
                probe, self._step = own.first_seq - self._step, self._step * 2
                self._next(probe)
            return
        if has:
            self.agreed = own.last_seq
            if own.last_seq < self._middle:  # a hole of ours from here on: nothing there for the leader to have
                self._differs = own.last_seq + 1
        else:
            self._differs = own.first_seq
        self._next(0)

    def _next(self, probe: int) -> None:
        """Galloping: ask about the batch holding `probe`, while above what is agreed; then halve what is left."""
        if self._galloping and probe > self.agreed:
            self.asking = _batch_at(self._reader, probe)
            return
        self._galloping = False
        if self.agreed + 1 < self._differs:
            self._middle = (self.agreed + self._differs) // 2
            own = _batch_at(self._reader, self._middle)
            if own.first_seq < self._differs:  # else our journal jumps over the rest (a copy from a trimmed leader)
                self.asking = own
                return
        self.asking = None


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
