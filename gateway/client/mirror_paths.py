"""A mirror's source read over several paths (TCP sessions with one sidecar), sans-IO (docs/mirroring.md).

One TCP connection across a lossy WAN is slow twice over: CUBIC halves its window at each loss (about 155,000
records/s at 60 ms RTT and 1% loss), and each lost segment holds every byte behind it for a round trip or a
retransmission timeout. So `zeps mirror --paths N` reads the source over N sessions: the catch-up striped by
sequence range over all of them (FETCH), the live tail on two of them at once (A/B feed arbitration, as
exchanges' feed handlers do), and this module puts the pieces back in order. With `--datagram-tail` the live
tail also comes as datagrams with forward error correction (gateway.wire.tail), merged here the same way: the
first copy of a sequence wins, whichever way it came.

Rules
=====

1. Paths are numbered 0..n-1, each one session with the round's source sidecar. A sidecar serves a session's
   FETCHes in order, before its subscription: a FETCH-END ends the path's oldest FETCH. A batch belongs to the
   feed whose range holds its first sequence (ranges of one path never overlap).
2. CATCHING_UP: what comes after `next` is cut in chunks of `chunk` sequences, each FETCHed on one up path, at
   most `depth` per path, none starting beyond `next + ahead` (the bound of the reorder buffer). A range given
   back (its path was replaced, or its FETCH ended short: rule 3) goes out before any new chunk.
3. A FETCH whose FETCH-END names a last below the range's met the source's head h: no chunk is cut any more,
   and the machine is LIVE, with the live tail starting after h. The range's rest up to that start is given
   back (another path's FETCH, served earlier at a lower head, may end short below h).
4. LIVE: `copies` up paths subscribe, after the live start (a path taking over one that was replaced: after
   what the machine holds, if that is more). Each receives the same records; the first arrival of a sequence
   wins and the others are dropped (`dropped`).
5. Batches leave (`pop`) in order and contiguous only, each starting at `next`: held ones wait for the one
   that continues it. The mirror site's gateway accepts only that batch anyway; here the order is made.
6. A gap is never skipped: a feed's batch that starts after the feed's position (beyond `next`), or TRIMMED
   beyond `next`, names the records gone (`gone`; the shell ends the mirror with them).
7. A path is replaced when it fails (`Down`, from the shell) or stalls: it holds the FETCH that `next` is in
   (LIVE: it is behind `next`) and sent nothing for `stall_s` while another path is up. Its FETCHes are given
   back (rule 2) and its subscription taken over (rule 4); the shell closes it (`Close`), and it is opened
   again (`Open`) after a backoff of 0.1 s doubling to 2 s, back to 0.1 s once it delivers.
8. With one path there is nothing to stripe or arbitrate: it is LIVE from the start (one subscription, the
   mirror of before), and nothing else is up to call it stalled (its ZMTP heartbeats tell a dead sidecar).
9. Nothing here does I/O or reads a clock: `now` comes with every event.
10. Each path's tally (`PathTally`, kept by the caller across rounds for the metrics): the records released
    from its batches (their sum is what was handed out), those of them that came on a subscription (the live
    tail's first arrivals: the copy that won), the bytes it received, duplicates included, its reopenings
    (rule 7), whether it is up, and when it last sent a batch.
11. With the datagram tail wanted (`tail`), LIVE: one up, subscribed path carries TAIL-UDP (`AskTail`); when
    that path is replaced, the next Tick asks on another (the sidecar's tail ends with its session). The
    datagrams' journal batches (`Datagram`, whole or joined: rule 12) are held and released exactly as a
    path's (rule 5: first arrival wins), counted in `tail_records`; they never move a feed's position nor name
    a loss (rule 6 is the TCP feeds'): a datagram lost for good is a batch the subscription brings. One that
    starts beyond `next + ahead` (the mirror far behind the live head) is not held (`tail_far`): the catch-up
    brings it, the buffer stays bounded.
12. A journal batch too large for one datagram comes in parts, each naming the whole batch (its coverage and
    CRC). The parts are kept apart, never held for release, until all of them have come; then they are joined
    (`Batch.join`) and, if the join's CRC is the journal batch's, held as that batch (`tail_joined`; else
    dropped, `tail_unjoined`). So the mirror site receives the source's batches as the source journaled them,
    batch for batch, and never a part. Parts wait no longer than the TCP copy: the first complete copy wins,
    and at each Tick the parts of batches released already (`next` beyond them) are dropped.

Theory of operation
===================

The shell (gateway.client.source_paths) feeds `on(event, now)` with what its sessions report: `Up` (a session
is open), `Arrived` (a batch), `Ended` (FETCH-END of a range FETCH), `Trimmed`, `Down`, `Datagram` (a piece
of the datagram tail), and a `Tick` at least every 50 ms; it then carries out `actions` in order (`Open`,
`Close`, `Fetch`, `Subscribe`, `AskTail`) and forwards what
`pop()` releases. The work (rules 2, 4, 7) is done at each Tick, not after every batch: a batch costs
its handler and a heap push. Every state's handlers and transitions are in TRANSITIONS, in the table form of
gateway.machine; `describe_transitions()` renders it for docs/mirroring.md and a test keeps the two equal.
Not thread-safe: the mirror's thread alone.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gateway import machine
from gateway.errors import BatchError
from gateway.wire import batch as B
from gateway.wire import tail as T

CHUNK = 8_192  # sequences per FETCH: about 1 MB, many round trips at 155,000 records/s per path
DEPTH = 2  # FETCHes outstanding per path: the next one is queued at the sidecar before the current one ends
COPIES = 2  # live paths carrying the same records
STALL_S = 1.0  # well above Linux's retransmission timeout (>= 200 ms) and a WAN round trip
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 2.0
TAIL = -1  # the held batches' "path" of a datagram tail's batch


class Phase(enum.Enum):
    CATCHING_UP = "catching up"
    LIVE = "live"


# --- events (the shell's reports) ---------------------------------------------------------------------


class Up(NamedTuple):
    path: int


class Arrived(NamedTuple):
    path: int
    batch: B.Batch


class Ended(NamedTuple):
    """FETCH-END of the path's oldest range FETCH: `last`, the last sequence it covered."""

    path: int
    last: int


