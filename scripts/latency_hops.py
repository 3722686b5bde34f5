"""Publish -> delivery at 10,000 records/s in the latency scenario's lab (udp://, hosts pub, gw, sub), NATS core
in the same sitting, and with --trace the trip broken into sub-hops.

Usage: python scripts/latency_hops.py [--records N] [--runs R] [--rate R [R ...]] [--trace DIR] [--no-nats]
                                      [--switch-interval S]

Runs alternate ZEPS, NATS core, ZEPS, ... (two labs up side by side), and with several rates the rates too (run 1
at each rate, then run 2 ...), so that a machine shared with other work loads them all alike; it prints each
run's p50/p99/p99.9 (ms), the medians, the ZEPS/NATS ratios and the load average, per rate. Run it with
PYTHONPATH=<checkout> to measure another tree (alternate the trees for a before/after). --records is the count
at the first rate; other rates run as many seconds (so 1,000/s is not measured on a tenth of the records).

--trace DIR: every process of the ZEPS side (publisher, gateway, subscriber) stamps each record with
time.time_ns() (CLOCK_REALTIME: the lab's hosts are namespaces of one machine, one clock) where it passes a
stage, keyed by the record's publish time, and writes the stamps to DIR when it ends. Stamps are taken by
wrappers installed at start-up (a sitecustomize on PYTHONPATH), which keep references and parse nothing until
the process ends, so the trip they time is the one the scenario runs. The sub-hops, per record:

  publish -> IO take     publish() queued it, the Publisher's IO thread took it (eventfd wake, GIL)
  IO take -> sent        encoded as PUBLISH-BATCH and handed to libzmq (zmq send returned)
  sent -> gw drain       libzmq's IO threads at both ends, TCP between namespaces, the gateway's poll wake
  gw drain -> read       commands read before it in the same drain
  read -> appended       checked, sequenced, written to the journal
  appended -> sendto     fan-out (cut into datagrams); an idle output sends at once, else the loop's pump does
  sendto                 the sendto() call (the kernel carries it through veth and bridge in this call)
  sendto -> sub recv     from the start of sendto to the subscriber's recv of that datagram returning
  sub recv -> handed     parsing, reconcile, until next_batch() returned it

With --trace and several rates, each rate's sub-hops are printed apart (a record belongs to the run whose
wall-clock window holds its publish time).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRACE_ENV = "ZEPS_HOPS_TRACE"
SWITCH_ENV = "ZEPS_HOPS_SWITCH_INTERVAL"
STAGES = (
    "publish", "io_turn", "take", "encode", "sent", "drain", "read", "decoded", "ingest", "sequence", "append",
    "appended", "fanned", "journaled", "sendto", "sendto_end", "recv", "delivered", "read_done",
    "turn_done", "handed",
)  # fmt: skip
HOPS = (
    ("publish -> IO turn", "publish", "io_turn"),
    ("IO turn -> take", "io_turn", "take"),
    ("take -> zmq send", "take", "encode"),
    ("zmq send -> gw drain", "encode", "drain"),
    ("gw drain -> read", "drain", "read"),
    ("read -> decoded", "read", "decoded"),
    ("decoded -> ingest", "decoded", "ingest"),
    ("ingest -> _sequence", "ingest", "sequence"),
    ("_sequence -> append", "sequence", "append"),
    ("append (write)", "append", "appended"),
    ("appended -> sendto", "appended", "sendto"),
    ("sendto", "sendto", "sendto_end"),
    ("sendto end -> fanned", "sendto_end", "fanned"),
    ("fanned -> journaled", "fanned", "journaled"),
    ("sendto -> sub recv", "sendto", "recv"),
    ("sub recv -> delivered", "recv", "delivered"),
    ("delivered -> read done", "delivered", "read_done"),
    ("read done -> turn done", "read_done", "turn_done"),
    ("turn done -> handed", "turn_done", "handed"),
    ("gw read -> sendto", "read", "sendto"),
    ("sub recv -> handed", "recv", "handed"),
    ("publish -> journaled", "publish", "journaled"),
    ("journaled -> handed", "journaled", "handed"),
    ("publish -> handed", "publish", "handed"),
)


# --- the stamps (installed in every process when TRACE_ENV names a directory) ---------------------------------

_stamps: list[tuple[str, int, Any]] = []  # (stage, time_ns, what names the records: parsed at the end)
_last = {"drain": 0, "read": 0, "io_turn": 0}
_turn_items: list[Any] = []  # what the subscriber's poll turn being traced delivered
_marks: dict[str, int] = {}  # stages inside the one call being traced (the gateway's _sequence, the IO thread's feed)


def _ts_of(stage: str, what: Any) -> list[int]:
    from gateway.wire import batch as B

    if stage in ("io_turn", "take", "encode", "sent"):  # the accumulator's records: (ts_ns, key, body, ttl_ms)
        return [r[0] for r in what]
    if stage in ("drain", "read", "decoded", "ingest", "sequence", "append", "appended", "fanned", "journaled"):
        return [r[1] for r in what.raw()]
    if stage in ("handed", "delivered", "read_done", "turn_done"):
        batch, lo, hi = what
        return [r[1] for r in batch.raw(lo, hi)]
    data = bytes(what)
    if data[:2] != B.MAGIC:
        return []  # a heartbeat
    return [r[1] for r in B.Batch.parse(data, check_crc=False).raw()]


def dump() -> None:
    import numpy as np

    directory = os.environ.get(TRACE_ENV)
    if not directory or not _stamps:
        return
    per: dict[str, tuple[list[int], list[int]]] = {}
    for stage, t, what in _stamps:
        for ts in _ts_of(stage, what):
            keys, times = per.setdefault(stage, ([], []))
            keys.append(ts)
            times.append(t)
    arrays = {f"{s}_ts": np.array(k, dtype=np.int64) for s, (k, _) in per.items()}
    arrays |= {f"{s}_t": np.array(t, dtype=np.int64) for s, (_, t) in per.items()}
    np.savez(Path(directory) / f"{os.getpid()}.npz", **arrays)
    _stamps.clear()


def wrap(owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace owner.name by make(it), if it has one (scripts/repair_stages.py stamps with it too)."""
    original = getattr(owner, name, None)
    if original is not None:
        setattr(owner, name, functools.wraps(original)(make(original)))


