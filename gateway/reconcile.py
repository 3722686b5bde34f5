"""The reconciler: merge multicast feeds and the replay sidecar into one gap-free, in-order stream.

Rules
=====

1. Everything that decides what the application sees lives in this module, and every state change is
   listed in TRANSITIONS below, next to the event handlers, guards and timers of each state. No
   transition is made anywhere else.

2. Sans-IO: no sockets, no clocks, no threads. The caller passes every input as an event together with
   ``now`` (seconds, any monotonic origin) and executes the returned actions in order.

3. Coverage, not records. A batch covers ``first_seq..last_seq``: it accounts for every record of that
   range that concerns this client (all of them live; those matching the key filter on replay), so an
   empty batch can still cover a range. The reconciler never looks inside a batch; it emits
   ``Deliver(batch, lo, hi, source)`` and the IO layer hands the application the records of ``batch``
   with ``lo <= seq <= hi``. Work is O(1) per batch in the merged steady state.

4. Never silent, never skip on a timeout. A range is skipped only when the journal shows it is gone
   (``Trimmed``, or a replay answer jumping past it), and then it is reported as ``Loss`` in its place.
   A request that makes no progress is retried for ever (exponential backoff; ``Stalled`` once the
   retries are exhausted).

5. Every structure is bounded: held batches by ``buffer_limit_bytes``, requests by
   ``max_outstanding_requests`` and ``max_request_span``, retries by the backoff schedule.

Theory of operation
===================

One number carries the guarantee: ``next_seq`` (N). Everything below N has been delivered or reported
lost, in order, exactly once; every ``Deliver`` and ``Loss`` starts at N and moves N past its ``hi``.
Whatever the source, a batch is judged by its coverage alone:

* ``last_seq < N``: a duplicate (the other feed, a retransmit, a replay overlapping live): dropped.
* ``first_seq <= N <= last_seq``: delivered from N to ``last_seq``; held batches that have become
  contiguous are delivered after it (the drain).
* ``first_seq > N``: held (a min-heap on ``first_seq``, bounded in bytes) until N reaches it; the range in
  between is missing and must come from replay.

The states say where the missing data comes from:

AWAIT_LIVE (``Start.latest()``)
    Nothing is known. The first live batch (delivered whole) or heartbeat (head + 1) fixes N.
AWAIT_EARLIEST (``Start.earliest()``)
    One open-ended request from 1 is out; its first answer fixes N: ``Trimmed(first_retained)`` (no loss:
    what the journal dropped was never part of "earliest") or the first batch. Live batches are held.
SNAPSHOTTING (``Start.snapshot()``, docs/snapshots.md)
    One snapshot request is out: the last record of every key as of the server's N0, as batches covering
    first_retained..N0 contiguously (each range holding the records still last of their key at N0), then
    ``SnapshotEnd(N0)``. Its first batch fixes N (or, if it had none, ``SnapshotEnd``: N0 + 1); its batches
    are delivered as they come (source "snapshot"), and live is only held: a snapshot range may not follow
    a full one (a key deleted there would be missed). After ``SnapshotEnd`` the stream continues exactly as
    from ``Start.at_seq(N0 + 1)``: CATCHING_UP. A snapshot that fails once part of it is delivered is not
    asked again (a new one, as of a later N, could not continue this one); the rest of the stream is
    replayed in full from N instead, which yields the same last values. Answers to abandoned snapshots
    are dropped.
CATCHING_UP (``Start.at_seq``/``after_seq``, and every fall-back)
    Exactly one open-ended request from N is out; the replay server streams history, then the live
    tail, so replay alone keeps the stream going even with every multicast feed dead. Live batches are
    held (while the lag is at most ``max_lag / 2``, when one is set; holding further behind is futile),
    and when they overflow the buffer the held ones are dropped and holding starts afresh. Heartbeats
    and live batches raise the live edge. As soon as N passes the live edge (replay met live) while
    live is not silent, the request is cancelled: MERGED.
MERGED
    Live batches are delivered directly. A live batch starting beyond the frontier (the highest
    sequence delivered, held or requested) or, after ``tail_grace``, a heartbeat head beyond it (tail
    loss) registers a hole: RECOVERING.
RECOVERING
    Holes are registered only at the frontier, so they never overlap and repeated detections coalesce.
    After ``gap_grace`` (the A/B skew; the other feed often fills the hole first) they are cut into
    bounded requests of at most ``max_request_span``, at most ``max_outstanding_requests`` at a time.
    A request whose range has been delivered by anyone is retired (cancelled if its answer is not
    complete). Nothing missing: MERGED.
CLOSED
    Every request cancelled; every later event ignored.

MERGED and RECOVERING fall back to CATCHING_UP (held batches dropped, requests cancelled, one open-ended
request from N) when the buffer overflows, when the lag exceeds ``max_lag`` with
``lag_policy="replay"`` (the slow consumer shifts to low gear instead of losing data), or when the live
feeds, heartbeats included, have been silent for ``progress_timeout``.

Like h11's ``_state.py`` there are two kinds of transitions. Event handlers only change the data.
Guards, listed per state in priority order, then move the machine; they are re-evaluated after every
event and after the timers, until none fires. Each guard may name an action run on the transition.

Requests (one ``_Fetch`` each) wait (grace or backoff) and are then issued with a progress deadline.
Progress is an answer that continues the request's coverage; it resets the deadline and the attempt
count. A request that is owed data (bounded: always; open-ended: while the head is beyond its
coverage or unknown) and makes no progress by its deadline is cancelled and re-issued, for the
remainder only, under a new id, after ``retry_backoff`` doubling up to its maximum. When the attempts
exceed ``max_retries`` the reconciler emits ``Stalled`` once and keeps retrying at the maximum backoff.
A ``ReplayEnd`` that leaves part of the range uncovered counts as a failed attempt.

Answers whose request id is unknown (cancelled, retired, voided by ``ReplayLost``) are still valid
journal data: a batch is used when it continues the stream exactly at N, and dropped otherwise (using
it elsewhere would need memory for data that a live request is delivering anyway).

``Trimmed(request_id, first_retained)`` is informational: the replay server sends it before the retained
part of the same answer. The range lost is reported as ``Loss`` at N, or held as a loss marker that the
drain reports when N reaches it. An answer whose coverage jumps ahead of its own request's coverage
means the same (replay answers are contiguous, and a subscription from the first retained record is
never sent TRIMMED): the range jumped over is reported with reason "skipped".

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
Deliver(batch=B(5, 10), lo=5, hi=10, source='replay')
Deliver(batch=B(9, 12), lo=11, hi=12, source='live:A')
StateChanged(old=CATCHING_UP, new=MERGED)
Cancel(request_id=1)

Feed A skips 13..14: a bounded request. Feed B fills the gap first, so the request is cancelled.

>>> show(r.handle(Live(B(15, 16), "A"), now=0.03))
StateChanged(old=MERGED, new=RECOVERING)
Request(request_id=2, lo=13, hi=14, filtered=False, snapshot=False)
>>> show(r.handle(Live(B(13, 14), "B"), now=0.04))
Deliver(batch=B(13, 14), lo=13, hi=14, source='live:B')
Deliver(batch=B(15, 16), lo=15, hi=16, source='live:A')
Cancel(request_id=2)
StateChanged(old=RECOVERING, new=MERGED)

A heartbeat says 18 exists. 17..18 may still be in flight: only after ``tail_grace`` is it a tail loss.

>>> show(r.handle(Heartbeat(18, "A"), now=0.05))
>>> show(r.handle(Tick(), now=0.2))
StateChanged(old=MERGED, new=RECOVERING)
Request(request_id=3, lo=17, hi=18, filtered=False, snapshot=False)

The journal no longer has 17: that is reported, never skipped silently.

>>> show(r.handle(Trimmed(3, first_retained=18), now=0.21))
Loss(lo=17, hi=17, reason='trimmed')
>>> show(r.handle(Replay(B(18, 18), 3), now=0.22))
Deliver(batch=B(18, 18), lo=18, hi=18, source='replay')
StateChanged(old=RECOVERING, new=MERGED)
>>> r.next_seq, r.head, r.lag, r.stats.losses
(19, 18, 0, 1)
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, TypeAlias

__all__ = [
    "EVENT_KINDS",
    "HELD_OVERHEAD_BYTES",
    "TRANSITIONS",
    "Action",
    "Cancel",
    "Close",
    "Covering",
    "Deliver",
    "Event",
    "Heartbeat",
    "Live",
    "Loss",
    "Reconciler",
    "ReconcilerStats",
    "Replay",
    "ReplayEnd",
    "ReplayLost",
    "ReplayRestored",
    "Request",
    "SnapshotEnd",
    "Stalled",
    "Start",
    "State",
    "StateChanged",
    "Tick",
    "TooSlow",
    "Transitions",
    "Trimmed",
    "describe_transitions",
]

#: Bytes charged per held batch on top of its nbytes, so that empty batches are bounded too.
HELD_OVERHEAD_BYTES = 64
_SETTLE_ROUNDS = 3  # timers-then-guards rounds per event: a bound; anything left runs at the next event


class Covering(Protocol):
    """What the reconciler needs of a batch: its coverage, and its size for the buffer bound."""

    @property
    def first_seq(self) -> int: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


class State(enum.Enum):
    """Named states (see the theory of operation)."""

    AWAIT_LIVE = "await_live"
    AWAIT_EARLIEST = "await_earliest"
    SNAPSHOTTING = "snapshotting"
    CATCHING_UP = "catching_up"
    MERGED = "merged"
    RECOVERING = "recovering"
    CLOSED = "closed"

    def __repr__(self) -> str:
        # Actions are logged and compared in doctests: the bare name reads best.
        return self.name


AWAIT_LIVE = State.AWAIT_LIVE
AWAIT_EARLIEST = State.AWAIT_EARLIEST
SNAPSHOTTING = State.SNAPSHOTTING
CATCHING_UP = State.CATCHING_UP
MERGED = State.MERGED
RECOVERING = State.RECOVERING
CLOSED = State.CLOSED
_MAX_HOPS = len(State)  # guards firing in a row within one round; more is a cycle, i.e. a bug


# --- events ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Live:
    """A batch received on multicast feed ``feed`` ("A", "B", ...); live batches are dense."""

    batch: Covering
    feed: str


@dataclass(frozen=True, slots=True)
class Replay:
    """A batch of the replay server's answer to ``request_id`` (sparse when a key filter is active)."""

    batch: Covering
    request_id: int


