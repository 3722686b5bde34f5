"""Scenario: fan-in, many small publishers into one gateway (the telemetry shape, issue #32), against one
publisher at the same total rate.

One lab: host pub runs the publishers, host gw the gateway and sidecar (epgm://, default settings), host sub a
reconciling `Subscriber` taking `next_batch()`. Many: 1,000 Publishers (one connection each, default
settings), spread over 4 processes on pub, each publishing 10 records/s (100-byte bodies),
their turns interleaved so that the gateway sees an even stream; every one is attached before the first
record, so the run measures publishing, not connecting. One: a single Publisher at the same total rate, in
the same lab and run, right before. Each case publishes for 20 s. Latency is the subscriber's clock at delivery minus
the record's publish time (one machine, one clock), over the records after the first tenth of the case (2 s at
most: the warm-up, excluded); the gateway's CPU time (user + system, all threads, from /proc) over the case,
divided by its records, is its cost per record, and so is each part of it: its loop's thread (ingest, journal,
confirms), ZeroMQ's IO thread (the connections: every command in, every confirm out, the ZMTP heartbeats), and
the others (the multicast sender, the journal's syncer). Every record must arrive, in order.

The gateway runs with its defaults but `--max-clients` 4,000 and `--client-timeout` 10 s. The default limit,
1,024, lets the 1,000 publishers in while none reconnects; but a publisher whose connection drops (its ZMTP
heartbeat unanswered for 500 ms, as happens on a loaded machine) reconnects as a new ROUTER identity, and its
old session counts against the limit until it has been silent for `--client-timeout` (60 s by default): at load
average 12-16, over 1,000 reconnects came within a minute of attaching. The table counts the reconnects.
The gateway raises its soft open-files limit to fit `--max-clients` connections (gateway.transport.descriptors); a
publishing process holds a few descriptors per Publisher (its socket, ZeroMQ mailboxes, the IO thread's
eventfd), and the benchmark raises its own limit the same way (its processes inherit it), failing with the fix
named if it cannot.
"""

from __future__ import annotations

import queue
import time
from typing import Any

import zmq

from gateway.bench import BenchError, pipeline
from gateway.bench.runner import (
    BODY,
    STREAM,
    Progress,
    Result,
    Settings,
    Stat,
    Table,
    Target,
    percentiles,
    repeat,
    stop,
    thread_cpu_seconds,
    times,
)
from gateway.client.publisher import Publisher
from gateway.tools.deployment import Deployment
from gateway.transport.descriptors import make_room
from netlab import MP, HostProcess

TITLE = "Fan-in: 1,000 small publishers into one gateway, against one publisher at the same rate"
PUBLISHERS = 1_000
PROCESSES = 4
RATE_EACH = 10.0  # records/s per small publisher
SECONDS = 20.0  # of publishing per case (quick: 2 s)
# ZeroMQ sockets per Publisher in a publishing process: its DEALER and its monitor's pair, and while it reconnects
# the ones closing (libzmq's reaper frees them later): seen to exceed 4 per Publisher ("Too many open files" from
# the context's socket limit) in a reconnect storm on a loaded machine.
SOCKETS_PER_PUBLISHER = 16
FDS_PER_PUBLISHER = 2 * SOCKETS_PER_PUBLISHER + 1  # a mailbox and a connection per socket; the IO thread's eventfd
TARGET_CPU_RATIO = 2.0
TARGET_P99_MS = 2.0
COLUMNS = ("p50", "p99")
WARM_UP = 0.1  # of each case's records, their latencies excluded (at most WARM_UP_S of them)
WARM_UP_S = 2.0
THREADS = ("main", "zmq-io", "other")  # the gateway's threads by role (runner.thread_cpu_seconds)
LATE_S = 120.0  # how long after its last record a case may take to deliver everything (a loaded machine's)
ATTACH_S = 180.0  # for every publisher to attach: 1,000 take 5-20 s on a loaded 2-core machine
# Room for the sessions of connections that dropped: a publisher whose connection drops (its ZMTP heartbeat, 500
# ms, unanswered on a loaded machine) reconnects as a new ROUTER identity, and the old session counts against the
# limit until it has been silent for --client-timeout (60 s by default). Seen at load average 12-16: over 1,000
# reconnects within a minute of attaching 1,000 publishers. So: room for 4,000, and at that limit the sessions
# silent for 10 s make room (never a publishing one: each publishes every 0.1 s).
MAX_CLIENTS = 4 * PUBLISHERS
CLIENT_TIMEOUT = "10s"
CASES = ("one publisher", f"{PUBLISHERS:,} publishers")


