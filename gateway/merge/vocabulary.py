"""The reconciler's vocabulary: its states, the events it takes and the actions it returns.

The names are the reconciler's own and mean one thing across the code base: the IO layer turns the ZEPS
commands TRIMMED and SNAPSHOT-END (`gateway.wire.protocol`) into ``ReplayTrimmed`` and ``SnapshotDone``,
and a multicast heartbeat (`gateway.wire.heartbeat`) into ``HeadSeen``; ``Emit``, not the protocol's
DELIVER, hands records to the application.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, TypeAlias


class Covering(Protocol):
    """What the reconciler needs of a batch: its coverage, and its size for the buffer bound."""

    @property
    def first_seq(self) -> int: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


class State(enum.Enum):
    """Named states (see the theory of operation in `gateway.reconcile`)."""

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
class SnapshotDone:
    """The replay server finished a snapshot: it is the last record of every key as of ``last``."""

    request_id: int
    last: int


@dataclass(frozen=True, slots=True)
class ReplayTrimmed:
    """The journal starts at ``first_retained``; sent before the retained part of the same answer."""

    request_id: int
    first_retained: int


@dataclass(frozen=True, slots=True)
class HeadSeen:
    """A multicast feed announced ``head``, the last sequence journaled (0: none yet), as heartbeats do; a
    replicated group's leader says its ``epoch`` (0: a single gateway). Without multicast (``replay_only``)
    the replay sidecar reports its head instead, as feed "replay"."""

    head: int
    feed: str
    epoch: int = 0


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
class ReplayServers:
    """The IO layer can ask ``count`` replay servers (a replicated group's sidecars); it says so at the start and
    whenever the number changes. With more than one, a request that hears nothing within the first-answer
    deadline is a failed attempt (``NoProgress``: ask the next)."""

    count: int


@dataclass(frozen=True, slots=True)
class Close:
    """The application is done: cancel everything, ignore what follows."""


Event: TypeAlias = (
    Live
    | Replay
    | ReplayEnd
    | SnapshotDone
    | ReplayTrimmed
    | HeadSeen
    | Tick
    | ReplayLost
    | ReplayRestored
    | ReplayServers
    | Close
)
EVENT_KINDS: tuple[type[Event], ...] = (
    Live,
    Replay,
    ReplayEnd,
    SnapshotDone,
    ReplayTrimmed,
    HeadSeen,
    Tick,
    ReplayLost,
    ReplayRestored,
    ReplayServers,
    Close,
)


# --- actions ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Emit:
    """Hand the application the records of ``batch`` with ``lo <= seq <= hi``, applying the key filter."""

    batch: Covering
    lo: int
    hi: int
    source: str


@dataclass(frozen=True, slots=True)
class Request:
    """Ask the replay server for ``lo..hi`` (``hi=None``: from lo on, history then the live tail).

    ``snapshot``: ask for a snapshot instead (SNAPSHOT; ``lo`` and ``hi`` do not apply), answered by batches
    and ``SnapshotDone``.
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
class NoProgress:
    """Request ``request_id`` failed an attempt (no progress by its deadline, or an answer that left its range
    uncovered): the server that had it could not serve it. With several servers (a group's sidecars: one
    whose node is deposed, paused or behind answers, but holds nothing newer), the IO layer asks the next.

    ``short``: the server answered the request, with less than asked (a ``ReplayEnd`` short of its range), as
    a new leader's sidecar does before its first commit; False: silence (no progress by a deadline). The IO
    layer stays at a group's leader's sidecar that answered short (gateway.client.link_state)."""

    request_id: int
    short: bool = False


@dataclass(frozen=True, slots=True)
class LagExceeded:
    """The consumer is ``lag`` sequences behind the head, beyond ``max_lag`` (``lag_policy="raise"``)."""

    lag: int


@dataclass(frozen=True, slots=True)
class StateChanged:
    old: State
    new: State


Action: TypeAlias = Emit | Request | Cancel | Loss | NoProgress | Stalled | LagExceeded | StateChanged