@dataclass(frozen=True, slots=True)
class ReplayEnd:
    """The replay server finished a bounded request."""

    request_id: int


@dataclass(frozen=True, slots=True)
class SnapshotEnd:
    """The replay server finished a snapshot: it is the last record of every key as of ``last``."""

    request_id: int
    last: int


@dataclass(frozen=True, slots=True)
class Trimmed:
    """The journal starts at ``first_retained``; sent before the retained part of the same answer."""

    request_id: int
    first_retained: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A multicast heartbeat: ``head`` is the last sequence journaled (0: none yet)."""

    head: int
    feed: str


@dataclass(frozen=True, slots=True)
class Tick:
    """Nothing happened; lets the timers run."""


@dataclass(frozen=True, slots=True)
class ReplayLost:
    """The replay connection is down: every outstanding request is void."""


@dataclass(frozen=True, slots=True)
class ReplayRestored:
    """The replay connection is back: what is still needed is requested again."""


@dataclass(frozen=True, slots=True)
class Close:
    """The application is done: cancel everything, ignore what follows."""


Event: TypeAlias = (
    Live | Replay | ReplayEnd | SnapshotEnd | Trimmed | Heartbeat | Tick | ReplayLost | ReplayRestored | Close
)


# --- actions ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand the application the records of ``batch`` with ``lo <= seq <= hi``, applying the key filter."""

    batch: Covering
    lo: int
    hi: int
    source: str


