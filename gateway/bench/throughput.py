"""Scenario 1, throughput: publisher -> gateway -> epgm -> reconciling subscriber, against a raw pyzmq relay.

ZEPS: a `Publisher` on host pub sends `count` records (100-byte bodies, 100 keys) as fast as the gateway
takes them; the gateway on gw journals and multicasts them; a `Subscriber` on sub merges multicast and
replay. The rate is records / (last - first arrival) at the subscriber, counted only when every sequence
arrived (zero missing after reconciliation). One row per way the application ends take the records: one
`publish()` per record, and the subscriber walking each `next_batch()` with `raw()` (views), or taking
one `Received` per record with `next()`, or each batch as columns (`Delivery.columns()`: arrays of
sequences, times and key/body offsets, no object per record); then the batch publish, `publish_many()` of
1,000 records a call, into `next_batch().columns()`: no Python per record at either end. The first row
runs once more with ZEPS_PURE_PYTHON=1 in every process: the record loops (gateway.wire.record_loops) in
Python instead of compiled, to show what the C extension wins.

Replay into one client, columnar: a journal written with `JournalWriter` directly (the gateway's ~60 KB
batches), served by `zeps replay` on loopback, read from sequence 1 by one `ReplayClient` that takes each
batch (CRC checked) as columns. CPU per record is the sidecar's and the client's.

Baseline, same lab, same PGM rate: a producer PUSHes one message per record to a relay on gw that does
`PULL.recv_multipart() -> PUB.send_multipart()` over epgm, one message at a time, no journal; a plain SUB
counts what arrives and checks the record numbers. It runs unpaced, so its delivered rate is an upper bound
of its zero-loss rate (generous to the baseline), and whatever it lost, silently, is reported next to it.
"""

from __future__ import annotations

import functools
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from gateway.bench import pipeline, replay
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
    need_disk,
    python_record_loops,
    repeat,
    stop,
)
from gateway.mcast import Endpoint, Tuning
from gateway.tools.deployment import Deployment
from gateway.wire import protocol as P
from netlab import MP, Lab

TITLE = "Throughput: publish -> gateway -> epgm -> reconciled subscriber"
RELAY_PORT = 5590
MANY = 1_000  # records per publish_many() call in the batch-publish row (a multiple of KEYS)
_INDEX = struct.Struct("<Q")
_WARMUP = b"w"


def estimate(settings: Settings) -> float:
    return 30 + settings.runs * (10 if settings.quick else 60)


# The ZEPS rows: (how the application ends take the records, zeps_runs' keywords). Names in the tables.
WAYS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("Subscriber.next_batch()", {}),
    ("Subscriber.next()", {"per_record": True}),
    ("Subscriber.next_batch().columns()", {"columnar": True}),
    ("Publisher.publish_many(), Subscriber.next_batch().columns()", {"columnar": True, "many": MANY}),
)
PURE = "Subscriber.next_batch(), record loops in Python"
REPLAY = "ZEPS replay into one client, columnar (DELIVER-BATCH, Delivery columns)"


