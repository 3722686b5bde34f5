"""Per-record cost of the Publisher against a real gateway on loopback (journal only, fsync group).

Usage: python scripts/publisher_cost.py [RECORDS] [RUNS]. Prints, per run and as medians, CPU time per record
(so a machine shared with other work skews it less than wall time): the application thread's in publish(), and
the whole client process's (every thread: application, IO thread, libzmq) for publish + flush, all confirmed.
Works against any checkout of the Publisher API (run with PYTHONPATH=<checkout> to measure another tree).
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import tempfile
import time

import zmq

from gateway.client.publisher import Publisher


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(records: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as journal:
        ingest = f"tcp://127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "gateway.cli", "gateway", "--journal", journal, "--ingest", ingest]
        gw = subprocess.Popen([*argv, "--stream", "bench"], stderr=subprocess.DEVNULL)
        try:
            pub = _attach(ingest)
            body = b"x" * 100
            keys = [f"key{i:03d}" for i in range(100)]
            thread0, process0 = time.thread_time(), time.process_time()
            for i in range(records):
                pub.publish(keys[i % 100], body)
            thread1 = time.thread_time()
            pub.flush()
            process1 = time.process_time()
            pub.close()
        finally:
            gw.terminate()
            gw.wait(20)
    return (thread1 - thread0) / records * 1e6, (process1 - process0) / records * 1e6


def _attach(ingest: str) -> Publisher:
    deadline = time.monotonic() + 30
    while True:
        try:
            return Publisher(ingest, "bench", confirm=True, timeout=30)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> None:
    records = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    calls, totals = [], []
    for _ in range(runs):
        call, total = one_run(records)
        calls.append(call)
        totals.append(total)
        print(f"publish() {call:.2f} us/record, publish+flush {total:.2f} us/record (CPU)", flush=True)
    print(
        f"median of {runs}: publish() {statistics.median(calls):.2f} us/record, publish+flush "
        f"{statistics.median(totals):.2f} us/record ({records} records of 100 bytes, zmq {zmq.zmq_version()})"
    )


if __name__ == "__main__":
    main()
