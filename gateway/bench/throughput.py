"""Scenario 1, throughput: publisher -> gateway -> epgm -> reconciling subscriber, against a raw pyzmq relay.

ZEPS: a `Publisher` on host pub sends `count` records (100-byte bodies, 100 keys) as fast as the gateway
takes them; the gateway on gw journals and multicasts them; a `Subscriber` on sub merges multicast and
replay. The rate is records / (last - first arrival) at the subscriber, counted only when every sequence
arrived (zero missing after reconciliation). The same pipeline runs once more with ZEPS_PURE_PYTHON=1 in
every process: the record loops (gateway.wire.record_loops) in Python instead of compiled, to show what the
C extension wins; and once with the subscriber taking each batch as columns (`Delivery.columns()`: arrays of
sequences, times and key/body offsets, no object per record).

Baseline, same lab, same PGM rate: a producer PUSHes one message per record to a relay on gw that does
`PULL.recv_multipart() -> PUB.send_multipart()` over epgm, one message at a time, no journal; a plain SUB
counts what arrives and checks the record numbers. It runs unpaced, so its delivered rate is an upper bound
of its zero-loss rate (generous to the baseline), and whatever it lost, silently, is reported next to it.
"""

from __future__ import annotations

import functools
import struct
import time
from typing import Any

import zmq

from gateway.bench import BenchError, pipeline
from gateway.bench.runner import (
    BODY,
    KEYS,
    Plot,
    Progress,
    Result,
    Settings,
    Stat,
    Table,
    Target,
    cpu_seconds,
    python_record_loops,
    repeat,
    stop,
)
from gateway.mcast import Endpoint, Tuning
from gateway.tools.deployment import Deployment
from netlab import MP, Lab

TITLE = "Throughput: publish -> gateway -> epgm -> reconciled subscriber"
RELAY_PORT = 5590
_INDEX = struct.Struct("<Q")
_WARMUP = b"w"


def estimate(settings: Settings) -> float:
    return 20 + settings.runs * (8 if settings.quick else 45)


def run(settings: Settings) -> Result:
    progress = Progress("throughput")
    count, raw_count = settings.size(2_000_000, 20_000), settings.size(500_000, 5_000)
    failures: list[str] = []
    ours = zeps_runs(settings, progress, "epgm", count, failures)
    per_record = zeps_runs(settings, progress, "epgm", count // 4, failures, per_record=True)
    columnar = zeps_runs(settings, progress, "epgm", count, failures, columnar=True)
    with python_record_loops():  # every process of the pipeline, gateway included
        pure = zeps_runs(settings, progress, "epgm", count, failures, label=", record loops in Python")
    with Lab(["pub", "gw", "sub"]) as lab:  # the same topology, nothing of ours running on it
        raw = repeat(settings.runs, progress, f"raw relay, {raw_count:,} messages",
                     lambda _: relay_once(lab, raw_count), failures)  # fmt: skip
    rate, raw_rate = Stat.of(ours.get("rate"), "records/s"), Stat.of(raw.get("rate"), "msg/s")
    zeps = (
        ("next_batch()", ours),
        ("next()", per_record),
        ("next_batch().columns()", columnar),
        ("next_batch(), record loops in Python", pure),
    )
    ratio = rate.median / raw_rate.median
    return Result(
        "throughput",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"delivered rate: {count:,} records (ZEPS; {count // 4:,} with next()), {raw_count:,} messages "
                f"(relay); {BODY}-byte bodies, {KEYS} keys, PGM rate {pipeline.RATE_KBPS:,} kbit/s",
                ("system", "delivered", "publisher", "missing", "records from replay"),
                [
                    (
                        f"ZEPS, Subscriber.{name}",
                        Stat.of(m.get("rate"), "records/s"),
                        Stat.of(m.get("publish_rate"), "records/s"),
                        Stat.of(m.get("missing")),
                        Stat.of(m.get("from_replay")),
                    )
                    for name, m in zeps
                ]
                + [
                    (
                        "raw pyzmq relay (PULL -> PUB epgm)",
                        raw_rate,
                        Stat.of(raw.get("produce_rate"), "msg/s"),
                        Stat.of(raw.get("lost")),
                        "none: lost is lost",
                    )
                ],
            ),
            Table(
                "CPU µs per record (user + system, all threads), by process",
                ("subscriber API", "publisher", "gateway", "subscriber"),
                [(name, *(Stat.of(m.get(key), digits=2) for key in ("pub_us", "gw_us", "sub_us"))) for name, m in zeps],
            ),
        ],
        targets=[
            Target("at least 4x the raw relay's rate", f"{ratio:.1f}x", ratio >= 4),
            Target("at least 250,000 records/s", str(rate), rate.median >= 250_000),
        ],
        plots=[
            Plot(
                "throughput",
                "Delivered records/s, zero missing (relay: what arrived)",
                "",
                "records/s",
                {
                    "ZEPS next_batch()": ([0], [rate.median]),
                    "ZEPS next()": ([1], [Stat.of(per_record.get("rate")).median]),
                    "ZEPS next_batch(), Python loops": ([2], [Stat.of(pure.get("rate")).median]),
                    "ZEPS columns()": ([3], [Stat.of(columnar.get("rate")).median]),
                    "raw pyzmq relay": ([4], [raw_rate.median]),
                },
                kind="bar",
            )
        ],
        notes=failures,
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
    )


