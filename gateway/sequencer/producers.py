"""Producer state: per stream, the highest record number journaled for each producer. Sans-IO.

A Publisher numbers its records (producer id, producer sequence) and re-sends whatever the gateway has not
confirmed when a connection drops; the gateway journals each batch with FLAG_PRODUCER (docs/batch-format.md)
and drops re-sent records it has journaled before, confirming them all the same. That makes publishing exactly
once across gateway crashes, as Kafka's idempotent producer does with its producer id and sequence numbers.

The state is derived data: every fact in it is in the journal (a FLAG_PRODUCER batch says whose records it
holds and their numbers), so after a kill -9 the gateway rebuilds it by feeding the journal's tail, batch by
batch, to `journaled` (Gateway._recover_producers). Nothing else needs to be written or synced.

Rules, for a batch of `count` records numbered first..first+count-1 by producer `pid`, whose highest journaled
number is `last` (none: an unknown or expired producer):

    case                           journaled                     confirmed
    unknown producer, or first>last    all                       all
    first+count-1 <= last              nothing (duplicate)       all, at the producer's last stream sequence
    first <= last < first+count-1      the records after last    all (partial overlap)

A gap (first > last + 1) is refused, retryably, as Kafka refuses an out-of-order sequence: the producer's
earlier batch was refused (a leader holding too much, a full disk) while this one, pipelined behind it, was on
its way; the publisher re-sends from the refused one, in order. Taking this one would make the refused one a
"duplicate" on its return: confirmed, never journaled, lost. The table is
bounded: a producer silent for `expiry_ns` of journal time is forgotten (as Kafka's producer.id.expiration),
and beyond `capacity` producers the least recently seen is; a forgotten producer's next batch is taken as new.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.wire.batch import Batch


@dataclass(slots=True)
class Producer:
    last_pseq: int  # the producer's number of its highest journaled record
    last_seq: int  # that record's stream sequence
    seen_ns: int  # journal time of the producer's last batch
    # The last sequence of the first batch of it this table noted: the journal holds none of its batches from the
    # table's `complete_from` up to that one but expired ones (0: not known, as for one found again after a cut).
    first_noted: int = 0


class ProducerTable:
    """One stream's producers, least recently seen first."""

    def __init__(self, expiry_ns: int, capacity: int) -> None:
        self.expiry_ns = expiry_ns
        self.capacity = capacity
        self._by_id: OrderedDict[int, Producer] = OrderedDict()  # in journal order of their last batches
        self.evicted = 0  # producers forgotten for `capacity` (not for expiry) since the table was made
        self.complete_from = 1  # every journaled batch from this sequence on was noted (recover: where it read from)

    def __len__(self) -> int:
        return len(self._by_id)

    def items(self) -> Iterator[tuple[int, Producer]]:
        """The producers, least recently seen first."""
        return iter(self._by_id.items())

    def get(self, pid: int) -> Producer | None:
        return self._by_id.get(pid)

    def duplicates(self, pid: int, first: int, count: int) -> int:
        """How many leading records of a batch numbered first..first+count-1 are journaled already (0..count)."""
        known = self._by_id.get(pid)
        if known is None or first > known.last_pseq:
            return 0
        return min(known.last_pseq - first + 1, count)

    def missing(self, pid: int, first: int) -> int | None:
        """The producer's first number not journaled, if a batch starting at `first` would leave a gap before
        it (refuse it); None if it continues the producer, overlaps it, or the producer is unknown."""
        known = self._by_id.get(pid)
        if known is None or first <= known.last_pseq + 1:
            return None
        return known.last_pseq + 1

    def journaled(self, batch: Batch) -> None:
        """Take note of a sequenced FLAG_PRODUCER batch now in the journal (live, or read back on restart)."""
        producer = batch.producer
        if producer is None or not batch.count:
            return
        pid, first = producer
        self.note(pid, first + batch.count - 1, batch.last_seq, batch.ts_ns)

    def note(self, pid: int, last_pseq: int, last_seq: int, ts_ns: int) -> None:
        """Producer `pid`'s record `last_pseq` is journaled now, at stream sequence `last_seq`, journal time
        `ts_ns` (what `journaled` reads from a batch; the gateway's live path knows it without one)."""
        known = self._by_id.get(pid)
        if known is None:
            self._by_id[pid] = Producer(last_pseq, last_seq, ts_ns, last_seq)
            while len(self._by_id) > self.capacity:
                self._by_id.popitem(last=False)
                self.evicted += 1
            return
        known.last_pseq, known.last_seq, known.seen_ns = last_pseq, last_seq, ts_ns  # updated in place, per batch
        self._by_id.move_to_end(pid)

    def forget_after(self, seq: int) -> dict[int, Producer]:
        """Forget the producers whose last batch is past stream sequence `seq` (a cut dropped it); those."""
        gone = {pid: p for pid, p in self._by_id.items() if p.last_seq > seq}
        for pid in gone:
            del self._by_id[pid]
        self.complete_from = min(self.complete_from, seq + 1)  # nothing is journaled after `seq` now
        return gone

    def restore(self, found: dict[int, Producer]) -> None:
        """Put back producers whose last batch was found again in the journal, each in its place in journal order
        (`forget_after` then `restore` leave the table as feeding the journal to `journaled` would have)."""
        if found:
            merged = [*self._by_id.items(), *found.items()]
            self._by_id = OrderedDict(sorted(merged, key=lambda item: item[1].last_seq))

    def expire(self, now_ns: int) -> int:
        """Forget producers silent since before now_ns - expiry_ns; how many were."""
        cutoff, n = now_ns - self.expiry_ns, 0
        while self._by_id:
            pid, oldest = next(iter(self._by_id.items()))
            if oldest.seen_ns >= cutoff:
                break
            del self._by_id[pid]
            n += 1
        return n
