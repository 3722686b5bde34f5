"""A whole deployment in a namespace lab, for end-to-end tests: gateway and replay sidecar on host "gw",
publishers and subscribers on other hosts, all real processes. Functions run in lab hosts are module-level so
that `Lab.start` can pickle them by reference.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gateway.commands.publish import generated
from gateway.deployment import Deployment, Keys
from gateway.publisher import Publisher
from gateway.subscriber import DataLoss, Subscriber
from netlab import Lab

STREAM = "feed"
WAIT_S = 90.0
BODY = 100
KEYS = 100


def expected(first: int, last: int) -> list[tuple[int, bytes]]:
    """(seq, body) the generator publishes for sequences first..last of a fresh journal."""
    bodies = generated(last, BODY, KEYS, 0)
    return [(i + 1, body) for i, (_, body) in enumerate(bodies) if i + 1 >= first]


def publish(ingest: str, skip: int, count: int, rate: float, curve: Any = None) -> int | None:
    """Publish records skip..skip+count-1 of the generated load (confirmed); returns the last sequence."""
    with Publisher(ingest, STREAM, confirm=True, timeout=WAIT_S, batch_records=100, curve=curve) as pub:
        for i, (key, body) in enumerate(generated(skip + count, BODY, KEYS, 0)):
            if i < skip:
                continue
            pub.publish(key, body)
            if rate and i % 100 == 99:
                time.sleep(100 / rate)
        return pub.flush()


def subscribe(
    multicast: list[str], replay: str, start: Any, until: int, ready: Any = None, **options: Any
) -> dict[str, Any]:
    """Run a Subscriber (with `options`) until sequence `until` is delivered; returns (seq, body) pairs and the
    summary."""
    got: list[tuple[int, bytes]] = []
    losses: list[tuple[int, int]] = []
    sources: dict[str, int] = {}
    with Subscriber(STREAM, multicast=multicast, replay=replay, start=start, progress_timeout=1.0, **options) as sub:
        if ready is not None:
            ready.put("up")
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and (not got or got[-1][0] < until):
            try:
                rec = sub.next(timeout=0.5)
            except DataLoss as exc:
                losses.append((exc.lo, exc.hi))
                continue
            if rec is not None:
                got.append((rec.seq, rec.body))
                sources[rec.source] = sources.get(rec.source, 0) + 1
        return {"records": got, "losses": losses, "sources": sources, "summary": sub.summary(), "state": sub.state}


def deploy(lab: Lab, journal: Path, feeds: int = 1, keys: Keys | None = None) -> Deployment:
    return Deployment(lab, journal, STREAM, feeds=feeds, keys=keys)