@dataclass(frozen=True, slots=True)
class Request:
    """Ask the replay server for ``lo..hi`` (``hi=None``: from lo on, history then the live tail).

    ``snapshot``: ask for a snapshot instead (SNAPSHOT; ``lo`` and ``hi`` do not apply), answered by batches
    and ``SnapshotEnd``.
    """

    request_id: int
    lo: int
    hi: int | None
    filtered: bool = False
    snapshot: bool = False


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop answering ``request_id``; late answers are harmless."""

    request_id: int


@dataclass(frozen=True, slots=True)
class Loss:
    """``lo..hi`` is gone for good; the application must be told.

    ``reason``: "trimmed" (the replay server said so) or "skipped" (its answer jumped past the range, as a
    subscription from the first retained record does without a TRIMMED).
    """

    lo: int
    hi: int
    reason: str


@dataclass(frozen=True, slots=True)
class Stalled:
    """``lo..hi`` made no progress through every retry; retrying continues at the maximum backoff.

    ``lo=0, hi=None`` in AWAIT_LIVE: no live batch or heartbeat arrived to fix the position.
    """

    lo: int
    hi: int | None
    attempts: int


@dataclass(frozen=True, slots=True)
class TooSlow:
    """The consumer is ``lag`` sequences behind the head, beyond ``max_lag`` (``lag_policy="raise"``)."""

    lag: int


@dataclass(frozen=True, slots=True)
class StateChanged:
    old: State
    new: State


Action: TypeAlias = Deliver | Request | Cancel | Loss | Stalled | TooSlow | StateChanged


# --- configuration and counters --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """Where the stream starts for this subscriber; build with the class methods."""

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


@dataclass(slots=True)
class ReconcilerStats:
    """Counters for metrics; read them, do not write them."""

    delivered_batches: int = 0
    records_from_live: int = 0  # coverage delivered from live (dense: records)
    ranges_from_replay: int = 0  # coverage delivered from replay (sparse when filtered)
    ranges_from_snapshot: int = 0  # coverage delivered from a snapshot (sparse: last values only)
    gaps_detected: int = 0
    gaps_filled: int = 0  # gaps closed by delivered data (not by Loss)
    duplicates_dropped: int = 0  # batches wholly covered already
    losses: int = 0
    records_lost: int = 0
    requests: int = 0
    retries: int = 0  # requests re-issued (timeout, short answer, replay lost)
    stalls: int = 0
    buffer_overflows: int = 0
    live_skipped: int = 0  # live batches not held while catching up (lag, or too big to hold)
    replay_dropped: int = 0  # stale replay batches (unknown request id) not at N


# --- the transition table -------------------------------------------------------------------------------


class Transitions(NamedTuple):
    """One row of TRANSITIONS: everything one state does."""

    #: event kind -> handler method (None: the event means nothing here beyond running the timers)
    on: Mapping[type, str | None]
    #: (guard, next state, action run on the transition or None), first true guard wins
    when: tuple[tuple[str, State, str | None], ...]
    #: timers run after every event, in order
    timers: tuple[str, ...]


_CLOSE = ("_close_requested", CLOSED, "_shut")
_FALL_BACK = (
    ("_buffer_overflowed", CATCHING_UP, "_fall_back"),
    ("_too_slow", CATCHING_UP, "_fall_back"),
    ("_live_silent", CATCHING_UP, "_fall_back"),
)

TRANSITIONS: dict[State, Transitions] = {
    AWAIT_LIVE: Transitions(
        on={
            Live: "_fix_from_live",
            Heartbeat: "_fix_from_heartbeat",
            Replay: None,
            ReplayEnd: None,
            SnapshotEnd: None,
            Trimmed: None,
            Tick: None,
            ReplayLost: "_on_replay_lost",
            ReplayRestored: "_on_replay_restored",
            Close: "_on_close",
        },
        when=(_CLOSE, ("_position_known", MERGED, "_merge")),
        timers=("_watch_position",),
    ),
    AWAIT_EARLIEST: Transitions(
        on={
            Live: "_on_live_catching_up",
            Heartbeat: "_on_heartbeat",
            Replay: "_fix_from_replay",
            ReplayEnd: "_on_replay_end",
            SnapshotEnd: None,
            Trimmed: "_fix_from_trimmed",
            Tick: None,
            ReplayLost: "_on_replay_lost",
            ReplayRestored: "_on_replay_restored",
            Close: "_on_close",
        },
        when=(_CLOSE, ("_position_known", CATCHING_UP, None)),
        timers=("_pump_requests",),
    ),
    SNAPSHOTTING: Transitions(
        on={
            Live: "_hold_live",
            Heartbeat: "_on_heartbeat",
            Replay: "_on_snapshot",
            ReplayEnd: None,
            SnapshotEnd: "_on_snapshot_end",
            Trimmed: None,
            Tick: None,
            ReplayLost: "_on_replay_lost",
            ReplayRestored: "_on_replay_restored",
            Close: "_on_close",
        },
        when=(_CLOSE, ("_snapshot_over", CATCHING_UP, "_after_snapshot")),
        timers=("_pump_requests",),
    ),
    CATCHING_UP: Transitions(
        on={
            Live: "_on_live_catching_up",
            Heartbeat: "_on_heartbeat",
            Replay: "_on_replay",
            ReplayEnd: "_on_replay_end",
            SnapshotEnd: None,
            Trimmed: "_on_trimmed",
            Tick: None,
            ReplayLost: "_on_replay_lost",
            ReplayRestored: "_on_replay_restored",
            Close: "_on_close",
        },
        when=(_CLOSE, ("_met_live", MERGED, "_merge")),
        timers=("_pump_requests",),
    ),
    MERGED: Transitions(
        on={
            Live: "_on_live",
            Heartbeat: "_on_heartbeat",
            Replay: "_on_replay",
            ReplayEnd: None,
            SnapshotEnd: None,
            Trimmed: None,
            Tick: None,
            ReplayLost: "_on_replay_lost",
            ReplayRestored: "_on_replay_restored",
            Close: "_on_close",
        },
        when=(_CLOSE, *_FALL_BACK, ("_gap_pending", RECOVERING, None)),
        timers=("_watch_tail",),
    ),
    RECOVERING: Transitions(
        on={
            Live: "_on_live",
            Heartbeat: "_on_heartbeat",
            Replay: "_on_replay",
            ReplayEnd: "_on_replay_end",
            SnapshotEnd: None,
            Trimmed: "_on_trimmed",
            Tick: None,
            ReplayLost: "_on_replay_lost",
            ReplayRestored: "_on_replay_restored",
            Close: "_on_close",
        },
        when=(_CLOSE, *_FALL_BACK, ("_nothing_missing", MERGED, None)),
        timers=("_watch_tail", "_pump_requests"),
    ),
    CLOSED: Transitions(on={}, when=(), timers=()),
}

EVENT_KINDS: tuple[type, ...] = (
    Live,
    Replay,
    ReplayEnd,
    SnapshotEnd,
    Trimmed,
    Heartbeat,
    Tick,
    ReplayLost,
    ReplayRestored,
    Close,
)


def describe_transitions() -> str:
    """TRANSITIONS as Markdown tables (docs/reconciler.md embeds this text; a test keeps them equal)."""

    def name(method: str | None) -> str:
        return "—" if method is None else f"`{method.lstrip('_')}`"

    kinds = [k.__name__ for k in EVENT_KINDS]
    lines = [
        "| state | " + " | ".join(kinds) + " |",
        "|---" * (len(kinds) + 1) + "|",
    ]
    for state, row in TRANSITIONS.items():
        cells = [name(row.on.get(kind)) if row.on else "ignored" for kind in EVENT_KINDS]
        lines.append(f"| {state.name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| state | guard (in priority order) | next state | on transition | timers |",
        "|---|---|---|---|---|",
    ]
    for state, row in TRANSITIONS.items():
        timers = ", ".join(name(t) for t in row.timers) or "—"
        for i, (guard, target, action) in enumerate(row.when):
            lines.append(
                f"| {state.name if i == 0 else ''} | {name(guard)} | {target.name} | {name(action)} | "
                f"{timers if i == 0 else ''} |"
            )
        if not row.when:
            lines.append(f"| {state.name} | — | — | — | {timers} |")
    return "\n".join(lines) + "\n"


# --- internal records ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Fetch:
    """One needed range and the request currently asking for it (None while waiting)."""

    lo: int
    hi: int | None  # None: open-ended
    covered_to: int  # highest sequence this fetch's answers accounted for, contiguously from lo
    request: Request | None = None
    due: float = -math.inf  # waiting: when to issue; issued: the progress deadline
    attempts: int = 0  # consecutive failed attempts
    issued: int = 0
    stalled: bool = False
    idle: bool = False  # open-ended and owed nothing at the last check
    snapshot: bool = False  # asks for a snapshot (SNAPSHOTTING's one request)


@dataclass(slots=True)
class _Hole:
    """A missing range registered at the frontier, not yet cut into requests."""

    lo: int
    hi: int
    due: float


@dataclass(slots=True)
class _Held:
    """A held batch, or a loss marker (batch None) reported when N reaches it."""

    first: int
    last: int
    batch: Covering | None
    source: str  # a batch's Deliver source, a marker's Loss reason
    cost: int


# --- the machine -----------------------------------------------------------------------------------------


class Reconciler:
    """Sans-IO merge of live multicast and replay; see the module docstring."""

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
        gap_grace: float = 0.0,
        tail_grace: float = 0.1,
        max_lag: int | None = None,
        lag_policy: Literal["replay", "raise"] = "replay",
    ) -> None:
        initial, maximum = retry_backoff
        checks = [
            (buffer_limit_bytes > HELD_OVERHEAD_BYTES, f"buffer_limit_bytes must exceed {HELD_OVERHEAD_BYTES}"),
            (max_request_span >= 1, "max_request_span must be >= 1"),
            (max_outstanding_requests >= 1, "max_outstanding_requests must be >= 1"),
            (progress_timeout > 0, "progress_timeout must be > 0 seconds"),
            (0 <= initial <= maximum, "retry_backoff must be (initial, max) with 0 <= initial <= max"),
            (max_retries >= 0, "max_retries must be >= 0"),
            (gap_grace >= 0 and tail_grace >= 0, "gap_grace and tail_grace must be >= 0 seconds"),
            (max_lag is None or max_lag >= 1, "max_lag must be None (no limit) or >= 1"),
            (lag_policy in ("replay", "raise"), 'lag_policy must be "replay" or "raise"'),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"Reconciler: {message}")
        self._filtered = key_filter_active
        self._limit = buffer_limit_bytes
        self._span = max_request_span
        self._max_outstanding = max_outstanding_requests
        self._timeout = progress_timeout
        self._backoff_initial, self._backoff_max = initial, maximum
        self._max_retries = max_retries
        self._gap_grace = gap_grace
        self._tail_grace = tail_grace
        self._max_lag = max_lag
        self._lag_policy = lag_policy

        self._stats = ReconcilerStats()
        self._next: int | None = None  # N; None until the position is known
        self._head: int | None = None  # highest sequence known to exist
        self._live_edge: int | None = None  # highest sequence seen live (batches, heartbeats)
        self._last_live_at = -math.inf
        self._frontier = 0  # MERGED/RECOVERING: highest sequence held, registered or requested
        self._held: list[tuple[int, int, _Held]] = []
        self._held_keys: set[tuple[int, int, bool]] = set()
        self._held_bytes = 0
        self._order = itertools.count()
        self._holes: deque[_Hole] = deque()
        self._gap_ends: deque[int] = deque()  # his of detected gaps not yet passed, for gaps_filled
        self._fetches: list[_Fetch] = []
        self._by_id: dict[int, _Fetch] = {}
        self._ids = itertools.count(1)
        self._snapshot_ids: set[int] = set()  # every snapshot request issued: their stale answers are dropped
        self._replay_ok = True
        self._overflowed = False
        self._closing = False
        self._tail_since: float | None = None
        self._await_deadline: float | None = None
        self._await_attempts = 0
        self._slow_reported = False
        self._now = 0.0
        self._out: list[Action] = []

        self._rows = {state: _bind(self, row) for state, row in TRANSITIONS.items()}
        if start.kind == "latest":
            self._state = AWAIT_LIVE
        elif start.kind == "earliest":
            self._state = AWAIT_EARLIEST
            self._fetches.append(_Fetch(lo=1, hi=None, covered_to=0))
        elif start.kind == "snapshot":
            self._state = SNAPSHOTTING
            self._fetches.append(_Fetch(lo=1, hi=None, covered_to=0, snapshot=True))
        else:
            self._state = CATCHING_UP
            self._next = start.seq
            self._fetches.append(_Fetch(lo=start.seq, hi=None, covered_to=start.seq - 1))
        self._row = self._rows[self._state]

    # --- public surface ---------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def next_seq(self) -> int | None:
        """The next sequence to deliver; None while the position is unknown."""
        return self._next

    @property
    def head(self) -> int:
        """The highest sequence known to exist (0: none known)."""
        return self._head or 0

    @property
    def lag(self) -> int:
        """Sequences known to exist and not yet delivered (0 while the position is unknown)."""
        if self._next is None or self._head is None:
            return 0
        return max(0, self._head - (self._next - 1))

    @property
    def stats(self) -> ReconcilerStats:
        return self._stats

    @property
    def buffered_bytes(self) -> int:
        """Bytes held (nbytes plus HELD_OVERHEAD_BYTES per batch); never above buffer_limit_bytes."""
        return self._held_bytes

    @property
    def outstanding(self) -> tuple[Request, ...]:
        """Requests issued and neither answered in full, cancelled, nor voided."""
        return tuple(f.request for f in self._fetches if f.request is not None)

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
        self._out = out
        handler = self._row.on[kind]
        if handler is not None:
            handler(event)
        self._fire_guards()
        for _ in range(_SETTLE_ROUNDS):  # timers may enable a guard, and a new state has timers of its own
            self._run_timers()
            if not self._fire_guards():
                break
        self._check_lag()
        return out

    # --- guards and timers ------------------------------------------------------------------------------

    def _fire_guards(self) -> bool:
        """Apply the current state's guards until none fires; True if the state changed."""
        moved = False
        for _ in range(_MAX_HOPS):
            for guard, target, action in self._row.when:
                if guard():
                    self._out.append(StateChanged(self._state, target))
                    self._state, self._row = target, self._rows[target]
                    if action is not None:
                        action()
                    moved = True
                    break
            else:
                return moved
        raise RuntimeError(f"reconciler guards cycle in {self._state!r}: a bug in gateway/reconcile.py")

    def _run_timers(self) -> None:
        for timer in self._row.timers:
            timer()

    def _close_requested(self) -> bool:
        return self._closing

    def _position_known(self) -> bool:
        return self._next is not None

    def _snapshot_over(self) -> bool:
        """The snapshot ended, or it failed after part of it was delivered (the rest then comes by replay)."""
        return not self._fetches or (self._next is not None and self._fetches[0].request is None)

    def _met_live(self) -> bool:
        """Replay has passed what live has shown, and live is alive (else MERGED would fall back at once)."""
        return self._live_edge is not None and self._n > self._live_edge and not self._live_silent()

    def _buffer_overflowed(self) -> bool:
        return self._overflowed

    def _too_slow(self) -> bool:
        return self._lag_policy == "replay" and self._max_lag is not None and self.lag > self._max_lag

    def _live_silent(self) -> bool:
        return self._now - self._last_live_at >= self._timeout

    def _gap_pending(self) -> bool:
        return bool(self._holes or self._fetches or self._held)

    def _nothing_missing(self) -> bool:
        return not self._gap_pending()

    def _watch_position(self) -> None:
        """AWAIT_LIVE: no feed has spoken; count silent periods and report once retries would be spent."""
        now = self._now
        if self._await_deadline is None:
            self._await_deadline = now + self._timeout
        elif now >= self._await_deadline:
            self._await_attempts += 1
            self._await_deadline = now + self._timeout
            if self._await_attempts == self._max_retries + 1:
                self._stall(Stalled(0, None, self._await_attempts))

    def _watch_tail(self) -> None:
        """A head beyond the frontier for tail_grace is a tail loss: register the hole."""
        head, accounted = self._head, self._accounted
        if head is None or head <= accounted:
            self._tail_since = None
            return
        if self._tail_since is None:
            self._tail_since = self._now
        if self._now - self._tail_since >= self._tail_grace:
            self._register_hole(accounted + 1, head, self._now)
            self._tail_since = None

    def _pump_requests(self) -> None:
        """Retire satisfied requests, cut holes into new ones, issue due ones, time out stuck ones."""
        now, n = self._now, self._next
        if n is not None:
            while self._holes and self._holes[0].hi < n:  # filled (the other feed) before it was due
                self._holes.popleft()
            for f, hi in [(f, f.hi) for f in self._fetches if f.hi is not None and max(f.covered_to, n - 1) >= f.hi]:
                self._retire(f, cancel=f.covered_to < hi)
            while self._holes and len(self._fetches) < self._max_outstanding and self._holes[0].due <= now:
                hole = self._holes[0]
                lo = max(hole.lo, n)
                hi = min(hole.hi, lo + self._span - 1)
                if lo <= hi:
                    self._fetches.append(_Fetch(lo=lo, hi=hi, covered_to=lo - 1))
                if hi >= hole.hi:
                    self._holes.popleft()
                else:
                    hole.lo = hi + 1
        if not self._replay_ok:
            return
        for f in self._fetches:
            if f.request is not None:
                owed = self._owed(f)
                if not owed or f.idle:  # idle at the live tail: the clock starts once data is owed
                    f.due = now + self._timeout
                elif f.due <= now:
                    self._fail(f, cancel=True)
                f.idle = not owed
            if f.request is None and f.due <= now:
                self._issue(f)

    # --- transition actions -----------------------------------------------------------------------------

    def _merge(self) -> None:
        """Live takes over: cancel what replay was streaming; everything below N is accounted."""
        self._cancel_all()
        self._frontier = self._n - 1
        self._tail_since = None

    def _after_snapshot(self) -> None:
        """Continue as from Start.at_seq(N): one open-ended request from N; held live that N reached is due."""
        self._cancel_all()
        self._fetches.append(_Fetch(lo=self._n, hi=None, covered_to=self._n - 1))
        self._drain()

    def _fall_back(self) -> None:
        """Low gear: forget held data and holes, stream everything from N over replay."""
        self._cancel_all()
        self._drop_held()
        self._holes.clear()
        self._overflowed = False
        self._live_edge = None
        self._fetches.append(_Fetch(lo=self._n, hi=None, covered_to=self._n - 1))

    def _shut(self) -> None:
        self._cancel_all()
        self._drop_held()
        self._holes.clear()

    # --- event handlers ---------------------------------------------------------------------------------

    def _fix_from_live(self, ev: Live) -> None:
        self._saw_live(ev.batch.last_seq)
        self._next = ev.batch.first_seq
        self._take(ev.batch, f"live:{ev.feed}")

    def _fix_from_heartbeat(self, ev: Heartbeat) -> None:
        self._saw_live(ev.head)
        self._next = ev.head + 1

    def _fix_from_replay(self, ev: Replay) -> None:
        fetch = self._by_id.get(ev.request_id)
        if fetch is not None:
            self._next = ev.batch.first_seq
            fetch.covered_to = max(fetch.covered_to, self._next - 1)
            self._on_replay(ev)
        else:
            self._stats.replay_dropped += 1

    def _fix_from_trimmed(self, ev: Trimmed) -> None:
        fetch = self._by_id.get(ev.request_id)
        if fetch is not None:  # what the journal dropped was never part of "earliest": no Loss
            self._next = ev.first_retained
            self._progress(fetch, max(fetch.covered_to, ev.first_retained - 1))

    def _on_heartbeat(self, ev: Heartbeat) -> None:
        self._saw_live(ev.head)

    def _on_live_catching_up(self, ev: Live) -> None:
        if self._next is not None and ev.batch.first_seq <= self._next:
            self._saw_live(ev.batch.last_seq)
            self._take(ev.batch, f"live:{ev.feed}")
        else:
            self._hold_live(ev)

    def _hold_live(self, ev: Live) -> None:
        """Hold a live batch until N reaches it; when the buffer is full, what was held is dropped instead."""
        batch = ev.batch
        self._saw_live(batch.last_seq)
        source = f"live:{ev.feed}"
        if self._live_paused():
            self._stats.live_skipped += 1
        elif not self._hold(batch, source):
            self._stats.buffer_overflows += 1
            self._drop_held()
            if not self._hold(batch, source):
                self._stats.live_skipped += 1

    def _on_snapshot(self, ev: Replay) -> None:
        """A snapshot batch: delivered if it continues the snapshot at N; nothing held is drained (only
        SnapshotEnd makes full data due). A gap in a snapshot's coverage fails it."""
        batch, fetch = ev.batch, self._by_id.get(ev.request_id)
        if fetch is None:
            self._stats.replay_dropped += 1  # an abandoned snapshot's answer
            return
        if self._next is None:
            self._next = batch.first_seq
        n = self._next
        if batch.last_seq < n:
            self._stats.duplicates_dropped += 1
        elif batch.first_seq > n:
            self._fail(fetch, cancel=True)
        else:
            self._progress(fetch, batch.last_seq)
            self._deliver(batch, n, batch.last_seq, "snapshot")

    def _on_snapshot_end(self, ev: SnapshotEnd) -> None:
        fetch = self._by_id.get(ev.request_id)
        if fetch is None:
            return
        if self._next is None:  # no batch: nothing up to N0 concerns this client
            self._next = ev.last + 1
        self._retire(fetch, cancel=False)

    def _on_live(self, ev: Live) -> None:
        batch = ev.batch
        self._saw_live(batch.last_seq)
        accounted = self._accounted
        if batch.first_seq > accounted + 1:
            self._register_hole(accounted + 1, batch.first_seq - 1, self._now + self._gap_grace)
        self._frontier = max(self._frontier, batch.last_seq)
        if not self._take(batch, f"live:{ev.feed}"):
            self._stats.buffer_overflows += 1
            self._overflowed = True

    def _on_replay(self, ev: Replay) -> None:
        batch, fetch = ev.batch, self._by_id.get(ev.request_id)
        n = self._n
        if fetch is None:  # a stale answer: still valid data, used only where it continues the stream
            if batch.first_seq <= n and ev.request_id not in self._snapshot_ids:
                self._take(batch, "replay")
            else:
                self._stats.replay_dropped += 1
            return
        if batch.first_seq > max(fetch.covered_to, n - 1) + 1:  # a trim the server did not announce
            self._journal_lacks(fetch, batch.first_seq, "skipped")
        if batch.last_seq > fetch.covered_to:
            self._progress(fetch, batch.last_seq)
        if not self._take(batch, "replay"):
            self._stats.buffer_overflows += 1
            self._overflowed = True

    def _on_replay_end(self, ev: ReplayEnd) -> None:
        fetch = self._by_id.get(ev.request_id)
        if fetch is None:
            return
        if fetch.hi is not None and max(fetch.covered_to, (self._next or 1) - 1) >= fetch.hi:
            self._retire(fetch, cancel=False)
        else:
            self._fail(fetch, cancel=False)

    def _on_trimmed(self, ev: Trimmed) -> None:
        fetch = self._by_id.get(ev.request_id)
        if fetch is not None:
            self._journal_lacks(fetch, ev.first_retained, "trimmed")

    def _on_replay_lost(self, ev: ReplayLost) -> None:
        self._replay_ok = False
        for f in self._fetches:
            if f.request is not None:
                del self._by_id[f.request.request_id]
                f.request = None
                f.due = -math.inf

    def _on_replay_restored(self, ev: ReplayRestored) -> None:
        self._replay_ok = True

    def _on_close(self, ev: Close) -> None:
        self._closing = True

    # --- data helpers -----------------------------------------------------------------------------------

    @property
    def _n(self) -> int:
        """N where the state guarantees it is known."""
        assert self._next is not None, f"next_seq unknown in {self._state!r}"
        return self._next

    @property
    def _accounted(self) -> int:
        """Highest sequence delivered, held, or requested (MERGED/RECOVERING)."""
        return max(self._frontier, self._n - 1)

    def _journal_lacks(self, fetch: _Fetch, resume: int, reason: str) -> None:
        """The journal has nothing below ``resume`` for this request: report what was still needed."""
        n = self._n
        top = resume - 1 if fetch.hi is None else min(fetch.hi, resume - 1)
        lo = max(fetch.covered_to + 1, n)
        if top > fetch.covered_to:
            self._progress(fetch, top)
        if lo > top:
            return
        if lo == n:
            self._lose(lo, top, reason)
            self._drain()
        elif not self._push(_Held(lo, top, None, reason, HELD_OVERHEAD_BYTES), (lo, top, True)):
            self._stats.buffer_overflows += 1
            self._overflowed = True

    def _saw_live(self, seq: int) -> None:
        self._head = seq if self._head is None else max(self._head, seq)
        self._live_edge = seq if self._live_edge is None else max(self._live_edge, seq)
        self._last_live_at = self._now

    def _live_paused(self) -> bool:
        """Catching up with a lag policy of "replay": holding live this far behind is futile."""
        return self._lag_policy == "replay" and self._max_lag is not None and self.lag > self._max_lag / 2

    def _take(self, batch: Covering, source: str) -> bool:
        """Deliver, drop as duplicate, or hold; False only if it had to be held and did not fit."""
        n = self._n
        if batch.last_seq < n:
            self._stats.duplicates_dropped += 1
            return True
        if batch.first_seq <= n:
            self._deliver(batch, n, batch.last_seq, source)
            self._drain()
            return True
        return self._hold(batch, source)

    def _hold(self, batch: Covering, source: str) -> bool:
        key = (batch.first_seq, batch.last_seq, False)
        if key in self._held_keys:
            self._stats.duplicates_dropped += 1
            return True
        held = _Held(batch.first_seq, batch.last_seq, batch, source, batch.nbytes + HELD_OVERHEAD_BYTES)
        return self._push(held, key)

    def _push(self, held: _Held, key: tuple[int, int, bool]) -> bool:
        if self._held_bytes + held.cost > self._limit:
            return False
        heapq.heappush(self._held, (held.first, next(self._order), held))
        self._held_keys.add(key)
        self._held_bytes += held.cost
        return True

    def _drain(self) -> None:
        """Deliver (or report lost) every held item that N has reached."""
        while self._held and self._held[0][0] <= self._n:
            held = heapq.heappop(self._held)[2]
            self._held_keys.discard((held.first, held.last, held.batch is None))
            self._held_bytes -= held.cost
            n = self._n
            if held.last < n:
                if held.batch is not None:
                    self._stats.duplicates_dropped += 1
            elif held.batch is None:
                self._lose(n, held.last, held.source)
            else:
                self._deliver(held.batch, n, held.last, held.source)

    def _drop_held(self) -> None:
        self._held.clear()
        self._held_keys.clear()
        self._held_bytes = 0

    def _deliver(self, batch: Covering, lo: int, hi: int, source: str) -> None:
        self._out.append(Deliver(batch, lo, hi, source))
        stats = self._stats
        stats.delivered_batches += 1
        if source == "replay":
            stats.ranges_from_replay += hi - lo + 1
        elif source == "snapshot":
            stats.ranges_from_snapshot += hi - lo + 1
        else:
            stats.records_from_live += hi - lo + 1
        self._advance(hi + 1, filled=True)

    def _lose(self, lo: int, hi: int, reason: str) -> None:
        self._out.append(Loss(lo, hi, reason))
        self._stats.losses += 1
        self._stats.records_lost += hi - lo + 1
        self._advance(hi + 1, filled=False)

    def _advance(self, n: int, *, filled: bool) -> None:
        self._next = n
        if self._head is None or self._head < n - 1:
            self._head = n - 1
        while self._gap_ends and self._gap_ends[0] < n:
            self._gap_ends.popleft()
            self._stats.gaps_filled += filled

    def _register_hole(self, lo: int, hi: int, due: float) -> None:
        """Holes only ever start at the frontier, so they never overlap; adjacent ones coalesce."""
        if self._holes and self._holes[-1].hi + 1 == lo:
            self._holes[-1].hi = hi
            self._gap_ends[-1] = hi
        else:
            self._holes.append(_Hole(lo, hi, due))
            self._gap_ends.append(hi)
            self._stats.gaps_detected += 1
        self._frontier = max(self._frontier, hi)

    # --- request helpers --------------------------------------------------------------------------------

    def _owed(self, fetch: _Fetch) -> bool:
        """Whether silence from this request means it is stuck rather than idle at the live tail."""
        if fetch.hi is not None or fetch.snapshot or self._head is None:
            return True
        return self._head > max(fetch.covered_to, (self._next or 1) - 1)

    def _issue(self, fetch: _Fetch) -> None:
        rid = next(self._ids)
        lo = max(fetch.covered_to + 1, self._next or 1)
        fetch.request = Request(rid, lo, fetch.hi, self._filtered, fetch.snapshot)
        if fetch.snapshot:
            self._snapshot_ids.add(rid)
        fetch.due = self._now + self._timeout
        self._by_id[rid] = fetch
        self._out.append(fetch.request)
        self._stats.requests += 1
        self._stats.retries += fetch.issued > 0
        fetch.issued += 1

    def _progress(self, fetch: _Fetch, covered_to: int) -> None:
        fetch.covered_to = covered_to
        fetch.due = self._now + self._timeout
        fetch.attempts = 0
        fetch.stalled = False

    def _fail(self, fetch: _Fetch, *, cancel: bool) -> None:
        """A timeout or a short answer: drop this request, re-issue the remainder after the backoff."""
        assert fetch.request is not None
        rid = fetch.request.request_id
        del self._by_id[rid]
        if cancel:
            self._out.append(Cancel(rid))
        fetch.request = None
        fetch.attempts += 1
        k = fetch.attempts
        if k > self._max_retries:
            delay = self._backoff_max
            if not fetch.stalled:
                fetch.stalled = True
                lo = max(fetch.covered_to + 1, self._next or 1)
                self._stall(Stalled(lo, fetch.hi, k))
        else:
            delay = min(self._backoff_initial * 2 ** (k - 1), self._backoff_max)
        fetch.due = self._now + delay

    def _stall(self, action: Stalled) -> None:
        self._out.append(action)
        self._stats.stalls += 1

    def _retire(self, fetch: _Fetch, *, cancel: bool) -> None:
        self._fetches.remove(fetch)
        if fetch.request is not None:
            del self._by_id[fetch.request.request_id]
            if cancel:
                self._out.append(Cancel(fetch.request.request_id))

    def _cancel_all(self) -> None:
        for fetch in self._fetches:
            if fetch.request is not None:
                self._out.append(Cancel(fetch.request.request_id))
        self._fetches.clear()
        self._by_id.clear()

    def _check_lag(self) -> None:
        if self._lag_policy != "raise" or self._max_lag is None or self._state is CLOSED:
            return
        lag = self.lag
        if lag <= self._max_lag:
            self._slow_reported = False
        elif not self._slow_reported:
            self._slow_reported = True
            self._out.append(TooSlow(lag))


class _BoundRow(NamedTuple):
    """A TRANSITIONS row with its method names resolved on one reconciler (dispatch without getattr)."""

    on: dict[type, Callable[[Any], None] | None]
    when: tuple[tuple[Callable[[], bool], State, Callable[[], None] | None], ...]
    timers: tuple[Callable[[], None], ...]


def _bind(rec: Reconciler, row: Transitions) -> _BoundRow:
    def method(name: str | None) -> Callable[..., Any] | None:
        return None if name is None else getattr(rec, name)

    return _BoundRow(
        on={kind: method(name) for kind, name in row.on.items()},
        when=tuple((getattr(rec, guard), target, method(action)) for guard, target, action in row.when),
        timers=tuple(getattr(rec, timer) for timer in row.timers),
    )


def _check_coverage(batch: Covering) -> None:
    if batch.first_seq < 1 or batch.last_seq < batch.first_seq:
        raise ValueError(
            f"batch covers {batch.first_seq}..{batch.last_seq}: sequences start at 1 and last_seq >= first_seq;"
            " fix the decoder that built it"
        )
