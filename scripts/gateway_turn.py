"""The gateway's turn for lone-record batches (the fan-in shape), per stage: call counts and timings.

Usage: python scripts/gateway_turn.py [BATCHES] [count|top|time|cpu] [GAP_MS]. Root: it makes a network namespace
of its own (a veth pair for the udp:// output; removed at the end) and runs there a real `Gateway` (its `run()`
loop on the main thread, default settings, group commit on its Syncer) with a udp:// multicast output, and a
feeding process that attaches as a Publisher does (batch, confirm, producer) and sends BATCHES PUBLISH-BATCHes
of one 100-byte record, each GAP_MS (default 1) after the one before was multicast, reading its PUBLISH-OKs. The
first 200 batches warm up. `count` (the default): the Python and C calls of each pass of the loop (a profile
hook on its thread: exact whatever the load), by how many batches the pass journaled (1: the lone batch's
turn, read to multicast; 0: timer passes, which send the PUBLISH-OKs once a group commit is synced). `top`:
the functions called most per batch (cProfile; DUMP=FILE keeps its stats). `time`: the loop's stages timed
by wrappers on the instance (time.perf_counter_ns; each wrapper adds about 0.3 µs), p50/p99 per call in µs.
`cpu`: the loop thread's CPU time per batch (time.thread_time_ns, nothing wrapped: the least noisy timing).
Compare trees alternately with PYTHONPATH=<checkout>; timings on a shared machine are noisy.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

NS_ADDR, GROUP = "10.77.0.1", "239.77.0.1:5077"
WARM = 200
BODY = b"x" * 100


def in_namespace(argv: list[str]) -> int:
    """Run this script again (`inside`) in a namespace of its own, with a veth pair; remove it after."""
    ns = f"zeps-gwturn-{os.getpid()}"
    ip = ["ip", "-n", ns]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (
            ["link", "set", "lo", "up"],
            ["link", "add", "d0", "type", "veth", "peer", "name", "d1"],
            ["link", "set", "d1", "up"],
            ["addr", "add", f"{NS_ADDR}/24", "dev", "d0"],
            ["link", "set", "d0", "up", "multicast", "on"],
            ["route", "add", "224.0.0.0/4", "dev", "d0"],
        ):
            subprocess.run(ip + cmd, check=True)
        return subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "inside", *argv]).returncode
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def feed(endpoint: str, batches: int, gap_s: float) -> None:
    """The publisher: attach, then one lone-record PUBLISH-BATCH every `gap_s`, each once the one before it was
    multicast (so that every batch is read alone, whatever the load), reading confirms as they come."""
    import zmq

    from gateway.transport.udp import join
    from gateway.wire import batch as B
    from gateway.wire import protocol as P

    group, port = GROUP.split(":")
    mcast = join(NS_ADDR, group, int(port), 1 << 20)
    mcast.settimeout(1.0)

    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    for cmd in (P.Attach(P.PROTOCOL, P.VERSION, "bench"),
                P.Extend((P.FEATURE_BATCH, P.FEATURE_CONFIRM, P.FEATURE_PRODUCER))):  # fmt: skip
        dealer.send(P.encode(cmd))
        dealer.recv()
    confirmed, at = 0, time.monotonic()
    for i in range(batches):
        batch = B.encode(0, [(time.time_ns(), b"key", BODY)], producer=(0x5EED, i))
        dealer.send(P.encode(P.PublishBatch(batch)))
        with contextlib.suppress(TimeoutError):
            mcast.recv(65536)
        at = time.monotonic() + gap_s  # a full gap after it: the gateway has finished its pass
        while (wait := at - time.monotonic()) > 0:
            if dealer.poll(wait * 1000):
                dealer.recv()
                confirmed += 1
    deadline = time.monotonic() + 10
    while confirmed < batches and time.monotonic() < deadline:
        if dealer.poll(100):
            reply = P.decode(dealer.recv())
            confirmed += reply.count if isinstance(reply, P.PublishOk) else 1
    dealer.close(0)
    ctx.term()


def timed(owner: Any, name: str, into: dict[str, list[int]], label: str | None = None) -> None:
    """Wrap `owner.name` to note how long each call took (ns), under `label` (a tree without it: nothing)."""
    original: Callable[..., Any] | None = getattr(owner, name, None)
    if original is None:
        return
    spans = into.setdefault(label or name, [])
    clock = time.perf_counter_ns

    def wrapper(*args: Any, **kw: Any) -> Any:
        t0 = clock()
        try:
            return original(*args, **kw)
        finally:
            spans.append(clock() - t0)

    setattr(owner, name, wrapper)


def serve(batches: int, mode: str, gap_s: float) -> None:
    from gateway.sequencer import gateway as G
    from gateway.sequencer.config import GatewayConfig
    from gateway.wire import protocol as P

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as journal:
        config = GatewayConfig(streams=["bench"], journal=Path(journal), ingest=endpoint,
                               multicast=[f"udp://{NS_ADDR};{GROUP}"])  # fmt: skip
        gw = G.Gateway(config)
        lane = gw.lanes["bench"]
        spans: dict[str, list[int]] = {}
        profiler = cProfile.Profile()
        state: dict[str, Any] = {"on": False, "passes": 0, "seq": 0}
        total = WARM + batches
        calls = {"call": 0, "c_call": 0}
        passes: list[tuple[int, int, int]] = []  # per pass of the loop: batches journaled, Python calls, C calls

        def hook(frame: FrameType, event: str, arg: Any) -> None:
            if event in calls:
                calls[event] += 1

        def until() -> bool:
            state["passes"] += state["on"]
            if state["on"] and mode == "count":
                seq = lane.writer.last_seq
                passes.append((seq - state["seq"], calls["call"], calls["c_call"]))
                state["seq"], calls["call"], calls["c_call"] = seq, 0, 0
            if not state["on"] and lane.writer.last_seq >= WARM:
                state["on"], state["seq"] = True, lane.writer.last_seq
                for values in spans.values():
                    values.clear()
                if mode == "count":
                    sys.setprofile(hook)
                elif mode == "top":
                    profiler.enable()
                state["cpu"] = time.thread_time_ns()
                used = resource.getrusage(resource.RUSAGE_THREAD)
                state["user"], state["sys"] = used.ru_utime, used.ru_stime
            if lane.writer.last_seq >= total:
                state["cpu"] = time.thread_time_ns() - state["cpu"]
                used = resource.getrusage(resource.RUSAGE_THREAD)
                state["user"], state["sys"] = used.ru_utime - state["user"], used.ru_stime - state["sys"]
                profiler.disable()
                sys.setprofile(None)
                return True
            return False

        if mode == "time":
            out = gw.outs[0]
            for owner, name, label in (
                (gw, "_drain_router", "drain (read .. sent)"),
                (gw.ingest, "handle", "Ingest.handle"),
                (gw, "_sequence", "_sequence (journal, fan-out)"),
                (lane.writer, "append", "JournalWriter.append"),
                (gw, "_fan_out", "_fan_out (multicast)"),
                (out.sock, "send_multipart", "UdpSender.send_multipart"),
                (gw, "_on_timers", "_on_timers"),
                (gw, "_send_confirms", "_send_confirms"),
                (gw.metrics, "post", "metrics.post"),
                (gw.syncer, "drain", "syncer.drain"),
            ):
                timed(owner, name, spans, label)
            timed(P, "decode", spans, "P.decode")
            polled = gw._poller.poll
            turns = spans.setdefault("pass: poll woke .. poll again, 1 batch", [])
            mark = {"woke": 0, "seq": 0}

            def poll(timeout: int) -> Any:  # the loop's work between two waits, in passes that journaled one batch
                now, seq = time.perf_counter_ns(), lane.writer.last_seq
                if mark["woke"] and seq - mark["seq"] == 1:
                    turns.append(now - mark["woke"])
                out = polled(timeout)
                mark["woke"], mark["seq"] = time.perf_counter_ns(), lane.writer.last_seq
                return out

            gw._poller.poll = poll  # type: ignore[method-assign]
        feeder = subprocess.Popen([sys.executable, __file__, "feed", endpoint, str(total), str(gap_s)])
        try:
            gw.run(until)
        finally:
            feeder.wait(30)
    n_passes = state["passes"]
    if mode == "count":  # the hook's own calls (until's) are in every pass alike
        print(f"load {os.getloadavg()[0]:.1f}; passes of the loop by batches journaled in them: Python calls, C calls "
              "(median, min, max)")  # fmt: skip
        for n in sorted({p[0] for p in passes}):
            of = [p for p in passes if p[0] == n]
            py, c = [p[1] for p in of], [p[2] for p in of]
            print(f"  {n} batch(es): {len(of):5d} passes  Python {statistics.median(py):6.1f} ({min(py)}-{max(py)})  "
                  f"C {statistics.median(c):6.1f} ({min(c)}-{max(c)})")  # fmt: skip
    elif mode == "cpu":
        print(f"load {os.getloadavg()[0]:.1f}; the loop thread's CPU per batch {state['cpu'] / batches / 1e3:.1f} µs "
              f"(user {state['user'] / batches * 1e6:.1f}, system {state['sys'] / batches * 1e6:.1f}; "
              f"{n_passes / batches:.2f} passes per batch)")  # fmt: skip
    elif mode == "top":
        stats = pstats.Stats(profiler)
        if dump := os.environ.get("DUMP"):  # for pstats' callers and callees
            stats.dump_stats(dump)
        entries = stats.stats  # type: ignore[attr-defined]
        py = sum(nc for (file, _, _), (_, nc, *_) in entries.items() if file != "~")
        c = sum(nc for (file, _, _), (_, nc, *_) in entries.items() if file == "~")
        print(f"loop thread per batch ({batches} lone-record batches, {n_passes / batches:.2f} passes per batch): "
              f"{py / batches:.1f} Python calls, {c / batches:.1f} C calls")  # fmt: skip
        top = sorted(entries.items(), key=lambda kv: -kv[1][1])[: int(os.environ.get("TOP", "40"))]
        for (file, line, fn), (_, nc, *_) in top:
            where = fn if file == "~" else f"{Path(file).name}:{line} {fn}"
            print(f"  {nc / batches:6.2f}  {where}")
    else:
        print(f"{batches} lone-record batches, {n_passes / batches:.2f} loop passes per batch, "
              f"load {os.getloadavg()[0]:.1f}; per call, µs:")  # fmt: skip
        for label, values in spans.items():
            if values:
                qs = statistics.quantiles(values, n=100)
                print(f"  {label:32s} calls/batch {len(values) / batches:5.2f}  p50 {qs[49] / 1e3:8.1f}  "
                      f"p99 {qs[98] / 1e3:8.1f}")  # fmt: skip


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["feed"]:
        feed(args[1], int(args[2]), float(args[3]))
        return 0
    if args[:1] == ["inside"]:
        batches = int(args[1]) if len(args) > 1 else 3000
        mode = args[2] if len(args) > 2 else "count"
        gap_ms = float(args[3]) if len(args) > 3 else 1.0
        serve(batches, mode, gap_ms / 1000)
        return 0
    return in_namespace(args)


if __name__ == "__main__":
    sys.exit(main())
