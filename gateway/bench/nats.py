"""The peer: Debian's nats-server with JetStream, started by the bench, and nats-py clients.

The server keeps its store in a temporary directory and listens on loopback or on a lab host's address only;
it is stopped by pid (SIGTERM, then SIGKILL) and the store removed, on success, failure or Ctrl-C. Records
are NATS messages: one per record, subject `bench.KEY`, the 100-byte body as the payload, published with
core NATS into a file-backed stream (JetStream stores them; the publisher does not wait for acks, the bench
checks the stream's count). Client functions are module-level so that `Lab.start` can run them in lab hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.bench import BenchError
from gateway.bench.runner import BODY, KEYS, stop_process
from netlab import Lab

STREAM_NAME = "BENCH"
SUBJECTS = "bench.>"
PORT = 4222
READY_S = 20.0
STAMP = struct.Struct("<q")  # a latency run's body starts with its publish time, wall clock ns


def _argv(store: Path, host: str, port: int) -> list[str]:
    exe = shutil.which("nats-server")
    if exe is None:
        raise BenchError("nats-server is not installed: apt-get install nats-server (or run scripts/setup.sh)")
    return [exe, "-js", "-sd", str(store), "-a", host, "-p", str(port), "-l", str(store / "server.log")]


def _wait_ready(proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if log.exists() and "Server is ready" in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise BenchError(f"nats-server did not start within {READY_S} s (exit {proc.poll()}): {text}")


@contextlib.contextmanager
def server(tmp: Path, lab: Lab | None = None, host: str = "gw") -> Iterator[tuple[str, subprocess.Popen]]:
    """nats-server with JetStream: (url, process). On loopback, or on lab host `host` at its address."""
    with tempfile.TemporaryDirectory(prefix="zeps-bench-nats-", dir=tmp) as store:
        if lab is None:
            with socket.socket() as s:  # a free loopback port
                s.bind(("127.0.0.1", 0))
                addr, port = "127.0.0.1", s.getsockname()[1]
            proc = subprocess.Popen(
                _argv(Path(store), addr, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        else:
            addr, port = lab.host(host).ip, PORT
            proc = lab.popen(host, _argv(Path(store), addr, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_ready(proc, Path(store) / "server.log")
            yield f"nats://{addr}:{port}", proc
        finally:
            stop_process(proc)


def subjects() -> list[str]:
    return [f"bench.key{i:03d}" for i in range(KEYS)]


# --- clients: sync entry points (for Lab.run) over nats-py's asyncio API ----------------------------------


def create_stream(url: str) -> None:
    asyncio.run(_create_stream(url))


def publish(url: str, count: int, rate: float, deadline_s: float = 300.0, *, stamped: bool = False,
            stored: bool = True) -> dict:  # fmt: skip
    """`count` messages of BODY bytes over KEYS subjects, paced at `rate`/s (0: unpaced); returns once the
    stream holds them all (`stored`; core NATS alone: once the server has them), with the seconds that took and
    the stream's last sequence. `stamped`: each body starts with its publish time (ns, for `latencies`)."""
    return asyncio.run(_publish(url, count, rate, deadline_s, stamped, stored))


def latencies(url: str, count: int, ready: Any, jetstream: bool, deadline_s: float = 300.0) -> dict:
    """A subscriber to every subject (core NATS, or an ordered push consumer of the stream's new messages) until
    `count` stamped messages came or the deadline passed: publish -> delivery times in ns, and how many came."""
    return asyncio.run(_latencies(url, count, ready, jetstream, deadline_s))


def replay(url: str, first: int, count: int, deadline_s: float = 300.0) -> dict:
    """A consumer replaying `count` messages from stream sequence `first`: the seconds that took."""
    return asyncio.run(_consume(url, first, count, deadline_s))


def catch_up(url: str, deadline_s: float = 300.0) -> dict:
    """A late joiner from sequence 1 while live traffic continues: until nothing is pending."""
    return asyncio.run(_consume(url, 1, 0, deadline_s))


async def connect(url: str) -> Any:
    import nats

    return await nats.connect(url, max_reconnect_attempts=0, connect_timeout=10)


async def _create_stream(url: str) -> None:
    nc = await connect(url)
    try:
        await nc.jetstream().add_stream(name=STREAM_NAME, subjects=[SUBJECTS])
    finally:
        await nc.close()


async def _publish(url: str, count: int, rate: float, deadline_s: float, stamped: bool, stored: bool) -> dict:
    nc = await connect(url)
    try:
        js = nc.jetstream()
        before = (await js.stream_info(STREAM_NAME)).state.last_seq if stored else 0
        names, body = subjects(), b"x" * BODY
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(count):
            await nc.publish(names[i % KEYS], STAMP.pack(time.time_ns()) + body[STAMP.size :] if stamped else body)
            if rate and i % 10 == 9:
                ahead = start + (i + 1) / rate - time.perf_counter()
                if ahead > 0:
                    await asyncio.sleep(ahead)
        await nc.flush(timeout=60)
        last, deadline = 0, time.monotonic() + deadline_s
        while stored and (last := (await js.stream_info(STREAM_NAME)).state.last_seq) < before + count:
            if time.monotonic() > deadline:
                raise BenchError(f"JetStream stored {last - before} of {count} messages within {deadline_s} s")
            await asyncio.sleep(0.05)
        return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "last": last}
    finally:
        await nc.close()


async def _latencies(url: str, count: int, ready: Any, jetstream: bool, deadline_s: float) -> dict:
    from nats.js.api import ConsumerConfig, DeliverPolicy

    nc = await connect(url)
    done, lat = asyncio.Event(), array("q")

    async def on_message(msg: Any) -> None:
        lat.append(time.time_ns() - STAMP.unpack_from(msg.data)[0])
        if len(lat) >= count:
            done.set()

    try:
        if jetstream:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.NEW)
            await nc.jetstream().subscribe(SUBJECTS, stream=STREAM_NAME, cb=on_message, ordered_consumer=True,
                                           config=config)  # fmt: skip
        else:
            await nc.subscribe(SUBJECTS, cb=on_message, pending_msgs_limit=10 * count)
        await nc.flush(timeout=10)
        ready.put("ready")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), deadline_s)
        return {"records": len(lat), "latencies": lat.tobytes()}
    finally:
        await nc.close()


async def _consume(url: str, first: int, count: int, deadline_s: float) -> dict:
    """An ordered push consumer from `first`, walking every message, until `count` came (0: until the
    consumer has nothing pending, i.e. it caught up with the stream). Ordered push with a callback was the
    fastest nats-py consumer here: 61k msg/s against 18k for a pull consumer fetching 1,000 at a time."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    nc = await connect(url)
    done, got, nbytes = asyncio.Event(), 0, 0

    async def on_message(msg: Any) -> None:
        nonlocal got, nbytes
        got += 1
        nbytes += len(msg.data)
        if got == count or (not count and msg.metadata.num_pending == 0):
            done.set()

    try:
        start = time.perf_counter()
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first)
        await nc.jetstream().subscribe(SUBJECTS, stream=STREAM_NAME, cb=on_message, ordered_consumer=True,
                                       config=config)  # fmt: skip
        try:
            await asyncio.wait_for(done.wait(), deadline_s)
        except TimeoutError:
            raise BenchError(
                f"the JetStream consumer got {got:,} messages in {deadline_s} s and was not done"
            ) from None
        return {"records": got, "seconds": time.perf_counter() - start}
    finally:
        await nc.close()
