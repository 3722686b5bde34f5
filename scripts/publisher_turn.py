"""Python per batch of the Publisher's IO thread, against a real gateway on loopback: call counts and a timing.

Usage: python scripts/publisher_turn.py [BURSTS] [count|time]. Publishes bursts of 10 records of 100 bytes, 1 ms
apart (the latency benchmark's shape), each burst one batch. `count` (the default) counts the Python and C calls
the IO thread makes per batch (a profile hook on that thread only: exact whatever the load, as
scripts/ingest_cost.py counts the gateway's); `time` times the IO thread's turns that sent a batch, split into
the ingest session's `handle` and the execution of its actions (`_do`: the ZeroMQ send). Compare trees
alternately with PYTHONPATH=<checkout>; timings on a shared machine are noisy.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from publisher_cost import _attach, free_port  # a sibling script

KEYS = [f"key{i:03d}" for i in range(10)]
BODY = b"x" * 100


def bursts(pub: Any, n: int) -> None:
    for _ in range(n):
        for key in KEYS:
            pub.publish(key, BODY)
        time.sleep(0.001)
    pub.flush()


def timed(owner: Any, name: str, into: dict[str, float]) -> None:
    """Wrap `owner.name` (on the instance) to note how long its last call took."""
    original: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kw)
        finally:
            into[name] = time.perf_counter() - t0

    setattr(owner, name, wrapper)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    mode = sys.argv[2] if len(sys.argv) > 2 else "count"
    counting = False
    calls = {"call": 0, "c_call": 0, "batch": 0}

    def hook(frame: FrameType, event: str, arg: Any) -> None:  # only in the threads started after it is set
        if counting and event in calls:
            calls[event] += 1
            if event == "call" and frame.f_code.co_name == "_send_batch":
                calls["batch"] += 1

    last: dict[str, float] = {}
    turns: list[tuple[float, float, float]] = []
    with tempfile.TemporaryDirectory() as journal:
        ingest = f"tcp://127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "gateway.cli", "gateway", "--journal", journal, "--ingest", ingest]
        gw = subprocess.Popen([*argv, "--stream", "bench"], stderr=subprocess.DEVNULL)
        try:
            if mode == "count":
                threading.setprofile(hook)
            pub = _attach(ingest)
            threading.setprofile(None)
            io = pub._io
            bursts(pub, 200)  # warm up
            if mode != "count":
                for owner, name in ((io, "_turn"), (io.session, "handle"), (io, "_do")):
                    timed(owner, name, last)
                timed_turn = io._turn

                def turn() -> float:
                    before = io.acc.taken
                    out = timed_turn()
                    if io.acc.taken != before:
                        turns.append((last["_turn"], last["handle"], last["_do"]))
                    return out

                io._turn = turn
            counting = True
            bursts(pub, n)
            counting = False
            pub.close()
        finally:
            gw.terminate()
            gw.wait(20)
    if mode == "count":
        batches = calls["batch"]
        print(f"IO thread per batch ({batches} batches): {calls['call'] / batches:.1f} Python calls, "
              f"{calls['c_call'] / batches:.1f} C calls")  # fmt: skip
    else:
        print(f"{len(turns)} turns that sent a batch")
        for i, what in enumerate(("turn", "handle", "_do (the send)")):
            print(f"{what}: median {statistics.median(t[i] for t in turns) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
