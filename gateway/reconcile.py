"""The reconciler: merge multicast feeds and the replay sidecar into one gap-free, in-order stream.

Rules
=====

1. Everything that decides what the application sees lives in this module, and every state change is
   listed in TRANSITIONS (at the end of the module): per state, the handler of each event, then the
   transitions (guard, next state, action on the way) in priority order, then the timers. All are real
   methods of ``Reconciler``. No transition is made anywhere else. The parts it composes
   (``gateway.merge``: the held buffer, the request scheduler, the position) keep data and do the
   bookkeeping; none of them changes the state.

2. Sans-IO: no sockets, no clocks, no threads. The caller passes every input as an event together with
   ``now`` (seconds, any monotonic origin) and executes the returned actions in order.

3. Coverage, not records. A batch covers ``first_seq..last_seq``: it accounts for every record of that
   range that concerns this client (all of them live; those matching the key filter on replay), so an
   empty batch can still cover a range. The reconciler never looks inside a batch; it returns
   ``Emit(batch, lo, hi, source)`` and the IO layer hands the application the records of ``batch``
   with ``lo <= seq <= hi``. Work is O(1) per batch in the merged steady state.

4. Never silent, never skip on a timeout. A range is skipped only when the journal shows it is gone
   (``ReplayTrimmed``, or a replay answer jumping past it), and then it is reported as ``Loss`` in its place.
   A request that makes no progress is retried for ever (exponential backoff; ``NoProgress`` at each
   failed attempt, so that the IO layer may ask another server; ``Stalled`` once the retries are exhausted).
   With several servers to ask, a request that hears nothing at all within ``first_answer_timeout`` is such
   a failed attempt: a silent server is not waited on for the whole progress deadline.

5. Every structure is bounded: held batches by ``buffer_limit_bytes``, requests by
   ``max_outstanding_requests`` and ``max_request_span``, retries by the backoff schedule.

Theory of operation
===================

One number carries the guarantee: ``next_seq`` (N). Everything below N has been delivered or reported
lost, in order, exactly once; every ``Emit`` and ``Loss`` starts at N and moves N past its ``hi``.
Whatever the source, a batch is judged by its coverage alone:

* ``last_seq < N``: a duplicate (the other feed, a retransmit, a replay overlapping live): dropped.
* ``first_seq <= N <= last_seq``: delivered from N to ``last_seq``; held batches that have become
  contiguous are delivered after it (``deliver_due``).
* ``first_seq > N``: held (a min-heap on ``first_seq``, bounded in bytes) until N reaches it; the range in
  between is missing and must come from replay.

The states say where the missing data comes from:

AWAIT_LIVE (``Start.latest()``)
    Nothing is known. The first live batch (delivered whole) or heartbeat (head + 1) fixes N.
AWAIT_EARLIEST (``Start.earliest()``)
    One open-ended request from 1 is out; its first answer fixes N: ``ReplayTrimmed(first_retained)`` (no loss:
    what the journal dropped was never part of "earliest") or the first batch. Live batches are held.
SNAPSHOTTING (``Start.snapshot()``, docs/snapshots.md)
    One snapshot request is out: the last record of every key as of the server's N0, as batches covering
    first_retained..N0 contiguously (each range holding the records still last of their key at N0), then
    ``SnapshotDone(N0)``. Its first batch fixes N (or, if it had none, ``SnapshotDone``: N0 + 1); its batches
    are delivered as they come (source "snapshot"), and live is only held: a snapshot range may not follow
    a full one (a key deleted there would be missed). After ``SnapshotDone`` the stream continues exactly as
    from ``Start.at_seq(N0 + 1)``: CATCHING_UP. A snapshot that fails once part of it is delivered is not
    asked again (a new one, as of a later N, could not continue this one); the rest of the stream is
    replayed in full from N instead, which yields the same last values. Answers to abandoned snapshots
    are dropped.
CATCHING_UP (``Start.at_seq``/``after_seq``, and every fall-back)
    Exactly one open-ended request from N is out; the replay server streams history, then the live
    tail, so replay alone keeps the stream going even with every multicast feed dead. Live batches are
    held (while the lag is at most ``max_lag / 2``, when one is set; holding further behind is futile),
    and when they overflow the buffer the held ones are dropped and holding starts afresh. Heartbeats
    (``HeadSeen``) and live batches raise the live edge. As soon as N passes the live edge (replay met live) while
    live is not silent, the request is cancelled: MERGED. After a fall-back, the first live batch beyond N makes
    the burst before it a known gap: counted (gaps detected, then filled when N passes it), never requested.
MERGED
    Live batches are delivered directly. A live batch starting beyond the frontier (the highest
    sequence delivered, held or requested) or, after ``tail_grace``, a heartbeat head beyond it (tail
    loss) registers a gap: RECOVERING.
RECOVERING
    Gaps are registered only at the frontier, so they never overlap and repeated detections coalesce.
    After ``gap_grace`` (the A/B skew; the other feed often fills the gap first) they are cut into
    bounded requests of at most ``max_request_span``, at most ``max_outstanding_requests`` at a time.
    A request whose range has been delivered by anyone is retired (cancelled if its answer is not
    complete). Nothing missing: MERGED.
CLOSED
    Every request cancelled; every later event ignored.

Replay only (``replay_only=True``: a subscriber without multicast). The open-ended request is the one source,
history then the live tail, and catching up does not cancel it. The IO layer asks the sidecar for its head
(a FETCH beyond every sequence: its FETCH-END names the head) several times per ``progress_timeout`` and
hands each answer on as ``HeadSeen(head, "replay")``. Those reports are this mode's heartbeats: they raise
the head and the live edge, and their silence is live silence. Merged means the multicast rule with them:
CATCHING_UP moves to MERGED (``met_head``; the request streams on) once N passes the last head reported
while reports are not silent; MERGED returns to CATCHING_UP (``fell_behind``; the request streams on) once a
reported head has stayed beyond N for ``tail_grace`` (where multicast would see a tail loss), and falls back
as below. The position must be known when it starts, so not ``Start.latest()``: that is the head + 1.

MERGED and RECOVERING fall back to CATCHING_UP (held batches dropped, requests cancelled, one open-ended
request from N) when the buffer overflows, when the lag exceeds ``max_lag`` with
``lag_policy="replay"`` (the slow consumer shifts to low gear instead of losing data), or when the live
feeds, heartbeats included, have been silent for ``progress_timeout``.

Like h11's ``_state.py`` the table has two halves. Event handlers only change the data. Transitions
``Go(guard, next state, action)``, listed per state in priority order, then move the machine: they are
re-evaluated after every event and after the timers, until none fires (like Aeron's ``ReplayMerge``, each
guard is a named predicate, and every waiting state has a progress timeout).

Requests (one ``Fetch`` each, ``gateway.merge.requests``) wait (grace or backoff) and are then issued with
a progress deadline. Progress is an answer that continues the request's coverage; it resets the deadline
and the attempt count. A request that is owed data (bounded: always; open-ended: while the head is beyond
its coverage or unknown) and makes no progress by its deadline is cancelled and re-issued, for the
remainder only, under a new id, after ``retry_backoff`` doubling up to its maximum. When the attempts
exceed ``max_retries`` the reconciler emits ``Stalled`` once and keeps retrying at the maximum backoff. A
``ReplayEnd`` that leaves part of the range uncovered counts as a failed attempt (``NoProgress(short=True)``:
the server answered, with less; a new leader's sidecar before its first commit does so). AWAIT_LIVE counts silent
periods of ``progress_timeout`` the same way (``Stalled(0, None, attempts)``, once).

The first answer. ``ReplayServers(count)`` says how many replay servers the IO layer can ask (a replicated
group's sidecars). With more than one, a request owed data and not answered yet is a failed attempt at once
(``NoProgress``: the IO layer moves to the next server) when its server has said nothing at all (no answer to
any request, no head report) for ``first_answer_timeout`` (default ``FIRST_ANSWER_S``, 0.3 s) since it was
asked. A healthy server answers within milliseconds; a paused, cut-off or dead one would otherwise hold the
range for the whole ``progress_timeout``. Answers to other requests put it off while they come (a request
queued behind a long answer); once the request has an answer of its own, ``progress_timeout`` alone applies,
so a slow but live answer is never cut. With one server there is nowhere to move: nothing changes. A
snapshot's first batch may wait for a scan of the journal: it has only the progress deadline.

Answers whose request id is unknown (cancelled, retired, voided by ``ReplayLost``) are still valid
journal data: a batch is used when it continues the stream exactly at N, and dropped otherwise (using
it elsewhere would need memory for data that a live request is delivering anyway).

``ReplayTrimmed(request_id, first_retained)`` is informational: the replay server sends it before the retained
part of the same answer. The range lost is reported as ``Loss`` at N, or held as a loss marker that the
delivery of what is due reports when N reaches it. An answer whose coverage jumps ahead of its own request's coverage
means the same (replay answers are contiguous, and a subscription from the first retained record is
never sent TRIMMED): the range jumped over is reported with reason "skipped".

A heartbeat (``HeadSeen``) of an older epoch than the newest one seen is ignored in every state and
counted (``stats.stale_heartbeats``): a replicated group's leader that was paused and deposed (docs/ha.md)
cannot move the head, fix the position or count as live. Epoch 0 is a single gateway's, never older than
another 0.

``ReplayLost`` voids every outstanding request (no ``Cancel``: the connection is gone);
``ReplayRestored`` re-issues what is still needed. Timers run after every event; ``Tick`` exists so
that they run when nothing else happens.

Example, with a batch class ``B(first_seq, last_seq)``:

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class B:
...     first_seq: int
...     last_seq: int
...     nbytes: int = 100
...     def __repr__(self) -> str:
...         return f"B({self.first_seq}, {self.last_seq})"
>>> def show(actions):
...     for action in actions:
...         print(action)

Resuming after checkpoint 4 asks replay for everything from 5 on; live is ahead and held.

>>> r = Reconciler(Start.after_seq(4))
>>> show(r.handle(Tick(), now=0.0))
Request(request_id=1, lo=5, hi=None, filtered=False, snapshot=False)
>>> show(r.handle(Live(B(9, 12), "A"), now=0.01))

Replay meets the held live batch: the overlap is trimmed and the open-ended request cancelled.

>>> show(r.handle(Replay(B(5, 10), 1), now=0.02))
Emit(batch=B(5, 10), lo=5, hi=10, source='replay')
Emit(batch=B(9, 12), lo=11, hi=12, source='live:A')
StateChanged(old=CATCHING_UP, new=MERGED)
Cancel(request_id=1)

Feed A skips 13..14: a bounded request. Feed B fills the gap first, so the request is cancelled.

>>> show(r.handle(Live(B(15, 16), "A"), now=0.03))
StateChanged(old=MERGED, new=RECOVERING)
Request(request_id=2, lo=13, hi=14, filtered=False, snapshot=False)
>>> show(r.handle(Live(B(13, 14), "B"), now=0.04))
Emit(batch=B(13, 14), lo=13, hi=14, source='live:B')
Emit(batch=B(15, 16), lo=15, hi=16, source='live:A')
Cancel(request_id=2)
StateChanged(old=RECOVERING, new=MERGED)

A heartbeat says 18 exists (``HeadSeen``). 17..18 may still be in flight: only after ``tail_grace`` is it a tail loss.

>>> show(r.handle(HeadSeen(18, "A"), now=0.05))
>>> show(r.handle(Tick(), now=0.2))
StateChanged(old=MERGED, new=RECOVERING)
Request(request_id=3, lo=17, hi=18, filtered=False, snapshot=False)

The journal no longer has 17: that is reported, never skipped silently.

>>> show(r.handle(ReplayTrimmed(3, first_retained=18), now=0.21))
Loss(lo=17, hi=17, reason='trimmed')
>>> show(r.handle(Replay(B(18, 18), 3), now=0.22))
Emit(batch=B(18, 18), lo=18, hi=18, source='replay')
StateChanged(old=RECOVERING, new=MERGED)
>>> r.next_seq, r.head, r.lag, r.stats.losses
(19, 18, 0, 1)

Without multicast the sidecar's head reports stand in for heartbeats, and the open-ended request is the live
tail: merging keeps it.

>>> t = Reconciler(Start.at_seq(1), replay_only=True)
>>> show(t.handle(Tick(), now=0.0))
Request(request_id=1, lo=1, hi=None, filtered=False, snapshot=False)
>>> show(t.handle(HeadSeen(4, "replay"), now=0.01))
>>> show(t.handle(Replay(B(1, 4), 1), now=0.02))
Emit(batch=B(1, 4), lo=1, hi=4, source='replay')
StateChanged(old=CATCHING_UP, new=MERGED)

The sidecar reports 9; the stream stays behind it for longer than ``tail_grace``, so it is catching up again.

>>> show(t.handle(HeadSeen(9, "replay"), now=0.03))
>>> show(t.handle(Tick(), now=0.2))
StateChanged(old=MERGED, new=CATCHING_UP)
>>> show(t.handle(Replay(B(5, 9), 1), now=0.21))
Emit(batch=B(5, 9), lo=5, hi=9, source='replay')
StateChanged(old=CATCHING_UP, new=MERGED)

Size: about 930 lines, kept whole: a third is this docstring (the rules, the theory of operation and its
doctest); the rest is one machine whose handlers, guards, timers and actions share its state, with its table.
The parts that keep data (held buffer, requests, position, vocabulary) are gateway.merge already.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway import machine
from gateway.merge.held import HELD_OVERHEAD_BYTES, HeldBuffer
from gateway.merge.position import Position
from gateway.merge.requests import FIRST_ANSWER_S, Fetch, RequestScheduler, RetryPolicy, SilenceWatch
from gateway.merge.stats import ReconcilerStats
from gateway.merge.vocabulary import (
    EVENT_KINDS,
    Action,
    Cancel,
    Close,
    Covering,
    Emit,
    Event,
    HeadSeen,
    LagExceeded,
    Live,
    Loss,
    NoProgress,
    Replay,
    ReplayEnd,
    ReplayLost,
    ReplayRestored,
    ReplayServers,
    ReplayTrimmed,
    Request,
    SnapshotDone,
    Stalled,
    State,
    StateChanged,
    Tick,
)

__all__ = [
    "EVENT_KINDS",
    "FIRST_ANSWER_S",
    "HELD_OVERHEAD_BYTES",
    "TRANSITIONS",
    "Action",
    "Cancel",
    "Close",
    "Covering",
    "Emit",
    "Event",
    "Go",
    "HeadSeen",
    "LagExceeded",
    "Live",
    "Loss",
    "NoProgress",
    "Reconciler",
    "ReconcilerStats",
    "Replay",
    "ReplayEnd",
    "ReplayLost",
    "ReplayRestored",
    "ReplayServers",
    "ReplayTrimmed",
    "Request",
    "Row",
    "SnapshotDone",
    "Stalled",
    "Start",
    "State",
    "StateChanged",
    "Tick",
    "describe_transitions",
]

AWAIT_LIVE = State.AWAIT_LIVE
AWAIT_EARLIEST = State.AWAIT_EARLIEST
SNAPSHOTTING = State.SNAPSHOTTING
CATCHING_UP = State.CATCHING_UP
MERGED = State.MERGED
RECOVERING = State.RECOVERING
CLOSED = State.CLOSED
_SETTLE_ROUNDS = 3  # timers-then-guards rounds per event: a bound; anything left runs at the next event
_MAX_HOPS = len(State)  # guards firing in a row within one round; more is a cycle, i.e. a bug


@dataclass(frozen=True, slots=True)
class Start:
    """Where the stream starts for this subscriber; build with the class methods.

    kind: earliest, latest, at_seq or snapshot; seq: the first sequence for at_seq (0 otherwise).
    """

    kind: Literal["earliest", "latest", "at_seq", "snapshot"]
    seq: int = 0

    @classmethod
    def earliest(cls) -> Start:
        """From the first record the journal retains."""
        return cls("earliest")

    @classmethod
    def latest(cls) -> Start:
        """Live from now: the first live batch or heartbeat fixes the position."""
        return cls("latest")

    @classmethod
    def snapshot(cls) -> Start:
        """The last record of every key (a snapshot from the replay server), then everything after it."""
        return cls("snapshot")

    @classmethod
    def at_seq(cls, seq: int) -> Start:
        """Deliver from ``seq`` on (a part the journal no longer has is reported as Loss)."""
        if seq < 1:
            raise ValueError(f"Start.at_seq({seq}): sequences start at 1; use Start.earliest() for the oldest")
        return cls("at_seq", seq)

    @classmethod
    def after_seq(cls, seq: int) -> Start:
        """Resume after checkpoint ``seq`` (the last sequence the application processed)."""
        if seq < 0:
            raise ValueError(f"Start.after_seq({seq}): a checkpoint is a sequence >= 0 (0: nothing processed)")
        return cls.at_seq(seq + 1)


class _Stream:
    """N and everything that moves it: each batch judged by its coverage alone (see the theory of
    operation), held ones delivered once N reaches them, losses reported in their place. ``out`` is the
    current event's action list; ``overflowed``: something had to be held and did not fit."""

    __slots__ = ("held", "out", "overflowed", "pos", "requests", "stats")

    def __init__(self, pos: Position, held: HeldBuffer, requests: RequestScheduler, stats: ReconcilerStats) -> None:
        self.pos, self.held, self.requests, self.stats = pos, held, requests, stats
        self.out: list[Action] = []
        self.overflowed = False

    def take(self, batch: Covering, source: str) -> bool:
        """Deliver, drop as duplicate, or hold; False only if it had to be held and did not fit."""
        n = self.pos.next
        if batch.last_seq < n:
            self.stats.duplicates_dropped += 1
            return True
        if batch.first_seq <= n:
            self.emit(batch, n, batch.last_seq, source)
            self.deliver_due()
            return True
        return self.hold(batch, source)

    def take_or_overflow(self, batch: Covering, source: str) -> None:
        """Take it; if it does not fit, say so (MERGED and RECOVERING then fall back)."""
        if not self.take(batch, source):
            self.stats.buffer_overflows += 1
            self.overflowed = True

    def hold(self, batch: Covering, source: str) -> bool:
        if self.held.holds(batch):
            self.stats.duplicates_dropped += 1
            return True
        return self.held.hold(batch, source)

    def deliver_due(self) -> None:
        """Deliver (or report lost) every held item that N has reached."""
        held, pos = self.held, self.pos
        while held.lowest <= pos.next:
            item, n = held.pop(), pos.next
            if item.last < n:
                if item.batch is not None:
                    self.stats.duplicates_dropped += 1
            elif item.batch is None:
                self.lose(n, item.last, item.source)
            else:
                self.emit(item.batch, n, item.last, item.source)

    def journal_lacks(self, fetch: Fetch, resume: int, reason: str, now: float) -> None:
        """The journal has nothing below ``resume`` for this fetch: report what was still needed."""
        n = self.pos.next
        top = resume - 1 if fetch.hi is None else min(fetch.hi, resume - 1)
        lo = max(fetch.covered_to + 1, n)
        if top > fetch.covered_to:
            self.requests.progress(fetch, top, now)
        if lo > top:
            return
        if lo == n:
            self.lose(lo, top, reason)
            self.deliver_due()
        elif not self.held.hold_loss(lo, top, reason):
            self.stats.buffer_overflows += 1
            self.overflowed = True

    def emit(self, batch: Covering, lo: int, hi: int, source: str) -> None:
        self.out.append(Emit(batch, lo, hi, source))
        stats = self.stats
        stats.delivered_batches += 1
        if source == "replay":
            stats.ranges_from_replay += hi - lo + 1
        elif source == "snapshot":
            stats.ranges_from_snapshot += hi - lo + 1
        else:
            stats.records_from_live += hi - lo + 1
        self.pos.advance(hi + 1)
        if self.requests.gaps:
            self.requests.passed(hi + 1, filled=True)

    def lose(self, lo: int, hi: int, reason: str) -> None:
        self.out.append(Loss(lo, hi, reason))
        self.stats.losses += 1
        self.stats.records_lost += hi - lo + 1
        self.pos.advance(hi + 1)
        if self.requests.gaps:
            self.requests.passed(hi + 1, filled=False)


