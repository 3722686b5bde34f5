"""Replay throughput: records/s from a `zeps replay` process into a Python ReplayClient, batched vs per-record.

    python -m gateway.replay_bench [--records 300000] [--body 100] [--curve]

Writes a journal of `records` records (`body`-byte bodies, in batches of the size the gateway makes by
default: ~60 KB) to a temporary directory, starts the sidecar on it as a subprocess, and times one client
replaying it all from sequence 0 with DELIVER-BATCH (iterating every record of every batch) and with plain
DELIVER. Each run is bounded by `time_limit` seconds; a run cut short reports the rate it reached. With
--curve, the sidecar and the client use CURVE (encrypted, authenticated TCP), to measure what it costs.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from gateway import batch as B
from gateway import protocol as P
from gateway.auth import CurveClientKeys
from gateway.deployment import Keys
from gateway.journal import JournalWriter
from gateway.replay_client import ReplayClient


def write_journal(root: Path, stream: str, records: int, body: int) -> None:
    per_batch = max(1, 60_000 // (body + B.RECORD_OVERHEAD + 8))  # the gateway's default 60 KB batches
    payload = b"x" * body
    with JournalWriter.open(root, stream) as writer:
        for start in range(0, records, per_batch):
            n = min(per_batch, records - start)
            raw = B.encode(0, [(start + i, b"key%03d" % ((start + i) % 100), payload) for i in range(n)])
            writer.append(B.Batch.parse(raw, check_crc=False))


def _replay(
    endpoint: str,
    stream: str,
    records: int,
    features: tuple[str, ...],
    time_limit: float,
    curve: CurveClientKeys | None,
) -> float:
    """Records/s for one client reading the whole stream from the start."""
    with ReplayClient(endpoint, stream, features=features, window=16 << 20, curve=curve) as client:
        start = time.perf_counter()
        deadline = time.monotonic() + time_limit
        client.subscribe()
        got = 0
        while got < records and time.monotonic() < deadline:
            event = client.recv(timeout=5)
            if isinstance(event, B.Batch):
                got += sum(1 for _ in event.raw())
            elif isinstance(event, P.Deliver):
                got += 1
            elif event is None:
                raise RuntimeError(f"the sidecar stopped sending after {got} of {records} records")
        return got / (time.perf_counter() - start)


@contextlib.contextmanager
def sidecar(root: Path, *options: str) -> Iterator[str]:
    """`zeps replay` on `root` (with more `options`) as a subprocess on a free loopback port; yields its endpoint."""
    cmd = [sys.executable, "-m", "gateway.cli", "replay", "--journal", str(root), "--bind", "tcp://127.0.0.1:0"]
    cmd += options
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode()  # type: ignore[union-attr]
        match = re.search(r" at (tcp://\S+)", line)
        if not match:
            raise RuntimeError(f"zeps replay did not start: {line!r}")
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def benchmark(
    records: int = 300_000, body: int = 100, time_limit: float = 60.0, curve: bool = False
) -> dict[str, float]:
    """{"batch": records/s, "deliver": records/s} on a fresh journal and sidecar (CURVE between them if asked)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "journal"
        write_journal(root, "bench", records, body)
        keys = Keys.create(Path(tmp) / "keys") if curve else None
        client = keys.client() if keys else None
        with sidecar(root, *(keys.server_args() if keys else ())) as endpoint:
            return {
                "batch": _replay(endpoint, "bench", records, (P.FEATURE_BATCH,), time_limit, client),
                "deliver": _replay(endpoint, "bench", records, (), time_limit, client),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--body", type=int, default=100)
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per run at most")
    parser.add_argument("--curve", action="store_true", help="CURVE between the sidecar and the client")
    args = parser.parse_args()
    for mode, rate in benchmark(args.records, args.body, args.time_limit, args.curve).items():
        print(f"{mode:8s} {rate:12,.0f} records/s ({args.records} records, {args.body}-byte bodies)")


if __name__ == "__main__":
    main()
