"""`AsyncPublisher`: the asyncio face of `Publisher`, for applications that live on an event loop.

The batching, numbering, reconnecting and re-sending are the same object's: an `AsyncPublisher` owns a
`Publisher`, whose IO thread does all network I/O. `publish()` only queues (no await needed unless the buffer
is full); what waits (attaching, a full buffer, flush, close) waits in a worker thread (asyncio.to_thread), so
the event loop never stalls and every wait keeps its deadline.

    async with await AsyncPublisher.attach("tcp://gw:5570", "orders") as pub:
        await pub.publish("k", b"v")
        last_seq = await pub.flush()
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from gateway.client.publisher import Publisher
from gateway.errors import BufferFull


class AsyncPublisher:
    """Same arguments, records, errors (`BadRecord`, `BufferFull`, `PublishError`) and counters as `Publisher`."""

    def __init__(self, sync: Publisher) -> None:
        """Internal: use `await AsyncPublisher.attach(...)`, which attaches without blocking the loop.

        sync: the `Publisher` this one drives (its IO thread does the network I/O); reachable as `self.sync`
        for its counters and endpoints."""
        self.sync = sync

    @classmethod
    async def attach(cls, endpoint: str | Sequence[str] | None, stream: str, **options: Any) -> AsyncPublisher:
        """Attach (Publisher's constructor, waiting up to its `timeout`; one endpoint or several) in a worker
        thread."""
        return cls(await asyncio.to_thread(Publisher, endpoint, stream, **options))

    async def publish(self, key: str, body: bytes | bytearray | memoryview, ttl: float | None = None) -> None:
        """Queue one record (see `Publisher.publish`); awaits only while the buffer is full."""
        try:
            self.sync.publish(key, body, ttl, timeout=0)
        except BufferFull:
            await asyncio.to_thread(self.sync.publish, key, body, ttl)

    async def publish_many(self, keys: Sequence[str], bodies: Sequence[bytes]) -> None:
        """Queue many records (see `Publisher.publish_many`); awaits only while the buffer is full."""
        try:
            self.sync.publish_many(keys, bodies, timeout=0)
        except BufferFull:
            await asyncio.to_thread(self.sync.publish_many, keys, bodies)

    async def flush(self, timeout: float | None = None) -> int | None:
        """Send everything queued and wait until confirmed (confirm=True) or sent; the last sequence confirmed."""
        return await asyncio.to_thread(self.sync.flush, timeout)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    def abort(self) -> None:
        self.sync.abort()

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            await self.close()
        else:
            self.abort()
