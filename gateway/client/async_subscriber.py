"""`AsyncSubscriber`: the asyncio face of `Subscriber`, for applications that live on an event loop.

The reconciling itself is the same object: an `AsyncSubscriber` owns a `Subscriber` and, instead of blocking
in its poll, awaits readiness of what poll would wait on (the replay connections and their monitors, and
the feeds, or with a drain its queue, which the drain's thread fills while we await) through a
`zmq.asyncio.Poller`. Then it lets the `Subscriber` take in what
arrived without waiting: each step is bounded (the Subscriber never waits on the network, and takes in a
bounded amount per turn), so the event loop is never stalled. The event loop's thread is the Subscriber's
application thread (its contract: gateway.client.subscriber); the only other thread is the feed drain.

    async with AsyncSubscriber("feed", multicast=[...], replay="tcp://...", start="earliest") as sub:
        async for rec in sub:
            ...
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from gateway.client.subscriber import TICK_S, Delivery, Received, Subscriber

T = TypeVar("T")


class AsyncSubscriber:
    """Same arguments, records, errors (`DataLoss`, `SlowConsumer`) and statistics as `Subscriber`."""

    def __init__(self, stream: str, **options: Any) -> None:
        self.sync = Subscriber(stream, **options)

    async def next(self, timeout: float | None = None) -> Received | None:
        """The next record, or None after `timeout` seconds (None: wait for ever)."""
        return await self._awaiting(self.sync.next, timeout)

    async def next_batch(self, timeout: float | None = None) -> Delivery | None:
        """The next records as one Delivery (see `Subscriber.next_batch`), or None after `timeout` seconds."""
        return await self._awaiting(self.sync.next_batch, timeout)

    async def _awaiting(self, take: Callable[[float], T | None], timeout: float | None) -> T | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (item := take(0)) is None:
            # The reconciler's timers want a look every tick even when nothing arrives.
            wait = TICK_S if deadline is None else min(TICK_S, deadline - time.monotonic())
            if wait <= 0:
                return None
            await self._readable(wait)
        return item

    async def _readable(self, timeout: float) -> None:
        pollables = self.sync.pollables()
        if self.sync.drain is not None:
            self.sync.drain.away()  # its thread reads the feeds while we await its queue
        if not pollables:  # replay only, between tries: nothing to wait on but the clock
            await asyncio.sleep(timeout)
            return
        poller = zmq.asyncio.Poller()
        for sock in pollables:
            poller.register(sock, zmq.POLLIN)
        await poller.poll(int(timeout * 1000))

    def __aiter__(self) -> AsyncIterator[Received]:
        return self._records()

    async def _records(self) -> AsyncIterator[Received]:
        while not self.sync.closed:
            item = await self.next()
            if item is not None:
                yield item

    @property
    def state(self) -> str:
        return self.sync.state

    @property
    def lag(self) -> int:
        return self.sync.lag

    def summary(self) -> dict[str, int]:
        return self.sync.summary()

    def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> AsyncSubscriber:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
