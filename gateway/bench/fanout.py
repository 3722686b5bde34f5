"""Scenario 2, fan-out: the server's CPU per record with 1, 4, 8 and 16 subscriber hosts.

One lab: host pub publishes, host gw runs the server, hosts s1..s16 subscribe. A publisher paces `per_run`
records at `RATE`/s; every subscriber must receive all of them before the run counts. The server's CPU
time (user + system, all threads, from /proc) over the run, divided by the records, is the cost.

- ZEPS: the gateway (journal, then one epgm multicast whatever the number of subscribers); reconciling
  `Subscriber`s reading with `next_batch()`. The replay sidecar is not counted: it serves only gaps.
  Measured with `--fsync never`, the durability JetStream has by default (it syncs every 2 minutes), and
  with the gateway's default `--fsync group`, whose fdatasync every 5 ms dominates at this low rate.
- NATS: nats-server 2.9 with JetStream (file store) on gw, the same records as NATS messages into a
  stream, and each subscriber an ordered push consumer (deliver new) over TCP: one copy per subscriber.
- The lab's floor: a plain UDP multicast sender on gw (one datagram per record, no protocol) and plain
  receivers. In this lab the bridge copies each multicast packet to every joined host, and the receiving
  namespaces' kernel work runs in softirq on the sending CPU, so any sender's cost grows with receivers
  here, where a switch would do the copying on a LAN; this row measures how much.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

from gateway.bench import BenchError, nats, pipeline
from gateway.bench.runner import Plot, Progress, Result, Settings, Stat, Table, Target, cpu_seconds, stop
from gateway.tools.deployment import Deployment
from gateway.transport import udp
from netlab import MP, Lab

TITLE = "Fan-out: server CPU per record with 1-16 subscriber hosts"
FLOOR = "plain UDP multicast (the lab's floor)"
FLOOR_PORT = 5600
FANOUT = (1, 4, 8, 16)
FSYNC = ("never", "group")  # never: JetStream's durability (its default syncs every 2 min); group: ours
NATS = "NATS JetStream"
RATE = 5_000.0  # records/s: what 16 Python subscribers on 2 shared cores keep up with, for both systems
WAIT_S = 120.0


def estimate(settings: Settings) -> float:
    per_k = 3 * (4 + settings.runs * (1 if settings.quick else 5))
    return 20 + sum(per_k + 0.7 * k * 3 for k in _fanouts(settings))


def _fanouts(settings: Settings) -> tuple[int, ...]:
    return (1, 2) if settings.quick else FANOUT


def run(settings: Settings) -> Result:
    progress = Progress("fanout")
    per_run = settings.size(25_000, 1_000)
    fanouts = _fanouts(settings)
    hosts = [f"s{i}" for i in range(1, max(fanouts) + 1)]
    costs: dict[str, dict[int, Stat]] = {}
    with Lab(["pub", "gw", *hosts]) as lab:
        for fsync in FSYNC:
            name = f"ZEPS, --fsync {fsync}"
            options = pipeline.gateway_options(pipeline.RATE_KBPS, "--fsync", fsync)
            with pipeline.deployed_on(lab, tmp=settings.tmp, options=options) as dep:
                server = (dep.gateway_pid, _zeps_starter(dep), _zeps_publish(dep))
                costs[name] = {
                    k: _measure(settings, progress, f"{name}, {k} subscribers", lab, k, per_run, *server)
                    for k in fanouts
                }
        costs[NATS] = {}
        with nats.server(settings.tmp, lab) as (url, proc):
            lab.run("pub", nats.create_stream, url)
            server = (proc.pid, _nats_starter(url), _nats_publish(lab, url))
            for k in fanouts:
                costs[NATS][k] = _measure(settings, progress, f"NATS, {k} subscribers", lab, k, per_run, *server)
        costs[FLOOR] = _floor(settings, progress, lab, fanouts, per_run)
    rows = [(k, *(costs[name][k] for name in costs)) for k in fanouts]
    flat = {name: by_k[fanouts[-1]].median / by_k[fanouts[0]].median for name, by_k in costs.items()}
    return Result(
        "fanout",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"server CPU µs per record, {per_run:,} records per run at {RATE:,.0f} records/s",
                ("subscribers", *costs),
                rows,
            ),
            Table(
                f"growth from {fanouts[0]} to {fanouts[-1]} subscribers",
                ("system", "ratio"),
                [(name, f"{ratio:.2f}x") for name, ratio in flat.items()],
            ),
        ],
        targets=[
            Target(
                f"ZEPS cost flat: at most 1.2x from {fanouts[0]} to {fanouts[-1]} subscribers",
                ", ".join(f"{name}: {ratio:.2f}x" for name, ratio in flat.items()),
                all(ratio <= 1.2 for name, ratio in flat.items() if name.startswith("ZEPS")),
            )
        ],
        plots=[
            Plot(
                "fanout",
                "Server CPU per record vs subscribers",
                "subscriber hosts",
                "CPU µs per record",
                {name: (list(fanouts), [by_k[k].median for k in fanouts]) for name, by_k in costs.items()},
            )
        ],
        notes=[
            "With 16 Python subscribers on 2 cores the machine is oversubscribed, and the server's CPU per record "
            "then rises from contention too (cache pressure; for PGM, repairs of packets that starved subscribers "
            "missed), so on a shared 2-core machine the ZEPS ratio varies from run to run; a machine with more "
            "cores than subscribers measures the fan-out alone. The floor row is a sender that does nothing per "
            "receiver: its growth is what this lab (one bridge, receivers' kernel work on the sender's CPU, "
            "contention) adds to any multicast sender.",
        ],
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
    )


def _measure(
    settings: Settings,
    progress: Progress,
    what: str,
    lab: Lab,
    k: int,
    per_run: int,
    server_pid: int,
    start_subscriber: Callable[..., Any],
    publish: Callable[[int], Any],
) -> Stat:
    """Start k subscribers, then per run: publish, wait until all k have every record, CPU per record."""
    ready, reached = MP.Queue(), MP.Queue()
    total = per_run * settings.runs
    subs = [start_subscriber(lab, f"s{i + 1}", total, per_run, ready, reached) for i in range(k)]
    try:
        for _ in subs:
            ready.get(timeout=WAIT_S)
        costs = []
        for i in range(settings.runs):
            progress(f"{what}: run {i + 1}/{settings.runs}")
            before = cpu_seconds(server_pid)
            publish(per_run)
            for _ in subs:
                reached.get(timeout=WAIT_S)
            costs.append((cpu_seconds(server_pid) - before) / per_run * 1e6)
        for sub in subs:
            if sub.result(timeout=WAIT_S) != total:
                raise BenchError(f"{what}: a subscriber did not receive all {total} records")
    finally:
        stop(*subs)
    return Stat.of(costs, digits=2)


# --- ZEPS ------------------------------------------------------------------------------------------------


def _zeps_starter(dep: Deployment) -> Callable[..., Any]:
    def start(lab: Lab, host: str, total: int, per_run: int, ready: Any, reached: Any) -> Any:
        return lab.start(host, zeps_subscriber, dep.for_host(host), dep.replay, total, per_run, ready, reached)

    return start


def _zeps_publish(dep: Deployment) -> Callable[[int], Any]:
    return lambda n: dep.lab.run("pub", pipeline.publish, dep.ingest, n, RATE, timeout=WAIT_S)


def zeps_subscriber(multicast: list[str], replay: str, total: int, per_run: int, ready: Any, reached: Any) -> int:
    """In s<i>: a reconciling Subscriber; reports to `reached` each time another `per_run` records came."""
    from gateway.client.subscriber import Subscriber
    from gateway.mcast import Tuning

    tuning = Tuning(rate_kbps=pipeline.RATE_KBPS)
    with Subscriber(pipeline.STREAM, multicast=multicast, replay=replay, start="latest", tuning=tuning) as sub:
        pipeline.await_position(sub)
        ready.put(True)
        got, deadline = 0, time.monotonic() + WAIT_S * 4
        while got < total and time.monotonic() < deadline:
            delivery = sub.next_batch(timeout=0.5)
            if delivery is None:
                continue
            for _ in delivery.raw():
                got += 1
                if got % per_run == 0:
                    reached.put(got)
        return got


# --- NATS ------------------------------------------------------------------------------------------------


def _nats_starter(url: str) -> Callable[..., Any]:
    def start(lab: Lab, host: str, total: int, per_run: int, ready: Any, reached: Any) -> Any:
        return lab.start(host, nats_subscriber, url, total, per_run, ready, reached)

    return start


def _nats_publish(lab: Lab, url: str) -> Callable[[int], Any]:
    return lambda n: lab.run("pub", nats.publish, url, n, RATE, timeout=WAIT_S)


def nats_subscriber(url: str, total: int, per_run: int, ready: Any, reached: Any) -> int:
    """In s<i>: an ordered push consumer from the next message on; reports like zeps_subscriber."""
    return asyncio.run(_nats_subscriber(url, total, per_run, ready, reached))


async def _nats_subscriber(url: str, total: int, per_run: int, ready: Any, reached: Any) -> int:
    from nats.js.api import DeliverPolicy

    nc = await nats.connect(url)
    got = 0
    done = asyncio.Event()

    async def on_message(msg: Any) -> None:
        nonlocal got
        got += 1
        if got % per_run == 0:
            reached.put(got)
        if got >= total:
            done.set()

    try:
        await nc.jetstream().subscribe(
            nats.SUBJECTS, stream=nats.STREAM_NAME, cb=on_message, ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
        )  # fmt: skip
        await nc.flush()
        ready.put(True)
        await asyncio.wait_for(done.wait(), WAIT_S * 4)
        return got
    finally:
        await nc.close()


# --- the lab's floor: plain UDP multicast ---------------------------------------------------------------------


def _floor(settings: Settings, progress: Progress, lab: Lab, fanouts: tuple[int, ...], per_run: int) -> dict[int, Stat]:
    """A plain multicast sender on gw, as a server the runs command through a queue."""
    gw, group, orders, done = lab.host("gw"), lab.group(2), MP.Queue(), MP.Queue()
    sender = lab.start("gw", floor_sender, group, gw.ip, orders, done)
    try:

        def start(lab: Lab, host: str, total: int, per_run: int, ready: Any, reached: Any) -> Any:
            return lab.start(host, floor_receiver, group, lab.host(host).ip, total, per_run, ready, reached)

        def publish(n: int) -> None:
            orders.put(n)
            done.get(timeout=WAIT_S)

        return {k: _measure(settings, progress, f"floor, {k} receivers", lab, k, per_run, sender.pid, start, publish)
                for k in fanouts}  # fmt: skip
    finally:
        orders.put(None)
        stop(sender)


def floor_sender(group: str, ip: str, orders: Any, done: Any) -> None:
    """In gw: for each n ordered, n datagrams of a record's size to the group at RATE/s; None ends it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ip))
    payload = bytes(pipeline.BODY + 24)
    while (n := orders.get()) is not None:
        start = time.monotonic()
        for i in range(n):
            sock.sendto(payload, (group, FLOOR_PORT))
            if (delay := start + (i + 1) / RATE - time.monotonic()) > 0:
                time.sleep(delay)
        done.put(n)


def floor_receiver(group: str, ip: str, total: int, per_run: int, ready: Any, reached: Any) -> int:
    """In s<i>: joins the group and counts datagrams; reports like zeps_subscriber."""
    sock = udp.join(ip, group, FLOOR_PORT, 4 << 20)
    sock.settimeout(0.5)
    ready.put(True)
    got, deadline = 0, time.monotonic() + WAIT_S * 4
    while got < total and time.monotonic() < deadline:
        try:
            sock.recv(2048)
        except TimeoutError:
            continue
        got += 1
        if got % per_run == 0:
            reached.put(got)
    return got
