"""Per-batch Python cost of the gateway's ingest path, in one process: deterministic call counts and a timing.

Usage: python scripts/ingest_cost.py [BATCHES] [RUNS]. Builds a real single `Gateway` (journal in a temporary
directory, no multicast) whose ingest is bound on inproc://, attaches one publisher session over a DEALER
(batch, confirm, producer, as the Publisher does) and feeds it BATCHES PUBLISH-BATCH frames of 10 records of
100 bytes, one per drain, as at a low rate: each frame is sent, then `Gateway._drain_router` reads, decodes,
checks (producer, size, order), sequences and journals it. Prints the Python function calls per batch counted
by cProfile (deterministic: the same tree gives the same figure on a loaded machine) and the median time per
batch of `_drain_router` over RUNS runs (noisy on a shared machine: compare trees alternately, run by run,
with PYTHONPATH=<checkout>).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zmq

from gateway.sequencer.config import GatewayConfig
from gateway.sequencer.gateway import Gateway
from gateway.wire import batch as B
from gateway.wire import protocol as P

RECORDS = 10
BODY = b"x" * 100


def frames(n: int, pid: int = 0x5EED) -> list[bytes]:
    """n PUBLISH-BATCH frames of one producer, numbered on from 0 as a Publisher numbers them."""
    keys = [f"key{i:03d}".encode() for i in range(RECORDS)]
    out = []
    for i in range(n):
        records = [(time.time_ns(), key, BODY) for key in keys]
        batch = B.encode(0, records, producer=(pid, i * RECORDS))
        out.append(P.encode(P.PublishBatch(batch)))
    return out


def run(batches: int, profile: bool) -> tuple[float, int]:
    """(median seconds per batch, Python calls per batch; 0 unless `profile`)."""
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as journal:
        endpoint = f"inproc://ingest-cost-{os.getpid()}"
        gw = Gateway(GatewayConfig(streams=["bench"], journal=Path(journal), ingest=endpoint), ctx=ctx)
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(endpoint)
        for cmd in (
            P.Attach(P.PROTOCOL, P.VERSION, "bench"),
            P.Extend((P.FEATURE_BATCH, P.FEATURE_CONFIRM, P.FEATURE_PRODUCER)),
        ):
            dealer.send(P.encode(cmd))
            gw._drain_router()
            dealer.recv()
        lane = gw.lanes["bench"]
        todo = frames(batches)
        times: list[float] = []
        profiler = cProfile.Profile() if profile else None
        clock = time.perf_counter
        for frame in todo:
            dealer.send(frame)
            if profiler is not None:
                profiler.enable()
                gw._drain_router()
                profiler.disable()
            else:
                t0 = clock()
                gw._drain_router()
                times.append(clock() - t0)
            lane.confirms.clear()  # confirms are the timers' (once synced), not the ingest's
        assert lane.writer.last_seq == batches * RECORDS, lane.writer.last_seq
        calls = pstats.Stats(profiler).total_calls // batches if profiler is not None else 0  # type: ignore[attr-defined]
        dealer.close(0)
        gw.close()
    ctx.term()
    return (statistics.median(times) if times else 0.0), calls


def main() -> int:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    _, calls = run(batches, profile=True)
    medians = [run(batches, profile=False)[0] * 1e6 for _ in range(runs)]
    shown, load = " ".join(f"{m:.2f}" for m in medians), os.getloadavg()[0]
    print(f"calls/batch {calls}  median µs/batch {statistics.median(medians):.2f}  runs {shown}  load {load:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
