"""A whole deployment in a namespace lab, for end-to-end tests: gateway and replay sidecar on host "gw",
publishers and subscribers on other hosts, all real processes. Functions run in lab hosts are module-level so
that `Lab.start` can pickle them by reference.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from gateway.client.async_subscriber import AsyncSubscriber
from gateway.client.metrics import SubscriberMetrics
from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.errors import DataLoss
from gateway.tools.deployment import Deployment, Keys
from gateway.tools.load import generated
from netlab import Lab

STREAM = "feed"
WAIT_S = 90.0
BODY = 100
KEYS = 100


def expected(first: int, last: int) -> list[tuple[int, bytes]]:
    """(seq, body) the generator publishes for sequences first..last of a fresh journal."""
    bodies = generated(last, BODY, KEYS, 0)
    return [(i + 1, body) for i, (_, body) in enumerate(bodies) if i + 1 >= first]


def publish(ingest: str | list[str], skip: int, count: int, rate: float, curve: Any = None) -> int | None:
    """Publish records skip..skip+count-1 of the generated load (confirmed) at `ingest` (a group's: its nodes);
    returns the last sequence."""
    with Publisher(ingest, STREAM, confirm=True, timeout=WAIT_S, batch_records=100, curve=curve) as pub:
        for i, (key, body) in enumerate(generated(skip + count, BODY, KEYS, 0)):
            if i < skip:
                continue
            pub.publish(key, body)
            if rate and i % 100 == 99:
                time.sleep(100 / rate)
        return pub.flush()


def check_all(result: dict[str, Any], last: int) -> None:
    """A subscriber's result (`subscribe`) holds records 1..last of the generated load, once each, in order."""
    assert not result["losses"], result["losses"]
    got = result["records"]
    assert len(got) == last, (len(got), result["summary"])
    assert got == expected(1, last)  # every record once, in order


class _Tally:
    """What a subscriber under test delivered, for the test to compare with what was published."""

    def __init__(self, until: int) -> None:
        self.until = until
        self.got: list[tuple[int, bytes]] = []
        self.losses: list[tuple[int, int]] = []
        self.sources: dict[str, int] = {}
        self.deadline = time.monotonic() + WAIT_S

    def running(self) -> bool:
        return time.monotonic() < self.deadline and (not self.got or self.got[-1][0] < self.until)

    def take(self, rec: Any) -> None:
        if rec is not None:
            self.got.append((rec.seq, rec.body))
            self.sources[rec.source] = self.sources.get(rec.source, 0) + 1

    def result(self, sub: Subscriber | AsyncSubscriber) -> dict[str, Any]:
        return {"records": self.got, "losses": self.losses, "sources": self.sources, "summary": sub.summary(),
                "state": sub.state}  # fmt: skip


def subscribe(
    multicast: list[str],
    replay: str,
    start: Any,
    until: int,
    ready: Any = None,
    *,
    metrics: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run a Subscriber (with `options`) until sequence `until` is delivered; returns (seq, body) pairs and the
    summary (and, with `metrics`, its metrics exposition text)."""
    tally = _Tally(until)
    with Subscriber(STREAM, multicast=multicast, replay=replay, start=start, progress_timeout=1.0, **options) as sub:
        if ready is not None:
            ready.put("up")
        while tally.running():
            try:
                tally.take(sub.next(timeout=0.5))
            except DataLoss as exc:
                tally.losses.append((exc.lo, exc.hi))
        result = tally.result(sub)
        if metrics:
            result["metrics"] = generate_latest(SubscriberMetrics(sub).registry).decode()
        return result


def subscribe_async(multicast: list[str], replay: str, start: Any, until: int, ready: Any = None) -> dict[str, Any]:
    """`subscribe` on an event loop (AsyncSubscriber); the result also holds the metrics exposition text."""

    async def run() -> dict[str, Any]:
        tally = _Tally(until)
        async with AsyncSubscriber(
            STREAM, multicast=multicast, replay=replay, start=start, progress_timeout=1.0
        ) as sub:
            if ready is not None:
                ready.put("up")
            while tally.running():
                try:
                    tally.take(await sub.next(timeout=0.5))
                except DataLoss as exc:
                    tally.losses.append((exc.lo, exc.hi))
            result = tally.result(sub)
            result["metrics"] = generate_latest(SubscriberMetrics(sub.sync).registry).decode()
            return result

    return asyncio.run(run())


def deploy(lab: Lab, journal: Path, feeds: int = 1, keys: Keys | None = None, transport: str = "epgm") -> Deployment:
    return Deployment(lab, journal, STREAM, feeds=feeds, keys=keys, transport=transport)
