"""The ZEPS side of the benchmarks: a real gateway and replay sidecar in a namespace lab, a publisher and
reconciling subscribers in other lab hosts. The functions run in lab hosts are module-level so that
`Lab.start` can pickle them by reference; each is bounded by its own deadline.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import zmq

from gateway.bench import BenchError
from gateway.bench.runner import BODY, KEYS, STREAM, cpu_seconds, stop
from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.errors import DataLoss
from gateway.mcast import Tuning
from gateway.tools.deployment import Deployment
from netlab import MP, Lab

RATE_KBPS = 1_000_000  # PGM rate, both sides: ~900k records/s of 100-byte bodies, above every target
READY_S = 30.0


@contextlib.contextmanager
def deployed(subscribers: Sequence[str], *, tmp: Path, **how: Any) -> Iterator[Deployment]:
    """A lab with hosts pub, gw and `subscribers`, the gateway and sidecar on gw (`how`: as deployed_on);
    all removed on exit."""
    with Lab(["pub", "gw", *subscribers]) as lab, deployed_on(lab, tmp=tmp, **how) as dep:
        yield dep


@contextlib.contextmanager
def deployed_on(
    lab: Lab, *, tmp: Path, transport: str = "epgm", feeds: int = 1, options: Sequence[str] = ()
) -> Iterator[Deployment]:
    """The gateway and sidecar on host gw of `lab`, with a temporary journal; stopped and removed on exit."""
    with tempfile.TemporaryDirectory(prefix="zeps-bench-", dir=tmp) as journal:
        dep = Deployment(lab, Path(journal), STREAM, transport=transport, feeds=feeds, gateway_args=list(options))
        try:
            yield dep
        finally:
            dep.close()


def gateway_options(rate_kbps: int = RATE_KBPS, *extra: str) -> list[str]:
    return ["--rate-kbps", str(rate_kbps), *extra]


def record_keys() -> list[str]:
    return [f"key{i:03d}" for i in range(KEYS)]


def publish(
    ingest: str | list[str],
    count: int,
    rate: float,
    linger_ms: float = 0.0,
    deadline_s: float = 120.0,
    many: int = 0,
) -> dict:
    """In host pub: `count` records of BODY bytes over KEYS keys, paced at `rate`/s (0: as fast as taken).

    One `publish()` per record, or with `many` one `publish_many()` per `many` records (the batch publish of
    a producer that has its records in lists: no Python per record). Not confirmed: under a burst the
    gateway's ROUTER drops PUBLISH-OK answers (docs/benchmarks.md), so a confirming publisher could wait for
    ever; the subscribers check that every record arrived instead. The own context is terminated before
    returning, which waits until ZeroMQ has handed every queued batch to the gateway: a process that ends
    without that (multiprocessing children end with os._exit) loses them. Returns the seconds and CPU
    seconds that took.
    """
    names, body = record_keys(), b"x" * BODY
    start, cpu = time.perf_counter(), time.process_time()
    with zmq.Context() as ctx, Publisher(ingest, STREAM, timeout=deadline_s, linger_ms=linger_ms, ctx=ctx) as pub:
        if many:
            _publish_many(pub, names, body, count, rate, many, start)
        else:
            for i in range(count):
                pub.publish(names[i % KEYS], body)
                if rate and i % 10 == 9:
                    _pace(start, i + 1, rate)
        pub.flush()
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu}


def _publish_many(
    pub: Publisher, names: list[str], body: bytes, count: int, rate: float, many: int, start: float
) -> None:
    """`count` records in calls of `many` (the keys in the same rotation as one by one), paced per call."""
    keys = (names * (many // KEYS + 1))[:many]  # many is a multiple of KEYS in the benchmarks: the rotation holds
    bodies = [body] * many
    done = 0
    while done < count:
        n = min(many, count - done)
        pub.publish_many(keys if n == many else keys[:n], bodies if n == many else bodies[:n])
        done += n
        if rate:
            _pace(start, done, rate)


def _pace(start: float, done: int, rate: float) -> None:
    ahead = start + done / rate - time.perf_counter()
    if ahead > 0:
        time.sleep(ahead)


def subscribe(
    multicast: list[str],
    replay: str | list[str],
    count: int,
    ready: Any,
    rate_kbps: int = RATE_KBPS,
    per_record: bool = False,
    latency: bool = False,
    deadline_s: float = 120.0,
    columnar: bool = False,
) -> dict:
    """In a subscriber host: a reconciling Subscriber from the live position, until `count` records came.

    The application walks every record: as views with `next_batch()` (the fast path), as one `Received`
    each with `next()` (`per_record`), or as arrays with `next_batch().columns()` (`columnar`). Checks that
    the records are exactly the next `count` sequences (zero missing after reconciliation) and times them from
    the first to the last; with `latency`, keeps publish -> delivery times in ns, and of each the publish ->
    journal part (the batch's journal time).
    """
    lat, journaled = array("q"), array("q")
    tuning = Tuning(rate_kbps=rate_kbps)
    with Subscriber(STREAM, multicast=multicast, replay=replay, start="latest", tuning=tuning) as sub:
        ready.put(await_position(sub))
        got = missing = disorder = deliveries = 0
        first = expect = None
        t_first = 0.0
        deadline, cpu = time.monotonic() + deadline_s, time.process_time()
        while got + missing < count and time.monotonic() < deadline:
            try:
                seqs = _next_records(sub, per_record, (lat, journaled) if latency else None, columnar)
            except DataLoss as exc:
                missing += exc.hi - exc.lo + 1
                continue
            if seqs is None:
                continue
            lo, hi, n = seqs
            if expect is None:
                first, expect, t_first = lo, lo, time.perf_counter()
            disorder += lo != expect or hi - lo + 1 != n
            expect = hi + 1
            got += n
            deliveries += 1
        return {
            "records": got,
            "missing": count - got,
            "disorder": disorder,
            "deliveries": deliveries,
            "first": first,
            "seconds": time.perf_counter() - t_first,
            "cpu": time.process_time() - cpu,
            "summary": sub.summary(),
            "pgm": sub.pgm_counters(),
            "latencies": lat.tobytes(),
            "journaled": journaled.tobytes(),
        }


def delivered(
    dep: Deployment, count: int, publish: Callable[[], Any], timeout: float = 300.0, **how: Any
) -> tuple[dict, Any, float]:
    """A reconciling subscriber (`subscribe`, with `how`) on host sub of `dep`, positioned on the live feed
    before `publish()` runs; its result, once every one of the `count` records arrived in order (BenchError if
    not), what `publish()` returned, and the gateway's CPU seconds from then until the last record arrived.
    The subscriber is stopped, by pid, whatever happens."""
    ready = MP.Queue()
    sub = dep.lab.start("sub", functools.partial(subscribe, dep.for_host("sub"), dep.replay, count, ready, **how))
    try:
        if ready.get(timeout=READY_S + 30) == "AWAIT_LIVE":
            raise BenchError("the subscriber heard no heartbeat in 30 s: multicast is not flowing in the lab")
        cpu = cpu_seconds(dep.gateway_pid)
        published = publish()
        got = sub.result(timeout=timeout)
        cpu = cpu_seconds(dep.gateway_pid) - cpu
    finally:
        stop(sub)
    if got["missing"] or got["disorder"]:
        raise BenchError(f"the reconciled subscriber missed {got['missing']} records: {got['summary']}")
    return got, published, cpu


def await_position(sub: Subscriber) -> str:
    """Until the first heartbeat fixes a "latest" subscriber's position (before anything is published)."""
    until = time.monotonic() + READY_S
    while sub.state == "AWAIT_LIVE" and time.monotonic() < until:
        sub.next(timeout=0.05)
    return sub.state


def _next_records(
    sub: Subscriber, per_record: bool, lat: tuple[array, array] | None, columnar: bool = False
) -> tuple[int, int, int] | None:
    """Take the next record(s) as the application would: (first seq, last seq, records walked) or None; with
    `lat`, append each record's publish -> delivery and publish -> journal times (ns) to its two arrays."""
    if per_record:
        rec = sub.next(timeout=0.5)
        if rec is None:
            return None
        if lat is not None:
            lat[0].append(time.time_ns() - rec.ts_ns)
        return rec.seq, rec.seq, 1
    delivery = sub.next_batch(timeout=0.5)
    if delivery is None:
        return None
    n = 0
    if columnar:  # the records as arrays: sequences, times, key and body offsets, no object per record
        n = len(delivery.columns())
    elif lat is not None:
        now, journal_ts = time.time_ns(), delivery.batch.ts_ns
        for _, ts, _, _ in delivery.raw():
            lat[0].append(now - ts)
            lat[1].append(journal_ts - ts)
            n += 1
    else:
        for _ in delivery.raw():
            n += 1
    return delivery.lo, delivery.hi, n