def on_hand_out(record: Callable[[Any], None]) -> Callable[[Callable], Callable]:
    """A wrapper maker for Subscriber.next_batch: `record` is called with each Delivery it returns."""

    def make(original: Callable) -> Callable:
        def wrapper(self: Any, *args: Any, **kw: Any) -> Any:
            got = original(self, *args, **kw)
            if got is not None:
                record(got)
            return got

        return wrapper

    return make


def ending_with(dump: Callable[[], None]) -> Callable[[Callable], Callable]:
    """A wrapper maker that calls `dump` when the wrapped call ends: lab children end with os._exit, so a
    process's atexit never runs there."""

    def make(original: Callable) -> Callable:
        def wrapper(*args: Any, **kw: Any) -> Any:
            try:
                return original(*args, **kw)
            finally:
                dump()

        return wrapper

    return make


def install() -> None:
    """Wrap the stages' functions in this process (every part that is imported: publisher, gateway, subscriber)."""
    from gateway.bench import pipeline
    from gateway.client import accumulator, feed_intake, publisher_thread, subscriber
    from gateway.client.ingest_session import Publish
    from gateway.journal import writer
    from gateway.sequencer import gateway, ingest
    from gateway.transport import udp
    from gateway.wire import protocol

    now = time.time_ns
    stamp = _stamps.append

    def take(original: Callable) -> Callable:
        def wrapper(self: Any, *args: Any) -> Any:
            batches = original(self, *args)
            t = now()
            for records, _, _ in batches:
                stamp(("take", t, records))
            return batches

        return wrapper

    def feed(original: Callable) -> Callable:
        def wrapper(self: Any, event: Any, **kw: Any) -> Any:
            _marks.clear()
            out = original(self, event, **kw)
            if type(event) is Publish:
                stamp(("sent", now(), event.records))
                stamp(("encode", _marks.get("do", 0), event.records))
                stamp(("io_turn", _last["io_turn"], event.records))
            return out

        return wrapper

    def mark(name: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def wrapper(*args: Any, **kw: Any) -> Any:
                _marks.setdefault(name, now())
                out = original(*args, **kw)
                _marks.setdefault(name + "_out", now())
                return out

            return wrapper

        return make

    def io_turn(original: Callable) -> Callable:
        def wrapper(self: Any) -> Any:
            _last["io_turn"] = now()
            return original(self)

        return wrapper

    def drain(original: Callable) -> Callable:
        def wrapper(self: Any, *args: Any) -> Any:
            _last["drain"] = now()
            return original(self, *args)

        return wrapper

    def read(original: Callable) -> Callable:
        def wrapper(sock: Any) -> Any:
            frames = original(sock)
            _last["read"] = now()
            _marks.clear()
            return frames

        return wrapper

    def sequence(original: Callable) -> Callable:
        def wrapper(self: Any, identity: bytes, lane: Any, batch: Any, confirm: bool) -> Any:
            drained, read_at = _last["drain"], _last["read"]
            _marks["sequence"] = now()
            out = original(self, identity, lane, batch, confirm)
            stamp(("journaled", now(), batch))
            stamp(("append", _marks.get("append", 0), batch))
            stamp(("decoded", _marks.get("decode_out", 0), batch))
            stamp(("ingest", _marks.get("ingest", 0), batch))
            stamp(("sequence", _marks.get("sequence", 0), batch))
            stamp(("appended", _marks.get("append_out", 0), batch))
            stamp(("fanned", _marks.get("fan_out_out", 0), batch))
            stamp(("read", read_at, batch))
            stamp(("drain", drained, batch))
            return out

        return wrapper

    def sendto(original: Callable) -> Callable:
        def wrapper(self: Any, frames: Any, *args: Any, **kw: Any) -> Any:
            t0 = now()
            out = original(self, frames, *args, **kw)  # zmq.Again: not sent, not stamped
            stamp(("sendto", t0, frames[1]))
            stamp(("sendto_end", now(), frames[1]))
            return out

        return wrapper

    def recv(original: Callable) -> Callable:
        def wrapper(self: Any, *args: Any, **kw: Any) -> Any:
            frames = original(self, *args, **kw)
            stamp(("recv", now(), frames[1]))
            return frames

        return wrapper

    def deliver(original: Callable) -> Callable:
        def wrapper(self: Any, batch: Any, lo: int, hi: int, source: str) -> Any:
            stamp(("delivered", now(), (batch, lo, hi)))
            _turn_items.append((batch, lo, hi))
            return original(self, batch, lo, hi, source)

        return wrapper

    def sub_turn(original: Callable) -> Callable:
        def wrapper(self: Any, *args: Any) -> Any:
            _marks.clear()
            _turn_items.clear()
            out = original(self, *args)
            t = now()
            for item in _turn_items:
                stamp(("read_done", _marks.get("read_out", 0), item))
                stamp(("turn_done", t, item))
            return out

        return wrapper

    wrap(accumulator.Accumulator, "take", take)
    wrap(publisher_thread.PublisherThread, "_feed", feed)
    wrap(publisher_thread.PublisherThread, "_do", mark("do"))
    wrap(publisher_thread.PublisherThread, "_turn", io_turn)
    wrap(writer.JournalWriter, "append", mark("append"))
    wrap(protocol, "decode", mark("decode"))
    wrap(ingest.Ingest, "handle", mark("ingest"))
    wrap(gateway.Gateway, "_fan_out", mark("fan_out"))
    wrap(subscriber.Subscriber, "_deliver", deliver)
    wrap(subscriber.Subscriber, "_turn", sub_turn)
    wrap(feed_intake.FeedIntake, "read", mark("read"))
    wrap(gateway.Gateway, "_drain_router", drain)
    wrap(gateway, "take", read)
    wrap(gateway.Gateway, "_sequence", sequence)
    wrap(udp.UdpSender, "send_multipart", sendto)
    wrap(udp.UdpReceiver, "recv_multipart", recv)
    wrap(subscriber.Subscriber, "next_batch", on_hand_out(lambda d: stamp(("handed", now(), (d.batch, d.lo, d.hi)))))
    wrap(pipeline, "publish", ending_with(dump))
    wrap(pipeline, "subscribe", ending_with(dump))
    atexit.register(dump)


def analyse(directory: Path, windows: list[tuple[int, int]] | None = None) -> list[tuple[str, float, float, int]]:
    """Per sub-hop: (name, p50 µs, p99 µs, records) over every record traced end to end (with `windows`: only
    those published within one of these (start, end) wall-clock windows, in ns)."""
    import numpy as np

    stages: dict[str, dict[int, int]] = {s: {} for s in STAGES}
    for path in sorted(directory.glob("*.npz")):
        with np.load(path) as got:
            for stage in STAGES:
                if f"{stage}_ts" in got:
                    seen = stages[stage]
                    for ts, t in zip(got[f"{stage}_ts"].tolist(), got[f"{stage}_t"].tolist(), strict=True):
                        seen.setdefault(ts, t)  # the first pass (a re-send is not the trip measured)
    handed = stages["handed"]
    if windows is not None:
        handed = {ts: t for ts, t in handed.items() if any(lo <= ts <= hi for lo, hi in windows)}
    stages["publish"] = {ts: ts for ts in handed}
    rows = []
    for name, a, b in HOPS:
        first, then = stages[a], stages[b]
        d = np.array([then[ts] - first[ts] for ts in handed if ts in first and ts in then], dtype=np.int64)
        if len(d):
            rows.append((name, float(np.percentile(d, 50)) / 1e3, float(np.percentile(d, 99)) / 1e3, len(d)))
    return rows


# --- the driver -------------------------------------------------------------------------------------------------


def _zeps(dep: Any, n: int, rate: float) -> dict[str, float]:
    from gateway.bench import latency

    return latency.once(dep, n, rate)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000, help="per run at the first rate")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, nargs="+", default=[10_000.0], help="records/s (several: alternated)")
    parser.add_argument("--trace", type=Path, help="stamp every record at every stage, into this directory")
    parser.add_argument("--no-nats", action="store_true")
    parser.add_argument("--switch-interval", type=float, help="sys.setswitchinterval(S) in every ZEPS process")
    args = parser.parse_args()
    if args.trace or args.switch_interval:  # before any lab process starts: they inherit the environment
        site = Path(tempfile.mkdtemp(prefix="zeps-hops-site-"))
        (site / "sitecustomize.py").write_text(
            "import importlib.util, os, sys\n"
            f"if os.environ.get({SWITCH_ENV!r}):\n"
            f"    sys.setswitchinterval(float(os.environ[{SWITCH_ENV!r}]))\n"
            f"if os.environ.get({TRACE_ENV!r}):\n"
            f"    spec = importlib.util.spec_from_file_location('latency_hops', {str(Path(__file__).resolve())!r})\n"
            "    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); mod.install()\n"
        )
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    if args.switch_interval:
        os.environ[SWITCH_ENV] = str(args.switch_interval)
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
        os.environ[TRACE_ENV] = str(args.trace.resolve())
    import contextlib

    import gateway
    from gateway.bench import nats, pipeline, versus_nats
    from netlab import Lab

    print(f"gateway from {Path(gateway.__file__).parent}", file=sys.stderr)
    rates: list[float] = args.rate
    counts = {rate: max(1, round(args.records * rate / rates[0])) for rate in rates}  # as many seconds at each
    got: dict[tuple[str, float], list[dict[str, float]]] = {}
    windows: dict[float, list[tuple[int, int]]] = {rate: [] for rate in rates}
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    loads = []
    with contextlib.ExitStack() as stack:
        dep = stack.enter_context(
            pipeline.deployed(["sub"], tmp=tmp, transport="udp", options=pipeline.gateway_options())
        )
        if not args.no_nats:
            lab = stack.enter_context(Lab(["pub", "gw", "sub"]))
            url, _ = stack.enter_context(nats.server(tmp, lab))
        for i in range(args.runs):
            for rate in rates:
                loads.append(os.getloadavg()[0])
                start = time.time_ns()
                zeps = got.setdefault(("ZEPS", rate), [])
                zeps.append(_zeps(dep, counts[rate], rate))
                windows[rate].append((start, time.time_ns()))
                print(f"run {i + 1} at {rate:,.0f}/s ZEPS {_cells(zeps[-1])} load {loads[-1]:.1f}", file=sys.stderr)
                if not args.no_nats:
                    core = got.setdefault(("NATS core", rate), [])
                    core.append(versus_nats.nats_once(lab, url, counts[rate], rate, False, i))
                    print(f"run {i + 1} at {rate:,.0f}/s NATS {_cells(core[-1])}", file=sys.stderr)
    for (system, rate), runs in got.items():
        medians = {c: statistics.median(r[c] for r in runs) for c in ("p50", "p99", "p99.9")}
        print(f"{rate:,.0f}/s {system}: median {_cells(medians)}")
    for rate in rates if not args.no_nats else ():
        for c in ("p50", "p99", "p99.9"):
            pairs = zip(got["ZEPS", rate], got["NATS core", rate], strict=True)
            ratios = [z[c] / n[c] for z, n in pairs]
            each = ", ".join(f"{r:.2f}" for r in ratios)
            print(f"{rate:,.0f}/s ZEPS/NATS core {c}: median {statistics.median(ratios):.2f} (runs {each})")
    print(f"load average (1 min) at the runs: {', '.join(f'{x:.1f}' for x in loads)}")
    if args.trace:
        rows = {rate: {name: row for name, *row in analyse(args.trace, windows[rate] if len(rates) > 1 else None)}
                for rate in rates}  # fmt: skip
        print(f"{'sub-hop':24}" + "".join(f" {f'{r:,.0f}/s p50 µs':>14} {'p99 µs':>9}" for r in rates))
        for name, *_ in HOPS:
            cells = [rows[r].get(name, [math.nan] * 3) for r in rates]
            print(f"{name:24}" + "".join(f" {p50:14.1f} {p99:9.1f}" for p50, p99, _ in cells))
        traced = (
            f"{int(rows[r]['publish -> handed'][2])} at {r:,.0f}/s" for r in rates if "publish -> handed" in rows[r]
        )
        print("records traced end to end: " + ", ".join(traced))
    return 0


def _cells(r: dict[str, float]) -> str:
    return " / ".join(f"{r[c]:.2f}" for c in ("p50", "p99", "p99.9")) + " ms"


if __name__ == "__main__":
    sys.exit(main())
