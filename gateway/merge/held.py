"""Held batches: what arrived ahead of N waits here, in order of ``first_seq``, bounded in bytes."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from gateway.merge.vocabulary import Covering

#: Bytes charged per held item on top of its nbytes, so that empty batches are bounded too.
HELD_OVERHEAD_BYTES = 64


@dataclass(slots=True)
class Held:
    """A held batch, or a loss marker (batch None) reported when N reaches it."""

    first: int
    last: int
    batch: Covering | None
    source: str  # a batch's Emit source, a marker's Loss reason
    cost: int


class HeldBuffer:
    """A min-heap of held items on ``first``, charged ``nbytes + HELD_OVERHEAD_BYTES`` each, never above
    ``limit``. One copy per coverage: a batch covering what a held batch covers is refused as a duplicate.

    ``nbytes`` is 0 exactly when nothing is held (every item costs at least HELD_OVERHEAD_BYTES).
    ``lowest`` is the smallest ``first`` held (inf when empty): the reconciler's ``deliver_due`` compares it with
    N after every in-order delivery, so it is a plain attribute.
    """

    __slots__ = ("_heap", "_keys", "_order", "limit", "lowest", "nbytes")

    def __init__(self, limit: int) -> None:
        if limit <= HELD_OVERHEAD_BYTES:
            raise ValueError(f"Reconciler: buffer_limit_bytes must exceed {HELD_OVERHEAD_BYTES}")
        self.limit = limit
        self.nbytes = 0
        self.lowest: float = math.inf
        self._heap: list[tuple[int, int, Held]] = []
        self._keys: set[tuple[int, int, bool]] = set()  # (first, last, is a loss marker)
        self._order = itertools.count()  # ties on first pop in arrival order

    def __bool__(self) -> bool:
        return bool(self._heap)

    def holds(self, batch: Covering) -> bool:
        """Whether a batch with this coverage is held already."""
        return (batch.first_seq, batch.last_seq, False) in self._keys

    def hold(self, batch: Covering, source: str) -> bool:
        """Hold ``batch`` (delivered from ``source`` later); False if it does not fit."""
        held = Held(batch.first_seq, batch.last_seq, batch, source, batch.nbytes + HELD_OVERHEAD_BYTES)
        return self._push(held, (held.first, held.last, False))

    def hold_loss(self, lo: int, hi: int, reason: str) -> bool:
        """Hold a marker: ``lo..hi`` is lost for ``reason``, to report when N reaches it; False if it does not fit."""
        return self._push(Held(lo, hi, None, reason, HELD_OVERHEAD_BYTES), (lo, hi, True))

    def pop(self) -> Held:
        """Remove and return the held item with the lowest ``first`` (the caller checked ``lowest``)."""
        heap = self._heap
        held = heapq.heappop(heap)[2]
        self._keys.discard((held.first, held.last, held.batch is None))
        self.nbytes -= held.cost
        self.lowest = heap[0][0] if heap else math.inf
        return held

    def clear(self) -> None:
        self._heap.clear()
        self._keys.clear()
        self.nbytes = 0
        self.lowest = math.inf

    def _push(self, held: Held, key: tuple[int, int, bool]) -> bool:
        if self.nbytes + held.cost > self.limit:
            return False
        heapq.heappush(self._heap, (held.first, next(self._order), held))
        self._keys.add(key)
        self.nbytes += held.cost
        if held.first < self.lowest:
            self.lowest = held.first
        return True
