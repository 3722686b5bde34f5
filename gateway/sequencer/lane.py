"""One stream inside the gateway: records waiting to be batched, the journal writer, what its publishers are owed.

A lane's batches go three ways after the journal: multicast (once committed: at once for a single gateway, once
the in-sync followers wrote them for a node of a group), confirms (once durable), and the followers' copies.
Replication sees a lane through `ReplicaLane` (gateway.replication.strategy): its writer, and `append_replica`.

Threading contract: used by the gateway's loop only.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from gateway.journal import JournalWriter
from gateway.sequencer.producers import ProducerTable
from gateway.wire import batch as B


class Owed(NamedTuple):
    """A ZEPS publisher of records not yet sequenced: owed a PUBLISH-OK (if `confirm`) for `records` once they
    are journaled, or an INVALID if the journal refuses them."""

    identity: bytes
    records: int
    confirm: bool


class Confirm(NamedTuple):
    """A PUBLISH-OK owed to `identity` for sequences `first`..`last` once they are durable."""

    identity: bytes
    first: int
    records: int

    @property
    def last(self) -> int:
        return self.first + self.records - 1


class Journaled(NamedTuple):
    """A batch just journaled (uncommitted until the gateway's replication says, then multicast): as parsed, as
    sealed, its last sequence and journal time."""

    batch: B.Batch
    sealed: bytes
    last: int
    ts_ns: int


class Lane:
    """One stream: records waiting to be batched, the journal writer, and confirms waiting for fsync."""

    def __init__(self, stream: str, writer: JournalWriter, producers: ProducerTable) -> None:
        self.stream = stream
        self.writer = writer
        self.producers = producers  # exactly-once publishing: what each producer has journaled
        self.pending: list[tuple[int, bytes, bytes]] = []  # (ts_ns, key, body), as gateway.wire.batch encodes them
        self.pending_bytes = 0
        self.pending_since = 0.0
        self.unsequenced: list[Owed] = []  # in publish order
        self.confirms: deque[Confirm] = deque()  # in sequence order
        # Disk full: since when (None: writable), and the time before which no write is tried again.
        self.full_since: float | None = None
        self.retry_at = 0.0
        self.full_reason = ""
        self.uncommitted: deque[Journaled] = deque()  # not committed yet (a node of a group), in order

    @property
    def head(self) -> int:
        """The last sequence journaled."""
        return self.writer.last_seq

    def append_replica(self, batch: B.Batch) -> None:
        """Journal a batch of the leader's verbatim (a follower), and note its producer."""
        self.writer.append_replica(batch)
        self.producers.journaled(batch)

    def owe(self, identity: bytes, n: int, confirm: bool) -> None:
        """Add n records to what `identity` is owed, merging with its last entry when it is the same publisher."""
        owed = self.unsequenced
        if owed and owed[-1].identity == identity and owed[-1].confirm == confirm:
            owed[-1] = owed[-1]._replace(records=owed[-1].records + n)
        else:
            owed.append(Owed(identity, n, confirm))

    def forget(self) -> None:
        """A node that stopped leading: nothing pending, owed, confirmed or uncommitted any more."""
        self.pending, self.pending_bytes = [], 0
        self.unsequenced.clear()
        self.confirms.clear()
        self.uncommitted.clear()