def zeps_runs(
    settings: Settings,
    progress: Progress,
    transport: str,
    count: int,
    failures: list[str],
    *,
    rate_kbps: int = pipeline.RATE_KBPS,
    per_record: bool = False,
    columnar: bool = False,
    label: str = "",
) -> dict[str, list[float]]:
    """The ZEPS half, shared with the NORM scenario: per run, rates, missing records and CPU per record."""
    options = pipeline.gateway_options(rate_kbps)
    api = ("next()" if per_record else "next_batch().columns()" if columnar else "next_batch()") + label
    with pipeline.deployed(["sub"], tmp=settings.tmp, transport=transport, options=options) as dep:
        return repeat(settings.runs, progress, f"ZEPS over {transport}, {count:,} records, {api}",
                      lambda _: zeps_once(dep, count, rate_kbps, per_record, columnar), failures)  # fmt: skip


def zeps_once(
    dep: Deployment, count: int, rate_kbps: int, per_record: bool, columnar: bool = False
) -> dict[str, float]:
    lab, ready = dep.lab, MP.Queue()
    subscribe = functools.partial(pipeline.subscribe, rate_kbps=rate_kbps, per_record=per_record, columnar=columnar)
    sub = lab.start("sub", functools.partial(subscribe, dep.for_host("sub"), dep.replay, count, ready))
    try:
        if ready.get(timeout=pipeline.READY_S + 30) == "AWAIT_LIVE":
            raise BenchError("the subscriber heard no heartbeat in 30 s: multicast is not flowing in the lab")
        gw_cpu = cpu_seconds(dep.gateway_pid)
        pub = lab.run("pub", pipeline.publish, dep.ingest, count, 0.0, timeout=300)
        got = sub.result(timeout=300)
        gw_cpu = cpu_seconds(dep.gateway_pid) - gw_cpu
    finally:
        stop(sub)
    if got["missing"] or got["disorder"]:
        raise BenchError(f"the reconciled subscriber missed {got['missing']} records: {got['summary']}")
    return {
        "rate": got["records"] / got["seconds"],
        "publish_rate": count / pub["seconds"],
        "missing": got["missing"],
        "from_replay": got["summary"]["from_replay"],
        # gateway.transport.pgm's receiver (none with libzmq's engine): sessions lost, messages it had no room for
        "pgm_resets": sum(c["resets"] for c in got["pgm"].values()),
        "pgm_overruns": sum(c["overruns"] for c in got["pgm"].values()),
        "pub_us": pub["cpu"] / count * 1e6,
        "gw_us": gw_cpu / count * 1e6,
        "sub_us": got["cpu"] / count * 1e6,
    }


# --- the raw relay baseline -------------------------------------------------------------------------------