def run(settings: Settings) -> Result:
    progress = Progress("throughput")
    count, raw_count = settings.size(2_000_000, 20_000), settings.size(500_000, 5_000)
    replay_count = settings.size(5_000_000, 50_000)
    failures: list[str] = []
    zeps: dict[str, dict[str, list[float]]] = {}
    for name, how in WAYS:
        n = count // 4 if how.get("per_record") else count
        zeps[name] = zeps_runs(settings, progress, "epgm", n, failures, label=name, **how)
    with python_record_loops():  # every process of the pipeline, gateway included
        zeps[PURE] = zeps_runs(settings, progress, "epgm", count, failures, label=PURE)
    with Lab(["pub", "gw", "sub"]) as lab:  # the same topology, nothing of ours running on it
        raw = repeat(settings.runs, progress, f"raw relay, {raw_count:,} messages",
                     lambda _: relay_once(lab, raw_count), failures)  # fmt: skip
    replayed = replay_runs(settings, progress, replay_count, failures)
    rates = {name: Stat.of(m.get("rate"), "records/s") for name, m in zeps.items()}
    rate, raw_rate = rates[WAYS[0][0]], Stat.of(raw.get("rate"), "msg/s")
    many, replay_rate = rates[WAYS[3][0]], Stat.of(replayed.get("rate"), "records/s")
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
                        f"ZEPS, {name}",
                        rates[name],
                        Stat.of(m.get("publish_rate"), "records/s"),
                        Stat.of(m.get("missing")),
                        Stat.of(m.get("from_replay")),
                    )
                    for name, m in zeps.items()
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
                ("API", "publisher", "gateway", "subscriber"),
                [
                    (name, *(Stat.of(m.get(key), digits=2) for key in ("pub_us", "gw_us", "sub_us")))
                    for name, m in zeps.items()
                ],
            ),
            Table(
                f"replay: a journal of {replay_count:,} records ({BODY}-byte bodies, ~60 KB batches) -> `zeps replay` "
                "on loopback -> one ReplayClient from sequence 1, each batch taken as columns",
                ("system", "records", "rate", "sidecar CPU µs/record", "client CPU µs/record"),
                [
                    (
                        REPLAY,
                        f"{replay_count:,}",
                        replay_rate,
                        Stat.of(replayed.get("sidecar_us"), digits=2),
                        Stat.of(replayed.get("client_us"), digits=2),
                    )
                ],
            ),
        ],
        targets=[
            Target("at least 4x the raw relay's rate", f"{ratio:.1f}x", ratio >= 4),
            Target("at least 250,000 records/s", str(rate), rate.median >= 250_000),
            Target("at least 1,000,000 records/s with next_batch() and raw()", str(rate), rate.median >= 1e6, 32),
            Target(
                "at least 1,500,000 records/s with publish_many() and columns()", str(many), many.median >= 1.5e6, 32
            ),
            Target(
                "replay into one client, columnar, at least 3,000,000 records/s",
                str(replay_rate),
                replay_rate.median >= 3e6,
                32,
            ),
        ],
        plots=[
            Plot(
                "throughput",
                "Delivered records/s, zero missing (relay: what arrived)",
                "",
                "records/s",
                {
                    **{f"ZEPS {name}": ([i], [r.median]) for i, (name, r) in enumerate(rates.items())},
                    "raw pyzmq relay": ([len(rates)], [raw_rate.median]),
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
    many: int = 0,
    label: str = "Subscriber.next_batch()",
) -> dict[str, list[float]]:
    """The ZEPS half, shared with the NORM scenario: per run, rates, missing records and CPU per record.
    `per_record`, `columnar`: the subscriber's API (pipeline.subscribe); `many`: the publisher's batch size
    for publish_many() (0: publish() per record)."""
    options = pipeline.gateway_options(rate_kbps)
    with pipeline.deployed(["sub"], tmp=settings.tmp, transport=transport, options=options) as dep:
        return repeat(settings.runs, progress, f"ZEPS over {transport}, {count:,} records, {label}",
                      lambda _: zeps_once(dep, count, rate_kbps, per_record, columnar, many), failures)  # fmt: skip


def zeps_once(
    dep: Deployment, count: int, rate_kbps: int, per_record: bool, columnar: bool = False, many: int = 0
) -> dict[str, float]:
    publish = functools.partial(dep.lab.run, "pub", functools.partial(pipeline.publish, many=many), dep.ingest, count,
                                0.0, timeout=300)  # fmt: skip
    got, pub, gw_cpu = pipeline.delivered(dep, count, publish, rate_kbps=rate_kbps, per_record=per_record,
                                          columnar=columnar)  # fmt: skip
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


# --- replay into one client ---------------------------------------------------------------------------------


def replay_runs(settings: Settings, progress: Progress, records: int, failures: list[str]) -> dict[str, list[float]]:
    """A journal of `records` written directly, served by a sidecar on loopback, read columnar from sequence 1."""
    need_disk(settings.tmp, records * 125, "the throughput benchmark's replay row")
    with tempfile.TemporaryDirectory(prefix="zeps-bench-", dir=settings.tmp) as tmp:
        progress(f"writing a journal of {records:,} records")
        replay.write_journal(Path(tmp), records)
        with replay.sidecar(Path(tmp)) as (endpoint, pid):
            return repeat(settings.runs, progress, f"replay of {records:,} records into one client, columnar",
                          lambda _: _replay_once(endpoint, pid, records), failures)  # fmt: skip


def _replay_once(endpoint: str, pid: int, records: int) -> dict[str, float]:
    before = cpu_seconds(pid)
    got = replay.replay_rate(endpoint, records, (P.FEATURE_BATCH,), columnar=True)
    return {
        "rate": got["rate"],
        "sidecar_us": (cpu_seconds(pid) - before) / records * 1e6,
        "client_us": got["cpu_per_record"] * 1e6,
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
