"""What an idle gap costs on this machine, without ZEPS: a wake-up across processes and Python run right after it.

Usage: python scripts/idle_wake.py [--gaps-ms 1 10] [--rounds N]

For each gap, N rounds: the parent sleeps the gap, writes a pipe and times how long the child (blocked in read)
takes to answer with its own clock; then it times a fixed Python loop of 200, 2,000 and 20,000 iterations run
right after the wake. It prints the medians per gap and the load average. The latency benchmark's pacing leaves
such gaps between bursts (10 ms at 1,000 records/s, 1 ms at 10,000/s: docs/benchmarks.md, "Why 1,000 records/s
is slower"): a wake that grows with the gap is the CPU (a vCPU that halted, caches other work evicted), not
ZEPS, and every thread hop and every piece of Python a batch passes pays it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

LOOPS = (200, 2_000, 20_000)


def _loop(n: int) -> int:
    total = 0
    for k in range(n):
        total += k * k
    return total


def _child(r: int, w: int) -> None:
    while os.read(r, 1) == b"x":
        os.write(w, time.perf_counter_ns().to_bytes(8, "little"))
    os._exit(0)


def measure(gap_s: float, rounds: int) -> tuple[float, dict[int, float]]:
    """(median wake µs, median loop µs per loop size) after `gap_s` asleep."""
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(to_child, from_child)
    wakes: list[float] = []
    loops: dict[int, list[float]] = {n: [] for n in LOOPS}
    try:
        for i in range(rounds):
            time.sleep(gap_s)
            t0 = time.perf_counter_ns()
            os.write(from_parent, b"x")
            woke = int.from_bytes(os.read(to_parent, 8), "little")
            wakes.append((woke - t0) / 1e3)
            n = LOOPS[i % len(LOOPS)]
            t1 = time.perf_counter_ns()
            _loop(n)
            loops[n].append((time.perf_counter_ns() - t1) / 1e3)
    finally:
        os.write(from_parent, b"q")
        os.waitpid(pid, 0)
        for fd in (to_child, from_parent, to_parent, from_child):
            os.close(fd)
    return statistics.median(wakes), {n: statistics.median(v) for n, v in loops.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gaps-ms", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    for gap in args.gaps_ms:
        wake, loops = measure(gap / 1000, args.rounds)
        cells = ", ".join(f"loop {n:,} {us:.1f} µs" for n, us in loops.items())
        print(f"gap {gap:g} ms: wake {wake:.1f} µs; {cells}; load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