def estimate(settings: Settings) -> float:
    seconds = 2.0 if settings.quick else SECONDS
    return 30 + settings.runs * (2 * seconds + 60)


def run(settings: Settings) -> Result:
    progress = Progress("fanin")
    seconds = 2.0 if settings.quick else SECONDS
    total_rate = PUBLISHERS * RATE_EACH
    count = int(total_rate * seconds)
    if (short := make_room(PUBLISHERS // PROCESSES * FDS_PER_PUBLISHER + 256)) is not None:
        raise BenchError(f"the fan-in benchmark's publishing processes: {short}")
    failures: list[str] = []
    options = pipeline.gateway_options(pipeline.RATE_KBPS, "--max-clients", str(MAX_CLIENTS),
                                       "--client-timeout", CLIENT_TIMEOUT)  # fmt: skip
    with pipeline.deployed(["sub"], tmp=settings.tmp, options=options) as dep:
        stats = repeat(settings.runs, progress, f"one, then {PUBLISHERS:,} publishers, {count:,} records at "
                       f"{total_rate:,.0f}/s", lambda _: _both(dep, count, seconds), failures)  # fmt: skip
    rows = [
        (
            case,
            *(Stat.of(stats.get(f"{case}: {c}"), "ms", 2) for c in COLUMNS),
            Stat.of(stats.get(f"{case}: gw_us"), digits=2),
            *(Stat.of(stats.get(f"{case}: gw_{role}_us"), digits=2) for role in THREADS),
            Stat.of(stats.get(f"{case}: pub_us"), digits=2),
            Stat.of(stats.get(f"{case}: batch_records"), digits=1),
            Stat.of(stats.get(f"{case}: reconnects")),
        )
        for case in CASES
    ]
    cpu_ratio = Stat.of(stats.get(f"{CASES[1]}: gw_us")).median / Stat.of(stats.get(f"{CASES[0]}: gw_us")).median
    p99 = Stat.of(stats.get(f"{CASES[1]}: p99"), "ms", 2)
    return Result(
        "fanin",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"publish -> delivery and CPU per record, {count:,} records at {total_rate:,.0f} records/s "
                f"({seconds:g} s); many: {PUBLISHERS:,} publishers at {RATE_EACH:g}/s in {PROCESSES} processes",
                (
                    "case",
                    *COLUMNS,
                    "gateway CPU µs/record",
                    "of it: loop",
                    "ZeroMQ IO",
                    "other threads",
                    "publishers' CPU µs/record",
                    "records per batch",
                    "reconnects",
                ),
                rows,
            )
        ],
        targets=[
            Target(
                f"gateway CPU per record with {PUBLISHERS:,} publishers at most {TARGET_CPU_RATIO:g}x one publisher's",
                f"{cpu_ratio:.2f}x",
                cpu_ratio <= TARGET_CPU_RATIO,
            ),
            Target(
                f"p99 under {TARGET_P99_MS:g} ms with {PUBLISHERS:,} publishers", str(p99), p99.median < TARGET_P99_MS
            ),
        ],
        notes=failures,
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
        issue=32,
    )


def _both(dep: Deployment, count: int, seconds: float) -> dict[str, float]:
    """One run: one publisher, then the many, back to back (alternated over runs on a shared machine); the
    metrics of each named "CASE: metric"."""
    out: dict[str, float] = {}
    for case, once in zip(CASES, (_one, _many), strict=True):
        out.update({f"{case}: {key}": value for key, value in once(dep, count, seconds).items()})
    return out


def _one(dep: Deployment, count: int, seconds: float) -> dict[str, float]:
    def publish(go_at: float) -> list[dict]:
        del go_at  # starts at once
        return [dep.lab.run("pub", pipeline.publish, dep.ingest, count, count / seconds, timeout=seconds + LATE_S)]

    return _case(dep, count, seconds, publish)


