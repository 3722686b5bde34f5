"""The udp:// repair of a lost record, stage by stage, in the recovery scenario's lab (hosts pub, gw, sub; one
feed, 10,000 records/s, random loss into host sub).

Usage: python scripts/repair_stages.py [--records N] [--loss 1% 5% ...]

Run it with PYTHONPATH=<checkout> to measure another tree (alternate the trees for a before/after). Every lab
process stamps the repair's stages with time.time_ns() (CLOCK_REALTIME: the lab's hosts are namespaces of one
machine, one clock), through wrappers installed at start-up by a sitecustomize on PYTHONPATH; each stage is
keyed by sequence numbers, so the gaps of one fill request are followed from the gateway to the application:

  mcast sent -> gap seen     the gateway's sendto of the lost record's datagram to the subscriber's last
                             receive before it asked (the next datagram's arrival, and the rest of that read)
  gap seen -> asked          the reconciler's turn until the fill request datagram was sent
  asked -> sidecar           the request's trip and the sidecar's wake (its answerer called)
  sidecar answer             the journal read and the answer's encoding (FillAnswerer.answer)
  sidecar -> received        the answer's trip and the subscriber's wake (its receive returned the batch)
  received -> handed         reconcile, and next_batch() handing the first missing record out
  asked -> handed            the whole repair from the request, for the range's first record
  mcast sent -> handed       every record a fill request covered, from its multicast to its delivery

A request whose answer was lost is asked again on the subscriber's timer: those show in the tails of "asked
-> handed"; repeats are counted. The end-to-end percentiles are the recovery scenario's own.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRACE_ENV = "ZEPS_REPAIR_TRACE"
STAGES = (
    "mcast sent -> gap seen",
    "gap seen -> asked",
    "asked -> sidecar",
    "sidecar answer",
    "sidecar -> received",
    "received -> handed",
    "asked -> handed",
    "mcast sent -> handed",
)

# --- the stamps (installed in every lab process when TRACE_ENV names a directory) ----------------------------

_stamps: list[tuple[Any, ...]] = []
_last_recv = [0]


def dump() -> None:
    """Append this process's stamps to DIR/<pid>.pkl (multicast datagrams reduced to their sequences)."""
    from gateway.wire import batch as B

    directory = os.environ.get(TRACE_ENV)
    if not directory or not _stamps:
        return
    out = []
    for stamp in _stamps:
        if stamp[0] == "sendto":
            if stamp[2][:2] != B.MAGIC:
                continue  # a heartbeat
            batch = B.Batch.parse(stamp[2], check_crc=False)
            stamp = ("sendto", stamp[1], batch.first_seq, batch.last_seq)
        out.append(stamp)
    with open(Path(directory) / f"{os.getpid()}.pkl", "ab") as f:
        pickle.dump(out, f)
    _stamps.clear()


def install() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from latency_hops import ending_with, on_hand_out, wrap

    from gateway.bench import pipeline
    from gateway.client import datagram_fills, subscriber
    from gateway.errors import FillError
    from gateway.sidecar import fills
    from gateway.transport import udp
    from gateway.wire import fill as F

    now, stamp = time.time_ns, _stamps.append

    def sendto(original: Callable) -> Callable:
        def wrapper(self: Any, frames: Any, *args: Any, **kw: Any) -> Any:
            t = now()
            out = original(self, frames, *args, **kw)
            stamp(("sendto", t, bytes(frames[1])))
            if len(_stamps) >= 2000:  # the gateway ends by a signal: keep what it stamped
                dump()
            return out

        return wrapper

    def recv(original: Callable) -> Callable:
        def wrapper(self: Any, *args: Any, **kw: Any) -> Any:
            frames = original(self, *args, **kw)
            _last_recv[0] = now()
            return frames

        return wrapper

    def ask(original: Callable) -> Callable:
        def wrapper(self: Any, rid: int, lo: int, hi: int, at: float) -> Any:
            asked = original(self, rid, lo, hi, at)
            stamp(("ask", lo, hi, _last_recv[0], now(), asked))
            return asked

        return wrapper

    def receive(original: Callable) -> Callable:
        def wrapper(self: Any, *args: Any, **kw: Any) -> Any:
            got = original(self, *args, **kw)
            t = now()
            for _, batch in got:
                stamp(("answer", t, batch.first_seq, batch.last_seq))
            return got

        return wrapper

    def expire(original: Callable) -> Callable:
        def wrapper(self: Any, *args: Any) -> Any:
            before = self.stats.requests
            out = original(self, *args)
            if self.stats.requests > before:
                stamp(("again", self.stats.requests - before))
            return out

        return wrapper

    def answer(original: Callable) -> Callable:
        def wrapper(self: Any, data: bytes, host: str, at: float) -> Any:
            t = now()
            out = original(self, data, host, at)
            with contextlib.suppress(FillError):  # a malformed request: answered by nothing
                stamp(("served", F.decode_request(data, self.keys).first, t, now()))
            dump()
            return out

        return wrapper

    wrap(udp.UdpSender, "send_multipart", sendto)
    wrap(udp.UdpReceiver, "recv_multipart", recv)
    wrap(datagram_fills.DatagramFills, "ask", ask)
    wrap(datagram_fills.DatagramFills, "receive", receive)
    wrap(datagram_fills.DatagramFills, "expire", expire)
    wrap(fills.FillAnswerer, "answer", answer)
    wrap(subscriber.Subscriber, "next_batch", on_hand_out(lambda d: stamp(("handed", now(), d.lo, d.hi))))
    wrap(pipeline, "publish", ending_with(dump))
    wrap(pipeline, "subscribe", ending_with(dump))
    atexit.register(dump)