class Trimmed(NamedTuple):
    path: int
    first_retained: int


class Down(NamedTuple):
    path: int


class Datagram(NamedTuple):
    """A piece of the datagram tail (rules 11, 12): a journal batch or a part of one, decoded and checked by the
    shell."""

    piece: T.Piece


class Tick(NamedTuple):
    """At least every 50 ms; `reading`: whether the shell read the paths this time (it stops while the mirror
    site's window is full: silence then is not the paths')."""

    reading: bool = True


Event = Up | Arrived | Ended | Trimmed | Down | Datagram | Tick

# --- actions (for the shell) --------------------------------------------------------------------------


class Open(NamedTuple):
    path: int


class Close(NamedTuple):
    path: int
    why: str


class Fetch(NamedTuple):
    path: int
    first: int
    last: int


class Subscribe(NamedTuple):
    path: int
    after: int


class AskTail(NamedTuple):
    """Send TAIL-UDP on the path's session (rule 11): a new tail, replacing any other."""

    path: int


Action = Open | Close | Fetch | Subscribe | AskTail


@dataclass
class PathTally:
    """One path's counts (rule 10); the metrics' thread reads them, each field whole."""

    records: int = 0
    first_arrivals: int = 0
    bytes: int = 0
    reopens: int = 0
    up: bool = False
    arrived_at: float = 0.0  # `now` of its last batch; 0.0 before any


@dataclass
class _Feed:
    """One FETCH (last bounded) or a subscription (last MAX_SEQ) on a path; `pos`: the next sequence it sends."""

    first: int
    last: int
    pos: int

    @property
    def live(self) -> bool:
        return self.last == B.MAX_SEQ


@dataclass
class _Path:
    up: bool = False
    opening: bool = True  # Open was asked (at the start, or after a backoff) and Up or Down has not come yet
    feeds: deque[_Feed] = field(default_factory=deque)
    heard: float = 0.0  # when it last sent a batch (or came up, or was given work while idle)
    backoff: float = BACKOFF_MIN_S
    reopen_at: float = 0.0  # when a replaced path is opened again

    @property
    def fetches(self) -> int:
        return sum(not feed.live for feed in self.feeds)

    @property
    def subscribed(self) -> bool:
        return any(feed.live for feed in self.feeds)


