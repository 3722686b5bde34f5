"""Record time to live (the batch format's ttl_ms): when a value expires, and a heap of expiries.

Shared by the sidecar's snapshot index and the client's last-value view, which judge TTLs the same way.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")


def expires_at(ts_ns: int, ttl_ms: int) -> int:
    """When a record published at ts_ns with ttl_ms > 0 expires (ns since the epoch)."""
    return ts_ns + ttl_ms * 1_000_000


def expired(ts_ns: int, ttl_ms: int, now_ns: int) -> bool:
    """Whether a record published at ts_ns with ttl_ms (0: none) has expired at now_ns (ns since the epoch)."""
    return ttl_ms > 0 and expires_at(ts_ns, ttl_ms) <= now_ns


class Expiries(Generic[K]):
    """When the values with a TTL of a last-value map expire: a heap of (expires_at, seq, key).

    Entries of values replaced since are not removed (that would cost a search); they are skipped when they
    come due, and the heap is rebuilt from `live()` (the map's current TTL values) once they make up more
    than half of it, so it stays within about twice the keys.
    """

    def __init__(self, live: Callable[[], Iterable[tuple[int, int, K]]]) -> None:
        self._live = live
        self._heap: list[tuple[int, int, K]] = []

    def add(self, ts_ns: int, ttl_ms: int, seq: int, key: K, keys: int) -> None:
        """A value with a TTL was stored; `keys`: how many the map holds now."""
        heapq.heappush(self._heap, (expires_at(ts_ns, ttl_ms), seq, key))
        if len(self._heap) > 2 * keys + 1024:
            self._heap = list(self._live())
            heapq.heapify(self._heap)

    def due(self, now_ns: int) -> Iterator[tuple[int, K]]:
        """(seq, key) of the entries expired at now_ns, removed as they are yielded; the caller checks that
        the key still holds that sequence."""
        heap = self._heap
        while heap and heap[0][0] <= now_ns:
            _, seq, key = heapq.heappop(heap)
            yield seq, key