# --- the machine -----------------------------------------------------------------------------------------


class Reconciler:
    """Sans-IO merge of live multicast and replay; see the module docstring. Its table is TRANSITIONS."""

    def __init__(
        self,
        start: Start,
        *,
        key_filter_active: bool = False,
        buffer_limit_bytes: int = 64 << 20,
        max_request_span: int = 100_000,
        max_outstanding_requests: int = 4,
        progress_timeout: float = 2.0,
        retry_backoff: tuple[float, float] = (0.05, 2.0),
        max_retries: int = 5,
        first_answer_timeout: float = FIRST_ANSWER_S,
        gap_grace: float = 0.0,
        tail_grace: float = 0.1,
        max_lag: int | None = None,
        lag_policy: Literal["replay", "raise"] = "replay",
        replay_only: bool = False,
    ) -> None:
        if gap_grace < 0 or tail_grace < 0:
            raise ValueError("Reconciler: gap_grace and tail_grace must be >= 0 seconds")
        if replay_only and start.kind == "latest":
            raise ValueError(
                "Reconciler: replay_only has no live batch to fix the position: ask the sidecar for its head and "
                "start at Start.at_seq(head + 1)"
            )
        self._replay_only = replay_only  # no multicast: the open-ended request is the live tail (theory of operation)
        self._gap_grace = gap_grace
        self._tail_grace = tail_grace
        self._stats = ReconcilerStats()
        self._policy = RetryPolicy(progress_timeout, *retry_backoff, max_retries, first_answer_timeout)
        self._held = HeldBuffer(buffer_limit_bytes)
        self._requests = RequestScheduler(
            self._policy,
            span=max_request_span,
            max_outstanding=max_outstanding_requests,
            filtered=key_filter_active,
            stats=self._stats,
        )
        self._pos = Position(max_lag, lag_policy)
        self._stream = _Stream(self._pos, self._held, self._requests, self._stats)
        self._closing = False
        self._fell_back = False  # since the last fall-back, no live batch has shown where live is
        self._behind = False  # replay only, MERGED: the head has been beyond N for tail_grace
        self._silence = SilenceWatch(self._policy)
        self._now = 0.0
        self._epoch = 0  # the newest epoch a heartbeat carried
        self._out: list[Action] = []

        if start.kind == "latest":
            self._state = AWAIT_LIVE
        elif start.kind == "earliest":
            self._state = AWAIT_EARLIEST
            self._requests.open(1)
        elif start.kind == "snapshot":
            self._state = SNAPSHOTTING
            self._requests.open(1, snapshot=True)
        else:
            self._state = CATCHING_UP
            self._pos.next = start.seq
            self._requests.open(start.seq)
        self._row = TRANSITIONS[self._state]

    # --- public surface ---------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def next_seq(self) -> int | None:
        """The next sequence to deliver; None while the position is unknown."""
        return self._pos.next or None

    @property
    def head(self) -> int:
        """The highest sequence known to exist (0: none known)."""
        return self._pos.head or 0

    @property
    def lag(self) -> int:
        """Sequences known to exist and not yet delivered (0 while the position is unknown)."""
        return self._pos.lag

    @property
    def stats(self) -> ReconcilerStats:
        return self._stats

    @property
    def buffered_bytes(self) -> int:
        """Bytes held (nbytes plus HELD_OVERHEAD_BYTES per batch); never above buffer_limit_bytes."""
        return self._held.nbytes

    @property
    def outstanding(self) -> tuple[Request, ...]:
        """Requests issued and neither answered in full, cancelled, nor voided."""
        return self._requests.outstanding()

    def handle(self, event: Event, now: float) -> list[Action]:
        """Feed one event; return the actions to execute, in order."""
        kind = type(event)
        if kind not in EVENT_KINDS:
            raise TypeError(f"Reconciler.handle: {event!r} is not an event; pass one of {EVENT_KINDS}")
        if self._state is CLOSED:
            return []
        if kind is Live or kind is Replay:
            _check_coverage(event.batch)  # type: ignore[union-attr]
        self._now = now
        out: list[Action] = []
        self._out = self._stream.out = out
        handler = self._row.on[kind]
        if handler is not None:
            handler(self, event)
        self._fire_guards()
        for _ in range(_SETTLE_ROUNDS):  # timers may enable a guard, and a new state has timers of its own
            for timer in self._row.timers:
                timer(self)
            if not self._fire_guards():
                break
        if self._pos.raise_limit is not None and self._state is not CLOSED and (lag := self._pos.lag_exceeded()):
            out.append(LagExceeded(lag))
        return out

    def _fire_guards(self) -> bool:
        """Take the current state's first transition whose guard holds, until none does; True if one was taken."""
        moved = False
        for _ in range(_MAX_HOPS):
            for guard, target, action in self._row.go:
                if guard(self):
                    self._out.append(StateChanged(self._state, target))
                    self._state, self._row = target, TRANSITIONS[target]
                    if action is not None:
                        action(self)
                    moved = True
                    break
            else:
                return moved
        raise RuntimeError(f"reconciler guards cycle in {self._state!r}: a bug in gateway/reconcile.py")

    # --- event handlers: they change data, never the state ----------------------------------------------

    def _fix_from_live(self, ev: Live) -> None:
        self._pos.saw_live(ev.batch.last_seq, self._now)
        self._pos.next = ev.batch.first_seq
        self._stream.take(ev.batch, f"live:{ev.feed}")

    def _fix_from_head(self, ev: HeadSeen) -> None:
        if self._stale(ev):
            return
        self._pos.saw_live(ev.head, self._now)
        self._pos.next = ev.head + 1

    def _stale(self, ev: HeadSeen) -> bool:
        """A heartbeat of an older epoch than one seen (a deposed leader's): counted, to be ignored."""
        if ev.epoch < self._epoch:
            self._stats.stale_heartbeats += 1
            return True
        self._epoch = ev.epoch
        return False

    def _fix_from_replay(self, ev: Replay) -> None:
        fetch = self._requests.answer_to(ev.request_id, self._now)
        if fetch is None:
            self._stats.replay_dropped += 1
            return
        self._pos.next = ev.batch.first_seq
        fetch.covered_to = max(fetch.covered_to, ev.batch.first_seq - 1)
        self._take_replay(ev)

    def _fix_from_trimmed(self, ev: ReplayTrimmed) -> None:
        fetch = self._requests.answer_to(ev.request_id, self._now)
        if fetch is not None:  # what the journal dropped was never part of "earliest": no Loss
            self._pos.next = ev.first_retained
            self._requests.progress(fetch, max(fetch.covered_to, ev.first_retained - 1), self._now)

    def _raise_head(self, ev: HeadSeen) -> None:
        if ev.feed == "replay":  # replay only: the sidecar's head report, an answer on the replay link
            self._requests.heard(self._now)
        if not self._stale(ev):
            self._pos.saw_live(ev.head, self._now)

    def _take_or_hold_live(self, ev: Live) -> None:
        """Live while replay leads: taken if it continues the stream at N, else held. The first live batch
        after a fall-back that starts beyond N shows the burst that replay is catching up: a known gap, counted
        (detected now, filled when N passes it) but not requested, as the open-ended request covers it."""
        n = self._pos.next
        if self._fell_back and n:
            self._fell_back = False
            if ev.batch.first_seq > n:
                self._requests.add_gap(n, ev.batch.first_seq - 1, self._now)
                self._requests.abandon_gaps()
        if n and ev.batch.first_seq <= n:
            self._pos.saw_live(ev.batch.last_seq, self._now)
            self._stream.take(ev.batch, f"live:{ev.feed}")
        else:
            self._hold_live(ev)

    def _hold_live(self, ev: Live) -> None:
        """Hold a live batch until N reaches it; when the buffer is full, what was held is dropped instead."""
        batch, source = ev.batch, f"live:{ev.feed}"
        self._pos.saw_live(batch.last_seq, self._now)
        if self._pos.holding_futile():
            self._stats.live_skipped += 1
        elif not self._stream.hold(batch, source):
            self._stats.buffer_overflows += 1
            self._held.clear()
            if not self._stream.hold(batch, source):
                self._stats.live_skipped += 1

    def _take_snapshot(self, ev: Replay) -> None:
        """A snapshot batch: delivered if it continues the snapshot at N; nothing held is delivered (only
        SnapshotDone makes full data due). A gap in a snapshot's coverage fails it."""
        batch, fetch, pos = ev.batch, self._requests.answer_to(ev.request_id, self._now), self._pos
        if fetch is None:
            self._stats.replay_dropped += 1  # an abandoned snapshot's answer
            return
        if not pos.next:
            pos.next = batch.first_seq
        n = pos.next
        if batch.last_seq < n:
            self._stats.duplicates_dropped += 1
        elif batch.first_seq > n:
            self._requests.fail(fetch, self._now, n, self._out, cancel=True)
        else:
            self._requests.progress(fetch, batch.last_seq, self._now)
            self._stream.emit(batch, n, batch.last_seq, "snapshot")

    def _end_snapshot(self, ev: SnapshotDone) -> None:
        fetch = self._requests.answer_to(ev.request_id, self._now)
        if fetch is None:
            return
        if not self._pos.next:  # no batch: nothing up to N0 concerns this client
            self._pos.next = ev.last + 1
        self._requests.retire(fetch, self._out, cancel=False)

    def _merge_live(self, ev: Live) -> None:
        """Live leads: a batch beyond everything accounted for reveals a gap in front of it."""
        batch, pos = ev.batch, self._pos
        pos.saw_live(batch.last_seq, self._now)
        accounted = pos.accounted
        if batch.first_seq > accounted + 1:
            self._register_gap(accounted + 1, batch.first_seq - 1, self._now + self._gap_grace)
        if batch.last_seq > pos.frontier:
            pos.frontier = batch.last_seq
        self._stream.take_or_overflow(batch, f"live:{ev.feed}")

    def _take_replay(self, ev: Replay) -> None:
        batch, fetch = ev.batch, self._requests.answer_to(ev.request_id, self._now)
        n = self._pos.next
        if fetch is None:  # a stale answer: still valid data, used only where it continues the stream
            if batch.first_seq <= n and not self._requests.was_snapshot(ev.request_id):
                self._stream.take(batch, "replay")
            else:
                self._stats.replay_dropped += 1
            return
        if batch.first_seq > max(fetch.covered_to, n - 1) + 1:  # a trim the server did not announce
            self._stream.journal_lacks(fetch, batch.first_seq, "skipped", self._now)
        if batch.last_seq > fetch.covered_to:
            self._requests.progress(fetch, batch.last_seq, self._now)
        self._stream.take_or_overflow(batch, "replay")

    def _end_fetch(self, ev: ReplayEnd) -> None:
        """A bounded answer ended: done if it covered the range, else a failed attempt."""
        fetch, n = self._requests.answer_to(ev.request_id, self._now), self._pos.next
        if fetch is None:
            return
        if fetch.hi is not None and max(fetch.covered_to, (n or 1) - 1) >= fetch.hi:
            self._requests.retire(fetch, self._out, cancel=False)
        else:
            self._requests.fail(fetch, self._now, n, self._out, cancel=False, short=True)

    def _report_trimmed(self, ev: ReplayTrimmed) -> None:
        fetch = self._requests.answer_to(ev.request_id, self._now)
        if fetch is not None:
            self._stream.journal_lacks(fetch, ev.first_retained, "trimmed", self._now)

    def _void_requests(self, ev: ReplayLost) -> None:
        self._requests.void()

    def _resume_requests(self, ev: ReplayRestored) -> None:
        self._requests.replay_ok = True

    def _count_servers(self, ev: ReplayServers) -> None:
        """More than one: a request unanswered for first_answer_timeout fails (theory of operation)."""
        self._requests.servers = ev.count

    def _request_close(self, ev: Close) -> None:
        self._closing = True

    # --- guards: named predicates, in TRANSITIONS -------------------------------------------------------

    def _close_requested(self) -> bool:
        return self._closing

    def _position_known(self) -> bool:
        return self._pos.next != 0

    def _snapshot_over(self) -> bool:
        """The snapshot ended, or it failed after part of it was delivered (the rest then comes by replay)."""
        fetches = self._requests.fetches
        return not fetches or (self._pos.next != 0 and fetches[0].request is None)

    def _met_live(self) -> bool:
        """With multicast: replay has passed what live has shown, and live is alive (else MERGED would fall back
        at once)."""
        return not self._replay_only and self._passed_live_edge()

    def _met_head(self) -> bool:
        """Replay only: N has passed the head the sidecar last reported, and it reported within progress_timeout
        (the multicast rule, with the sidecar's head reports for heartbeats)."""
        return self._replay_only and self._passed_live_edge()

    def _passed_live_edge(self) -> bool:
        edge = self._pos.live_edge
        return edge is not None and self._pos.next > edge and not self._live_silent()

    def _fell_behind(self) -> bool:
        """Replay only: the sidecar's head has been beyond N for tail_grace (`watch_tail` saw it)."""
        return self._behind

    def _buffer_overflowed(self) -> bool:
        return self._stream.overflowed

    def _too_slow(self) -> bool:
        limit = self._pos.replay_limit  # read here, not in a call: this guard runs twice per batch
        return limit is not None and self._pos.lag > limit

    def _live_silent(self) -> bool:
        return self._now - self._pos.last_live_at >= self._policy.timeout

    def _gap_pending(self) -> bool:
        return self._held.nbytes > 0 or self._requests.pending()

    def _nothing_missing(self) -> bool:
        return not self._gap_pending()

    # --- timers: run after every event, in TRANSITIONS --------------------------------------------------

    def _watch_position(self) -> None:
        """AWAIT_LIVE: no feed has spoken; count silent periods as failed attempts, Stalled once."""
        if attempts := self._silence.stalled(self._now):
            self._out.append(Stalled(0, None, attempts))
            self._stats.stalls += 1

    def _watch_tail(self) -> None:
        """A head beyond the frontier for tail_grace: with multicast a tail loss (register the gap); replay only,
        where the open-ended request is still streaming it, the stream has fallen behind (`fell_behind`)."""
        if tail := self._pos.tail_lost(self._now, self._tail_grace):
            if self._replay_only:
                self._behind = True
            else:
                self._register_gap(*tail, self._now)

    def _pump_requests(self) -> None:
        self._requests.pump(self._now, self._pos.next, self._pos.head, self._out)

    # --- actions run on a transition, in TRANSITIONS ----------------------------------------------------

    def _merge(self) -> None:
        """Live takes over: cancel what replay was streaming; everything below N is accounted."""
        self._requests.cancel_all(self._out)
        self._follow_tail()

    def _follow_tail(self) -> None:
        """Everything below N is accounted; an open-ended request left streams on (replay only: the live tail)."""
        self._pos.frontier = self._pos.next - 1
        self._pos.tail_since = None
        self._behind = False

    def _after_snapshot(self) -> None:
        """Continue as from Start.at_seq(N): one open-ended request from N; held live that N reached is due."""
        self._requests.cancel_all(self._out)
        self._requests.open(self._pos.next)
        self._stream.deliver_due()

    def _fall_back(self) -> None:
        """Low gear: forget held data and gaps, stream everything from N over replay."""
        self._shut()
        self._fell_back = True
        self._stream.overflowed = False
        self._pos.live_edge = None
        self._requests.open(self._pos.next)

    def _shut(self) -> None:
        self._requests.cancel_all(self._out)
        self._held.clear()
        self._requests.abandon_gaps()

    def _register_gap(self, lo: int, hi: int, due: float) -> None:
        """Gaps only ever start beyond the frontier, so they never overlap; adjacent ones coalesce."""
        self._requests.add_gap(lo, hi, due)
        if hi > self._pos.frontier:
            self._pos.frontier = hi