def _many(dep: Deployment, count: int, seconds: float) -> dict[str, float]:
    ready, go = MP.Queue(), MP.Queue()
    each = PUBLISHERS // PROCESSES
    procs = [dep.lab.start("pub", publish_small, dep.ingest, each, RATE_EACH, seconds, ready, go)
             for _ in range(PROCESSES)]  # fmt: skip

    def publish(go_at: float) -> list[dict]:
        for _ in procs:
            go.put(go_at)
        return [proc.result(timeout=seconds + LATE_S) for proc in procs]

    try:
        _await_attached(procs, ready)
        out = _case(dep, count, seconds, publish)
    finally:
        stop(*procs)
    return out


def _await_attached(procs: list[HostProcess], ready: Any) -> None:
    """Until every publishing process has its publishers attached (each says so on `ready`); a process that
    died meanwhile raises its error at once, and the wait is bounded by ATTACH_S."""
    attached, deadline = 0, time.monotonic() + ATTACH_S
    while attached < len(procs):
        try:
            ready.get(timeout=1.0)
            attached += 1
        except queue.Empty:
            for proc in procs:
                if not proc.is_alive():
                    proc.result(timeout=0)  # raises what ended it
            if time.monotonic() > deadline:
                raise BenchError(f"{len(procs) - attached} of {len(procs)} publishing processes not attached in "
                                 f"{ATTACH_S:g} s: the machine is too loaded") from None  # fmt: skip


def _case(dep: Deployment, count: int, seconds: float, publish: Any) -> dict[str, float]:
    """One case: the subscriber up, `publish(start time)` (the publishers' results), delivery checked."""
    before: dict[str, float] = {}

    def timed() -> list[dict]:
        before.update(thread_cpu_seconds(dep.gateway_pid))
        return publish(time.time() + 0.5)

    got, results, gw_cpu = pipeline.delivered(dep, count, timed, seconds + LATE_S + 30, latency=True,
                                              deadline_s=seconds + LATE_S)  # fmt: skip
    threads = thread_cpu_seconds(dep.gateway_pid)
    warm = int(min(count * WARM_UP, count / seconds * WARM_UP_S))
    return {
        **percentiles(times(got["latencies"])[warm:], (50.0, 99.0)),
        "gw_us": gw_cpu / count * 1e6,
        **{f"gw_{role}_us": (threads[role] - before[role]) / count * 1e6 for role in THREADS},
        "pub_us": sum(p["cpu"] for p in results) / count * 1e6,
        "batch_records": count / got["deliveries"],
        "reconnects": sum(p.get("reconnects", 0) for p in results),
    }


def publish_small(
    ingest: str, publishers: int, rate_each: float, seconds: float, ready: Any, go: Any, deadline_s: float = 120.0
) -> dict:
    """In host pub: `publishers` Publishers (default settings, one ZeroMQ context), each attached; told it is
    ready, wait for the start time from `go`, then publish `rate_each` records/s from each for `seconds`, their
    turns interleaved (publisher i's k-th record at (k + i / publishers) / rate_each). Returns the CPU seconds
    that took (attaching excluded)."""
    names, body = pipeline.record_keys(), b"x" * BODY
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, publishers * SOCKETS_PER_PUBLISHER + 64)
    pubs: list[Publisher] = []
    try:
        for _ in range(publishers):
            pubs.append(Publisher(ingest, STREAM, timeout=deadline_s, ctx=ctx))
        ready.put(len(pubs))
        start = go.get(timeout=deadline_s)
        time.sleep(max(0.0, start - time.time()))
        cpu, t0 = time.process_time(), time.perf_counter()
        total, gap = int(publishers * rate_each * seconds), 1.0 / (publishers * rate_each)
        for i in range(total):
            ahead = t0 + i * gap - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            pubs[i % publishers].publish(names[i % len(names)], body)
        for pub in pubs:
            pub.flush()
        return {"cpu": time.process_time() - cpu, "records": total, "reconnects": sum(p.reconnects for p in pubs)}
    finally:
        for pub in pubs:
            pub.close()
        ctx.term()
