"""The gateway's CPU per record by thread, in the throughput benchmark's lab (`zeps bench throughput`'s rows).

Usage: python scripts/gateway_threads.py [RECORDS] [RUNS] [MANY] [TRANSPORT]. Root: it builds the benchmark's
namespace lab (hosts pub, gw, sub; gateway.bench.pipeline), and runs RECORDS (default 1,000,000) through it RUNS
times (default 3): a Publisher with `publish_many()` of MANY records a call (default 1,000; 0: one `publish()`
per record) into a reconciling Subscriber taking `next_batch().columns()`, over TRANSPORT (default epgm). Per
run it prints the delivered rate, CPU µs per record of publisher, gateway and subscriber (as the benchmark
does), and the gateway's split by thread from /proc/PID/task/*/stat: its loop (the process's main thread,
`python`), the multicast sender's (`pgm-send`: OpenPGM and the kernel's send path), libzmq's IO thread
(`ZMQbg/IO/0`: the ingest's TCP reads) and the journal's syncer. With PERF=1 the last run is recorded by
`perf record -g` into ./gateway-threads.perf.data (perf report --sort comm,dso,sym). The load average is printed
before and after: on a shared machine the rates are noisy, CPU per record less so; compare trees alternately
with PYTHONPATH=<checkout>.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gateway.bench import pipeline
from gateway.bench.throughput import zeps_once

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[tuple[int, str], float]:
    """CPU seconds (user + system) of each thread of `pid`, by (thread id, name)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[(int(tid), name)] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> int:
    args = [int(a) for a in sys.argv[1:4]]
    records, runs, many = (args + [1_000_000, 3, 1_000][len(args) :])[:3]
    transport = sys.argv[4] if len(sys.argv) > 4 else "epgm"
    print(f"load average {load()}; {records:,} records, publish_many({many}), {transport}://")
    with (
        tempfile.TemporaryDirectory() as tmp,
        pipeline.deployed(["sub"], tmp=Path(tmp), transport=transport, options=pipeline.gateway_options()) as dep,
    ):
        pid = dep.gateway_pid
        for run in range(runs):
            perf = None
            if os.environ.get("PERF") and run == runs - 1:
                perf = subprocess.Popen(["perf", "record", "-F", "2000", "-g", "-p", str(pid), "-o",
                                         "gateway-threads.perf.data"], stderr=subprocess.DEVNULL)  # fmt: skip
                time.sleep(1.0)  # perf attaches
            before = thread_cpu(pid)
            got = zeps_once(dep, records, pipeline.RATE_KBPS, False, True, many)
            after = thread_cpu(pid)
            if perf is not None:
                perf.send_signal(signal.SIGINT)
                perf.wait(30)
            split = sorted(((after[t] - before.get(t, 0.0)) / records * 1e6, t[1]) for t in after)
            threads = ", ".join(f"{name} {us:.2f}" for us, name in reversed(split) if us >= 0.005)
            print(f"run {run + 1}: {got['rate']:,.0f} records/s; CPU µs per record: publisher {got['pub_us']:.2f}, "
                  f"gateway {got['gw_us']:.2f}, subscriber {got['sub_us']:.2f}; gateway by thread: {threads}",
                  flush=True)  # fmt: skip
    print(f"load average {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