def _check_coverage(batch: Covering) -> None:
    if batch.first_seq < 1 or batch.last_seq < batch.first_seq:
        raise ValueError(
            f"batch covers {batch.first_seq}..{batch.last_seq}: sequences start at 1 and last_seq >= first_seq;"
            " fix the decoder that built it"
        )


# --- the transition table -------------------------------------------------------------------------------

Handler = Callable[[Reconciler, Any], None]
Go = machine.Go[Reconciler, State]
Row = machine.Row[Reconciler, State]

R = Reconciler
_CLOSE = Go(R._close_requested, CLOSED, R._shut)
_FALL_BACK = (
    Go(R._buffer_overflowed, CATCHING_UP, R._fall_back),
    Go(R._too_slow, CATCHING_UP, R._fall_back),
    Go(R._live_silent, CATCHING_UP, R._fall_back),
)
_REPLAY_LINK_AND_CLOSE: dict[type, Handler | None] = {
    ReplayLost: R._void_requests,
    ReplayRestored: R._resume_requests,
    ReplayServers: R._count_servers,
    Close: R._request_close,
}

TRANSITIONS: dict[State, Row] = {
    AWAIT_LIVE: Row(
        on={
            Live: R._fix_from_live,
            Replay: None,
            ReplayEnd: None,
            SnapshotDone: None,
            ReplayTrimmed: None,
            HeadSeen: R._fix_from_head,
            Tick: None,
            **_REPLAY_LINK_AND_CLOSE,
        },
        go=(_CLOSE, Go(R._position_known, MERGED, R._merge)),
        timers=(R._watch_position,),
    ),
    AWAIT_EARLIEST: Row(
        on={
            Live: R._take_or_hold_live,
            Replay: R._fix_from_replay,
            ReplayEnd: R._end_fetch,
            SnapshotDone: None,
            ReplayTrimmed: R._fix_from_trimmed,
            HeadSeen: R._raise_head,
            Tick: None,
            **_REPLAY_LINK_AND_CLOSE,
        },
        go=(_CLOSE, Go(R._position_known, CATCHING_UP)),
        timers=(R._pump_requests,),
    ),
    SNAPSHOTTING: Row(
        on={
            Live: R._hold_live,
            Replay: R._take_snapshot,
            ReplayEnd: None,
            SnapshotDone: R._end_snapshot,
            ReplayTrimmed: None,
            HeadSeen: R._raise_head,
            Tick: None,
            **_REPLAY_LINK_AND_CLOSE,
        },
        go=(_CLOSE, Go(R._snapshot_over, CATCHING_UP, R._after_snapshot)),
        timers=(R._pump_requests,),
    ),
    CATCHING_UP: Row(
        on={
            Live: R._take_or_hold_live,
            Replay: R._take_replay,
            ReplayEnd: R._end_fetch,
            SnapshotDone: None,
            ReplayTrimmed: R._report_trimmed,
            HeadSeen: R._raise_head,
            Tick: None,
            **_REPLAY_LINK_AND_CLOSE,
        },
        go=(_CLOSE, Go(R._met_live, MERGED, R._merge), Go(R._met_head, MERGED, R._follow_tail)),
        timers=(R._pump_requests,),
    ),
    MERGED: Row(
        on={
            Live: R._merge_live,
            Replay: R._take_replay,
            ReplayEnd: None,
            SnapshotDone: None,
            ReplayTrimmed: None,
            HeadSeen: R._raise_head,
            Tick: None,
            **_REPLAY_LINK_AND_CLOSE,
        },
        go=(_CLOSE, *_FALL_BACK, Go(R._fell_behind, CATCHING_UP), Go(R._gap_pending, RECOVERING)),
        timers=(R._pump_requests, R._watch_tail),
    ),
    RECOVERING: Row(
        on={
            Live: R._merge_live,
            Replay: R._take_replay,
            ReplayEnd: R._end_fetch,
            SnapshotDone: None,
            ReplayTrimmed: R._report_trimmed,
            HeadSeen: R._raise_head,
            Tick: None,
            **_REPLAY_LINK_AND_CLOSE,
        },
        go=(_CLOSE, *_FALL_BACK, Go(R._nothing_missing, MERGED)),
        timers=(R._watch_tail, R._pump_requests),
    ),
    CLOSED: Row(on={}, go=(), timers=()),
}
del R


def describe_transitions() -> str:
    """TRANSITIONS as Markdown tables (docs/reconciler.md embeds this text; a test keeps them equal)."""
    return machine.describe(TRANSITIONS, EVENT_KINDS)
