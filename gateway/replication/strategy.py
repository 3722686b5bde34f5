"""How far the gateway may go with what it journaled: replication as a strategy of the gateway.

The gateway sequences and journals the same way alone or as a node of a replicated group; what differs is
asked of its `Replication`: whether it takes publishes (`leading`), how far a stream may be multicast and
announced (`committed`) and confirmed (`durable`), and what it does with each batch journaled (`journaled`).
`Solo` is a single gateway: everything journaled is committed, and it always leads. A node of a group
(gateway.replication.group.GroupNode) answers from its in-sync followers and the elector.

Threading contract: every method runs on the gateway's loop and never waits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from gateway.journal import JournalWriter
from gateway.journal.promotion import Promotion
from gateway.wire import batch as B


class ReplicaLane(Protocol):
    """What replication needs of one of the gateway's lanes (gateway.sequencer.lane.Lane)."""

    @property
    def stream(self) -> str: ...

    @property
    def writer(self) -> JournalWriter: ...

    @property
    def head(self) -> int: ...

    def append_replica(self, batch: B.Batch) -> None: ...


class Replication(Protocol):
    """What the gateway asks of its place in a group (or of being alone)."""

    poll_s: float  # the loop runs at least this often for it

    @property
    def leading(self) -> bool:
        """Whether this gateway takes publishes and multicasts."""

    @property
    def epoch(self) -> int:
        """The epoch it leads (0: none), carried in heartbeats."""

    @property
    def quorate(self) -> bool:
        """Whether it can commit at all: waiting for its followers ends by itself."""

    @property
    def due(self) -> float:
        """When the loop must run again for its timers (monotonic seconds; inf: no timer)."""

    def standing(self) -> tuple[int, bool]:
        """(epoch, leads) for announcements."""

    def refusal(self) -> str | None:
        """Why it takes no publishes (naming where to publish), or None: it takes them."""

    def committed(self, lane: ReplicaLane) -> int:
        """How far `lane` may be multicast, announced and served."""

    def durable(self, lane: ReplicaLane) -> int:
        """How far `lane` may be confirmed."""

    def journaled(self, stream: str, sealed: bytes) -> None:
        """A batch was just journaled (uncommitted until its followers have it)."""

    def promote(self, stream: str, promotion: Promotion, done: Callable[[str | None], None]) -> None:
        """Make the promotion of mirror stream `stream` the group's (docs/mirroring.md); `done(None)` once it
        is, `done(why)` if it cannot be, on the loop (at once, or from a later `tick`)."""

    def mirror_source(self, stream: str, source: str) -> None:
        """A mirror session of `stream` named `source` (MIRROR): the group's other nodes are to announce it."""

    def tick(self, now: float) -> None:
        """Before the gateway releases what is committed: hear the group, move the commit points."""

    def after_release(self, now: float) -> None:
        """After it released them: tell the group how far is committed."""

    def close(self) -> None: ...


class Solo:
    """A single gateway: what is journaled is committed at once, and it always leads."""

    poll_s = 0.05
    leading = True
    epoch = 0
    quorate = True
    due = math.inf

    def standing(self) -> tuple[int, bool]:
        return 0, False  # no group: no epoch, and no leader to announce

    def refusal(self) -> str | None:
        return None

    def committed(self, lane: ReplicaLane) -> int:
        return lane.head

    def durable(self, lane: ReplicaLane) -> int:
        return lane.writer.durable_seq

    def journaled(self, stream: str, sealed: bytes) -> None:
        """Nothing to tell: there are no followers."""

    def promote(self, stream: str, promotion: Promotion, done: Callable[[str | None], None]) -> None:
        """Nothing to tell: the gateway's own mark is the whole promotion."""
        done(None)

    def mirror_source(self, stream: str, source: str) -> None:
        """Nothing to tell: no other node announces the stream."""

    def tick(self, now: float) -> None:
        """Nothing to hear."""

    def after_release(self, now: float) -> None:
        """Nothing to tell."""

    def close(self) -> None:
        """Nothing to resign."""