def analyse(directory: Path) -> tuple[dict[str, list[int]], int, int]:
    """Per stage, its durations (ns); the fill requests sent first and again."""
    stamps: list[tuple[Any, ...]] = []
    for path in directory.glob("*.pkl"):
        with open(path, "rb") as f:
            while True:
                try:
                    stamps += pickle.load(f)
                except EOFError:
                    break
    sent: dict[int, int] = {}
    handed: dict[int, int] = {}
    received: dict[int, int] = {}
    served: dict[int, tuple[int, int]] = {}
    for kind, *fields in stamps:
        if kind in ("sendto", "handed", "answer"):
            t, lo, hi = fields
            into = {"sendto": sent, "handed": handed, "answer": received}[kind]
            for seq in range(lo, hi + 1):
                into.setdefault(seq, t)  # the first time: a repeat is not the trip measured
        elif kind == "served":
            served.setdefault(fields[0], (fields[1], fields[2]))
    asks = [s[1:] for s in stamps if s[0] == "ask" and s[5]]
    again = sum(s[1] for s in stamps if s[0] == "again")
    got: dict[str, list[int]] = {name: [] for name in STAGES}

    def add(name: str, a: int | None, b: int | None) -> None:
        if a and b:
            got[name].append(b - a)

    for lo, hi, seen, asked, _ in asks:
        add("mcast sent -> gap seen", sent.get(lo), seen)
        add("gap seen -> asked", seen, asked)
        at, done = served.get(lo, (0, 0))
        add("asked -> sidecar", asked, at)
        add("sidecar answer", at, done)
        add("sidecar -> received", done, received.get(lo))
        add("received -> handed", received.get(lo), handed.get(lo))
        add("asked -> handed", asked, handed.get(lo))
        for seq in range(lo, hi + 1):
            add("mcast sent -> handed", sent.get(seq), handed.get(seq))
    return got, len(asks), again


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=30_000, help="per case")
    parser.add_argument("--loss", nargs="+", default=["1%", "5%"], help="the recovery scenario's loss rows")
    args = parser.parse_args()
    site = Path(tempfile.mkdtemp(prefix="zeps-repair-site-"))
    (site / "sitecustomize.py").write_text(
        "import importlib.util, os\n"
        f"if os.environ.get({TRACE_ENV!r}):\n"
        f"    spec = importlib.util.spec_from_file_location('repair_stages', {str(Path(__file__).resolve())!r})\n"
        "    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); mod.install()\n"
    )
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    import numpy as np

    import gateway
    from gateway.bench import recovery
    from gateway.bench.runner import Settings

    class Sized(Settings):
        def size(self, full: int, quick: int) -> int:
            return int(args.records)

    print(f"gateway from {Path(gateway.__file__).parent}", file=sys.stderr)
    for loss in args.loss:
        trace = Path(tempfile.mkdtemp(prefix="zeps-repair-"))
        os.environ[TRACE_ENV] = str(trace)  # before the lab's processes start: they inherit it
        load = os.getloadavg()[0]
        result = recovery.run(Sized(runs=1), [("udp", loss, 1)])
        row = result.tables[0].rows[0]
        got, asks, again = analyse(trace)
        print(f"udp, {loss} loss, {args.records:,} records, load {load:.1f}: p50 {row[1]} p99 {row[2]} "
              f"p99.9 {row[3]}; {asks} fill requests, {again} asked again")  # fmt: skip
        for name in STAGES:
            if d := got[name]:
                a = np.array(d) / 1e3
                p50, p99 = np.percentile(a, 50), np.percentile(a, 99)
                print(f"  {name:24} p50 {p50:8.0f} µs  p99 {p99:8.0f} µs  ({len(a)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
