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

A stream named without endpoints is found in a directory first, which may take up to `discovery_timeout`: the
`Subscriber` is then built in a worker thread (asyncio.to_thread) on the first await (`async with`, `next`),
so the event loop never waits for it. Until then `state` is "resolving"; a failed resolution raises there.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Literal, TypeVar

import zmq
import zmq.asyncio

from gateway.client.directory import Directory
from gateway.client.subscriber import TICK_S, Delivery, Received, Subscriber
from gateway.errors import Closed, ZepsError
from gateway.mcast import Tuning
from gateway.transport.curve import CurveClientKeys
from gateway.wire.streamkey import StreamKey

T = TypeVar("T")


class AsyncSubscriber:
    """Same arguments as `Subscriber` (stream, multicast, replay, topics, start, checkpoint, tuning, max_lag,
    lag_policy, buffer_limit_bytes, progress_timeout, replay_timeout, stream_key, curve, view, on_replay_state,
    drain, interface, directory, discovery_timeout, fill_udp, ctx: see there), records, errors (`DataLoss`,
    `SlowConsumer`, `Closed`) and statistics. The signature repeats Subscriber's so that editors and type
    checkers see it (a test keeps the two equal)."""

    def __init__(
        self,
        stream: str,
        *,
        multicast: Sequence[str] = (),
        replay: str | Sequence[str] | None = None,
        topics: str | Sequence[str] = (),
        start: str | int | datetime | None = "latest",
        checkpoint: str | Path | None = None,
        tuning: Tuning | None = None,
        max_lag: int | None = None,
        lag_policy: Literal["replay", "raise"] = "replay",
        buffer_limit_bytes: int = 64 << 20,
        progress_timeout: float = 2.0,
        replay_timeout: float = 5.0,
        stream_key: StreamKey | Sequence[StreamKey] = (),
        curve: CurveClientKeys | None = None,
        view: bool | None = None,
        on_replay_state: Callable[[str, ZepsError | None], None] | None = None,
        drain: bool = True,
        interface: str | None = None,
        directory: Directory | None = None,
        discovery_timeout: float = 3.0,
        fill_udp: int | None = None,
        ctx: zmq.Context | None = None,
    ) -> None:
        options = {name: value for name, value in locals().items() if name not in ("self", "stream")}
        self._stream = stream
        self._open = functools.partial(Subscriber, stream, **options)
        self._sync: Subscriber | None = None
        self._opening: asyncio.Future[Subscriber] | None = None
        self._closed = False
        if multicast or replay:
            self._sync = self._open()  # nothing to resolve: built without waiting

    @property
    def sync(self) -> Subscriber:
        """The Subscriber this wraps (once resolved: after the first await)."""
        if self._sync is None:
            raise RuntimeError("the stream is not resolved yet: await next() or use `async with` first")
        return self._sync

    async def open(self) -> Subscriber:
        """The Subscriber, resolving the stream in a worker thread first if it was named without endpoints."""
        if self._sync is None:
            if self._closed:
                raise Closed(f"this AsyncSubscriber of {self._stream!r} is closed: create a new one")
            if self._opening is None:
                self._opening = asyncio.ensure_future(asyncio.to_thread(self._open))
            sync = await asyncio.shield(self._opening)
            if self._closed:  # closed while it was resolving
                sync.close()
                raise Closed(f"this AsyncSubscriber of {self._stream!r} is closed: create a new one")
            self._sync = sync
        return self._sync

    async def next(self, timeout: float | None = None) -> Received | None:
        """The next record, or None after `timeout` seconds (None: wait for ever)."""
        return await self._awaiting((await self.open()).next, timeout)

    async def next_batch(self, timeout: float | None = None) -> Delivery | None:
        """The next records as one Delivery (see `Subscriber.next_batch`), or None after `timeout` seconds."""
        return await self._awaiting((await self.open()).next_batch, timeout)

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
        self.sync.away()  # the drain's thread reads the feeds while we await its queue
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
        sync = await self.open()
        while not sync.closed:
            item = await self.next()
            if item is not None:
                yield item

    @property
    def state(self) -> str:
        return "resolving" if self._sync is None else self._sync.state

    @property
    def lag(self) -> int:
        return self.sync.lag

    def summary(self) -> dict[str, int]:
        return self.sync.summary()

    def close(self) -> None:
        self._closed = True
        if self._sync is not None:
            self._sync.close()
        elif self._opening is not None:  # resolving still: the Subscriber is closed as soon as it exists
            self._opening.add_done_callback(_close_opened)

    async def __aenter__(self) -> AsyncSubscriber:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def _close_opened(opening: asyncio.Future[Subscriber]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