class SourcePathsCore:
    """The rules above for `paths` sessions, resuming after `after` (the mirror site's head)."""

    def __init__(
        self,
        paths: int,
        after: int,
        *,
        chunk: int = CHUNK,
        depth: int = DEPTH,
        copies: int = COPIES,
        stall_s: float = STALL_S,
        tallies: list[PathTally] | None = None,
        tail: bool = False,
    ) -> None:
        if paths < 1 or chunk < 1 or depth < 1 or copies < 1:
            raise ValueError("paths, chunk, depth and copies must be >= 1")
        if tallies is not None and len(tallies) != paths:
            raise ValueError(f"{len(tallies)} tallies for {paths} paths")
        self.tallies = tallies if tallies is not None else [PathTally() for _ in range(paths)]
        self.next = after + 1  # the first sequence not released yet
        self.chunk, self.depth, self.copies, self.stall_s = chunk, depth, min(copies, paths), stall_s
        self.ahead = 2 * depth * paths * chunk  # no FETCH starts beyond next + ahead
        self.paths = [_Path() for _ in range(paths)]
        self.actions: list[Action] = [Open(i) for i in range(paths)]
        self.gone: tuple[int, int, int] | None = None  # (lo, hi, first retained): records the source lacks
        self.dropped = 0  # records that arrived twice (or more) and were dropped
        self.phase = Phase.LIVE if paths == 1 else Phase.CATCHING_UP
        self.live_after = after if paths == 1 else -1  # LIVE: the subscriptions start after this
        self._cut = self.next  # the first sequence no chunk covers yet
        self._given_back: list[tuple[int, int]] = []  # ranges to FETCH again, a heap by first
        self._held: list[tuple[int, int, int, bool, B.Batch]] = []  # (first_seq, arrival, path, live, batch), a heap
        self._arrivals = 0
        self._met_head = False  # a FETCH ended short (rule 3)
        self._now = 0.0
        self.tail = tail
        self.tail_path: int | None = None  # the path whose session carries TAIL-UDP (rule 11)
        self.tail_records = 0  # records released from datagram batches: the tail's first arrivals
        self.tail_far = 0  # datagram batches not held: beyond next + ahead
        self.tail_joined = 0  # journal batches joined from their datagram parts (rule 12)
        self.tail_unjoined = 0  # parts' joins dropped: not the journal batch they named
        self._parts: dict[tuple[int, int, int], dict[int, B.Batch]] = {}  # (first, last, crc) -> parts by first

    # --- the shell's side -------------------------------------------------------------------------------

    def on(self, event: Event, now: float) -> None:
        self._now = now
        self.phase = machine.settle(self, TRANSITIONS, self.phase, event)

    def pop(self) -> B.Batch | None:
        """The next batch in order, starting at `next`; None until the one that continues it has come."""
        while self._held:
            first, _, i, live, batch = self._held[0]
            if first > self.next:
                return None
            heapq.heappop(self._held)
            if batch.last_seq < self.next:
                self.dropped += batch.count
                continue
            if first < self.next:
                self.dropped += self.next - first
                batch = B.Batch.parse(batch.part(self.next, batch.last_seq), check_crc=False)
            self.next = batch.last_seq + 1
            if i == TAIL:
                self.tail_records += batch.count
                return batch
            tally = self.tallies[i]
            tally.records += batch.count
            if live:
                tally.first_arrivals += batch.count
            return batch
        return None

    @property
    def up(self) -> int:
        return sum(p.up for p in self.paths)

    @property
    def held(self) -> int:
        return len(self._held)

    # --- handlers, in TRANSITIONS -----------------------------------------------------------------------

    def _up(self, event: Up) -> None:
        path = self.paths[event.path]
        path.up, path.opening, path.heard = True, False, self._now
        self.tallies[event.path].up = True

    def _arrived(self, event: Arrived) -> None:
        path, batch = self.paths[event.path], event.batch
        feed = next((f for f in path.feeds if f.first <= batch.first_seq <= f.last), None)
        if feed is not None:
            if batch.first_seq > feed.pos and batch.first_seq > self.next:
                self._lose(max(feed.pos, self.next), batch.first_seq - 1, batch.first_seq)
            feed.pos = max(feed.pos, batch.last_seq + 1)
        path.heard, path.backoff = self._now, BACKOFF_MIN_S
        tally = self.tallies[event.path]
        tally.bytes, tally.arrived_at = tally.bytes + len(batch.buf), self._now
        if batch.count and batch.last_seq >= self.next:
            live = feed is not None and feed.live
            heapq.heappush(self._held, (batch.first_seq, self._arrivals, event.path, live, batch))
            self._arrivals += 1
        elif batch.count:
            self.dropped += batch.count

    def _ended(self, event: Ended) -> None:
        path = self.paths[event.path]
        feed = next((f for f in path.feeds if not f.live), None)
        if feed is None:
            return
        path.feeds.remove(feed)
        if event.last < feed.last:  # rule 3: the source's head
            if not self._met_head:
                self._met_head, self.live_after = True, max(event.last, self.next - 1)
            self._give_back(max(event.last + 1, feed.first), min(feed.last, self.live_after))

    def _trimmed(self, event: Trimmed) -> None:
        if event.first_retained > self.next:
            self._lose(self.next, event.first_retained - 1, event.first_retained)

    def _down(self, event: Down) -> None:
        self._replace(event.path, "")

    def _datagram(self, event: Datagram) -> None:
        piece = event.piece
        if not piece.batch.count:
            return
        if piece.last < self.next:
            self.dropped += piece.batch.count
        elif piece.first > self.next + self.ahead:
            self.tail_far += 1
        elif piece.whole:
            self._hold_tail(piece.batch)
        else:
            self._add_part(piece)

    def _tick(self, event: Tick) -> None:
        if not event.reading:
            for path in self.paths:
                path.heard = self._now
        self._watch()
        self._cut_chunks()
        self._drop_parts()

    def _tick_live(self, event: Tick) -> None:
        self._tick(event)
        self._subscribe()
        self._ask_tail()

    # --- guards, in TRANSITIONS -------------------------------------------------------------------------

    def _head_met(self) -> bool:
        return self._met_head

    # --- the work of a Tick -------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Rule 7: replace a path that stalls while another is up; open the replaced ones after their backoff."""
        now = self._now
        for i, path in enumerate(self.paths):
            if not path.up and not path.opening and now >= path.reopen_at:
                path.opening = True
                self.tallies[i].reopens += 1
                self.actions.append(Open(i))
        if self.up < 2:
            return
        for i, path in enumerate(self.paths):
            if path.up and self._holds_back(path) and now - path.heard > self.stall_s:
                self._replace(i, f"sent nothing for {now - path.heard:.1f} s while holding the mirror back")

    def _cut_chunks(self) -> None:
        """Rule 2: given-back ranges first, then new chunks, to the up paths with room (the fewest FETCHes
        first)."""
        while True:
            room = [(p.fetches, i) for i, p in enumerate(self.paths) if p.up and p.fetches < self.depth]
            if not room:
                return
            if self._given_back:
                first, last = heapq.heappop(self._given_back)
                if last < self.next:
                    continue
                first = max(first, self.next)
            elif self.phase is Phase.CATCHING_UP and self._cut <= self.next + self.ahead:
                first, last = self._cut, self._cut + self.chunk - 1
                self._cut = last + 1
            else:
                return
            self._give(min(room)[1], _Feed(first, last, first), Fetch(min(room)[1], first, last))

    def _subscribe(self) -> None:
        """Rule 4: `copies` up paths subscribed (those with the fewest FETCHes first)."""
        have = sum(p.subscribed for p in self.paths)
        free = sorted((p.fetches, i) for i, p in enumerate(self.paths) if p.up and not p.subscribed)
        for _, i in free[: max(0, self.copies - have)]:
            after = max(self.live_after, self.next - 1)
            self._give(i, _Feed(after + 1, B.MAX_SEQ, after + 1), Subscribe(i, after))

    def _ask_tail(self) -> None:
        """Rule 11: the datagram tail on one up, subscribed path (the lowest numbered)."""
        if not self.tail or self.tail_path is not None:
            return
        for i, path in enumerate(self.paths):
            if path.up and path.subscribed:
                self.tail_path = i
                self.actions.append(AskTail(i))
                return

    # --- the handlers' parts ------------------------------------------------------------------------------

    def _give(self, i: int, feed: _Feed, action: Action) -> None:
        path = self.paths[i]
        if not path.feeds:
            path.heard = self._now  # an idle path's silence so far is not a stall
        path.feeds.append(feed)
        self.actions.append(action)

    def _give_back(self, first: int, last: int) -> None:
        if first <= last and last >= self.next:
            heapq.heappush(self._given_back, (first, last))

    def _holds_back(self, path: _Path) -> bool:
        """It holds the FETCH `next` is in, or (live) its subscription is behind `next`."""
        for feed in path.feeds:
            if feed.live and feed.pos < self.next:
                return True
            if not feed.live and feed.pos <= self.next <= feed.last:
                return True
        return False

    def _replace(self, i: int, why: str) -> None:
        """Rule 7: its FETCHes given back, its subscription left for another path; opened again later."""
        path = self.paths[i]
        if self.tail_path == i:
            self.tail_path = None  # rule 11: asked again on another path
        for feed in path.feeds:
            if not feed.live:
                self._give_back(feed.pos, feed.last)
        path.feeds.clear()
        if why:
            self.actions.append(Close(i, why))
        path.up, path.opening = False, False
        self.tallies[i].up = False
        path.reopen_at = self._now + path.backoff
        path.backoff = min(path.backoff * 2, BACKOFF_MAX_S)

    def _hold_tail(self, batch: B.Batch) -> None:
        heapq.heappush(self._held, (batch.first_seq, self._arrivals, TAIL, True, batch))
        self._arrivals += 1

    def _add_part(self, piece: T.Piece) -> None:
        """Rule 12: keep the part; once its journal batch's parts are all here, join them and hold that batch."""
        key = (piece.first, piece.last, piece.crc)
        parts = self._parts.setdefault(key, {})
        parts[piece.batch.first_seq] = piece.batch
        if sum(part.count for part in parts.values()) < piece.last - piece.first + 1:
            return
        del self._parts[key]
        try:
            whole = B.Batch.parse(B.join([parts[first] for first in sorted(parts)]), check_crc=False)
        except BatchError:
            whole = None
        if whole is None or whole.crc != piece.crc:
            self.tail_unjoined += 1
            return
        self.tail_joined += 1
        self._hold_tail(whole)

    def _drop_parts(self) -> None:
        """Rule 12: the parts of journal batches released already (the TCP copy came first)."""
        for key in [key for key in self._parts if key[1] < self.next]:
            self.dropped += sum(part.count for part in self._parts.pop(key).values())

    def _lose(self, lo: int, hi: int, first: int) -> None:
        if self.gone is None:
            self.gone = (lo, hi, first)


# --- the table ------------------------------------------------------------------------------------------

Go = machine.Go[SourcePathsCore, Phase]
Row = machine.Row[SourcePathsCore, Phase]
C = SourcePathsCore
_ON: dict[object, Callable[[SourcePathsCore, Any], None] | None] = {
    Up: C._up, Arrived: C._arrived, Ended: C._ended, Trimmed: C._trimmed, Down: C._down, Datagram: C._datagram,
}  # fmt: skip

TRANSITIONS: dict[Phase, Row] = {
    Phase.CATCHING_UP: Row(on={**_ON, Tick: C._tick}, go=(Go(C._head_met, Phase.LIVE),)),
    Phase.LIVE: Row(on={**_ON, Tick: C._tick_live}),
}
del C


def describe_transitions() -> str:
    """TRANSITIONS as Markdown (docs/mirroring.md embeds it; a test keeps them equal)."""
    return machine.describe(TRANSITIONS, (Up, Arrived, Ended, Trimmed, Down, Datagram, Tick))