def relay_once(lab: Lab, count: int) -> dict[str, float]:
    gw = lab.host("gw")
    group = f"{lab.group(1)}:5555"
    ready = MP.Queue()
    relay = lab.start("gw", relay_loop, f"tcp://{gw.ip}:{RELAY_PORT}", f"epgm://{gw.ip};{group}", count)
    sub = lab.start("sub", raw_receive, f"epgm://{lab.host('sub').ip};{group}", count, ready)
    try:
        ready.get(timeout=30)
        produced = lab.run("pub", raw_produce, f"tcp://{gw.ip}:{RELAY_PORT}", count, timeout=300)
        got = sub.result(timeout=300)
        relay.result(timeout=60)
    finally:  # a failed run must not leave its relay holding the port for the next one
        stop(relay, sub)
    return {
        "rate": got["received"] / max(got["seconds"], 1e-9),
        "produce_rate": count / produced,
        "lost": count - got["received"],
    }


def _tuning() -> Tuning:
    return Tuning(rate_kbps=pipeline.RATE_KBPS)


def relay_loop(pull_at: str, pub_to: str, count: int, deadline_s: float = 120.0) -> int:
    """In gw: the per-message relay users write by hand. Warm-up frames until the first record, so the
    subscriber knows it has joined."""
    with zmq.Context() as ctx, ctx.socket(zmq.PULL) as pull, ctx.socket(zmq.PUB) as pub:
        _tuning().apply(pub, Endpoint.parse(pub_to))
        pub.connect(pub_to)
        pull.bind(pull_at)
        pull.setsockopt(zmq.RCVTIMEO, 20)
        relayed, deadline = 0, time.monotonic() + deadline_s
        while relayed == 0 and time.monotonic() < deadline:
            pub.send_multipart((_WARMUP, b""))
            try:
                pub.send_multipart(pull.recv_multipart())
                relayed = 1
            except zmq.Again:
                pass
        pull.setsockopt(zmq.RCVTIMEO, 1000)
        while relayed < count and time.monotonic() < deadline:
            try:
                pub.send_multipart(pull.recv_multipart())
            except zmq.Again:
                continue
            relayed += 1
        time.sleep(1.0)  # let the PGM sender put its queue on the wire before LINGER cuts it
        return relayed


def raw_produce(push_to: str, count: int) -> float:
    """In pub: one message (key, body) per record, the record number in the body; returns seconds taken."""
    names = [k.encode() for k in pipeline.record_keys()]
    pad = b"x" * (BODY - _INDEX.size)
    with zmq.Context() as ctx, ctx.socket(zmq.PUSH) as push:
        push.setsockopt(zmq.LINGER, 30_000)
        push.connect(push_to)
        start = time.perf_counter()
        pack = _INDEX.pack
        for i in range(count):
            push.send_multipart((names[i % KEYS], pack(i) + pad))
        return time.perf_counter() - start


def raw_receive(endpoint: str, count: int, ready: Any, idle_s: float = 3.0, deadline_s: float = 120.0) -> dict:
    """In sub: a plain SUB. Counts records (not warm-ups) until the last arrives or nothing comes for idle_s."""
    with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sock:
        # RCVHWM unbounded: with the default (1000) libzmq's PGM receiver aborted (pgm_receiver.cpp:131,
        # EAGAIN, SIGABRT) in most runs once this loop fell behind. The baseline gets the setting that survives.
        sock.setsockopt(zmq.RCVHWM, 0)
        _tuning().apply(sock, Endpoint.parse(endpoint))
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:  # joined once a warm-up frame arrives
            if sock.poll(100) and sock.recv_multipart()[0] == _WARMUP:
                break
        ready.put(True)
        sock.setsockopt(zmq.RCVTIMEO, int(idle_s * 1000))
        received, t_first, t_last, unpack = 0, 0.0, 0.0, _INDEX.unpack_from
        while time.monotonic() < deadline:
            try:
                key, body = sock.recv_multipart()
            except zmq.Again:
                break
            if key == _WARMUP:
                continue
            t_last = time.perf_counter()
            if not received:
                t_first = t_last
            received += 1
            if unpack(body)[0] == count - 1:
                break
        return {"received": received, "seconds": t_last - t_first}
