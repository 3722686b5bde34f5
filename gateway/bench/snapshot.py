"""Snapshot costs for many keys: index build time and memory, snapshot serve time, end to end into a client.

    python -m gateway.bench.snapshot [--keys 1000000] [--updates 2] [--body 100]

Writes a journal in which each of `keys` keys is written `updates` times (`body`-byte bodies, ~60 KB
batches), then, in this process: builds the sidecar's SnapshotIndex from it (time, and resident memory
before and after), and produces every snapshot batch of all keys (time). Then it starts `zeps replay` on the
journal and times one ReplayClient receiving the whole snapshot (the sidecar's own index build included,
reported apart). Every step is bounded by `time_limit` seconds.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from gateway.bench.replay import sidecar
from gateway.client.replay_client import DEFAULT_FEATURES, ReplayClient
from gateway.journal import JournalReader, JournalWriter
from gateway.sidecar.snapshots import SnapshotFeed, SnapshotIndex
from gateway.wire import batch as B
from gateway.wire import protocol as P


def rss_mib() -> float:
    """Resident memory of this process."""
    status = Path("/proc/self/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert found is not None, "Linux /proc/self/status has a VmRSS line"
    return int(found.group(1)) / 1024


def write_journal(root: Path, stream: str, keys: int, updates: int, body: int) -> int:
    """Every key `updates` times, in key order each round; returns the number of records."""
    per_batch = max(1, 60_000 // (body + B.RECORD_OVERHEAD + 10))
    payload = b"x" * body
    now = time.time_ns()
    with JournalWriter.open(root, stream) as writer:
        for _ in range(updates):
            for start in range(0, keys, per_batch):
                recs = [(now, b"key%07d" % i, payload) for i in range(start, min(keys, start + per_batch))]
                writer.append(B.Batch.parse(B.encode(0, recs), check_crc=False))
        return writer.last_seq


def _bounded(what: str, deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"{what}: over the time limit")


def in_process(root: Path, stream: str, time_limit: float) -> dict[str, float]:
    """Build the index and serve one whole snapshot, in this process."""
    deadline = time.monotonic() + time_limit
    before = rss_mib()
    index = SnapshotIndex(JournalReader(root, stream))
    start = time.perf_counter()
    while not index.follow(1.0):
        _bounded("index build", deadline)
    built = time.perf_counter()
    after = rss_mib()
    frozen = index.freeze()
    assert frozen is not None
    froze = time.perf_counter()
    feed = SnapshotFeed(lambda: frozen, ())
    nbytes = 0
    while (part := feed.step()) is not None:
        nbytes += len(part[0])
        _bounded("snapshot batches", deadline)
    served = time.perf_counter()
    return {
        "keys": len(index),
        "build_s": built - start,
        "rss_mib": after - before,
        "freeze_s": froze - built,
        "serve_s": served - froze,
        "snapshot_mib": nbytes / 2**20,
    }


def over_tcp(root: Path, stream: str, keys: int, time_limit: float) -> dict[str, float]:
    """A sidecar process and one client receiving the snapshot of every key."""
    deadline = time.monotonic() + time_limit
    with sidecar(root) as (endpoint, _):
        features = (*DEFAULT_FEATURES, P.FEATURE_SNAPSHOT)
        with ReplayClient(endpoint, stream, features=features, window=16 << 20, timeout=time_limit) as client:
            start = time.perf_counter()
            client.snapshot(("key0000000",))  # answered once the sidecar has built its index
            while not isinstance(client.recv(), P.SnapshotEnd):
                _bounded("index build in the sidecar", deadline)
            ready = time.perf_counter()
            client.snapshot()
            got = 0
            while not isinstance(event := client.recv(), P.SnapshotEnd):
                if event is None:
                    raise RuntimeError(f"the sidecar stopped sending after {got} records")
                assert isinstance(event, B.Batch), event  # a snapshot is batches, then SNAPSHOT-END
                got += sum(1 for _ in event.raw())
                _bounded("snapshot over TCP", deadline)
            done = time.perf_counter()
    if got != keys:
        raise RuntimeError(f"the snapshot held {got} records, {keys} expected")
    return {"sidecar_build_s": ready - start, "tcp_s": done - ready, "tcp_records_per_s": got / (done - ready)}


def benchmark(keys: int = 1_000_000, updates: int = 2, body: int = 100, time_limit: float = 120.0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "journal"
        records = write_journal(root, "bench", keys, updates, body)
        return {"records": records} | in_process(root, "bench", time_limit) | over_tcp(root, "bench", keys, time_limit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=2, help="records per key (default 2)")
    parser.add_argument("--body", type=int, default=100)
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per step at most")
    args = parser.parse_args()
    for name, value in benchmark(args.keys, args.updates, args.body, args.time_limit).items():
        print(f"{name:20s} {value:14,.2f}" if isinstance(value, float) else f"{name:20s} {value:14,}")


if __name__ == "__main__":
    main()
