"""Scenario 6, memory: gateway and replay sidecar RSS over a large journal, with a client that stops
granting credit.

A journal of `--journal-gb` GiB is written with `JournalWriter` directly (no fsync; deleted afterwards;
free space is checked first). The gateway and sidecar then serve it in a lab while a publisher adds
20,000 records/s. On host sub, client A reads the stream from sequence 1 as fast as it can (its cursor
sweeps the big journal); client B subscribes from sequence 1, grants 4 MiB of credit once and then only
answers PINGs, never granting more. The bench samples both servers' RSS every half second.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import zmq

from gateway.bench import BenchError, pipeline, replay
from gateway.bench.runner import STREAM, Plot, Progress, Result, Settings, Table, Target, need_disk, rss_bytes, stop
from gateway.client.replay_client import ReplayClient
from gateway.mcast import Tuning
from gateway.tools.deployment import Deployment
from gateway.wire import batch as B
from gateway.wire import protocol as P
from netlab import Lab

TITLE = "Memory: gateway and replay RSS with a large journal and a client that stops granting credit"
LIVE_RATE = 20_000.0
# PGM keeps sent packets for repairs up to its transmit window (rate x recovery interval) whatever the
# traffic: at LIVE_RATE a 200 Mbit/s window fills in about 20 s, so the run sees the gateway's RSS reach
# it and stay (at the throughput scenario's 1 Gbit/s it would still be filling when the run ends).
RATE_KBPS = 200_000
STUCK_WINDOW = 4 << 20
SAMPLE_S = 0.5
FLAT_MIB = 16.0


def estimate(settings: Settings) -> float:
    journal_gb = 0.05 if settings.quick else settings.journal_gb
    return 20 + journal_gb * 15 + _duration(settings)


def _duration(settings: Settings) -> float:
    return 6.0 if settings.quick else 60.0


def run(settings: Settings) -> Result:
    progress = Progress("memory")
    journal_bytes = int((0.05 if settings.quick else settings.journal_gb) * 2**30)
    need_disk(settings.tmp, int(journal_bytes * 1.1), "the memory benchmark's journal")
    duration = _duration(settings)
    with tempfile.TemporaryDirectory(prefix="zeps-bench-", dir=settings.tmp) as tmp:
        root = Path(tmp)
        written = 0
        while (size := _journal_size(root)) < journal_bytes:
            written += replay.write_journal(root, 0, until_bytes=min(2**30, journal_bytes - size))
            progress(f"journal: {written:,} records, {_journal_size(root) / 2**30:.2f} GiB")
        with Lab(["pub", "gw", "sub"]) as lab:
            dep = Deployment(lab, root, STREAM, gateway_args=pipeline.gateway_options(RATE_KBPS))
            try:
                samples, clients = _observe(dep, written, duration, progress)
            finally:
                dep.close()
    return _result(settings, progress, journal_bytes, written, duration, samples, clients)


def _journal_size(root: Path) -> int:
    stream = root / STREAM
    return sum(f.stat().st_size for f in stream.iterdir()) if stream.is_dir() else 0


def _observe(dep: Deployment, history: int, duration: float, progress: Progress) -> tuple[dict, dict]:
    lab = dep.lab
    live = lab.start("pub", pipeline.publish, dep.ingest, int(LIVE_RATE * duration * 2), LIVE_RATE)
    reader = lab.start("sub", read_for, dep.replay, duration)
    stuck = lab.start("sub", stop_granting, dep.replay, duration)
    samples: dict[str, list[tuple[float, float]]] = {"gateway": [], "replay sidecar": []}
    start = time.monotonic()
    try:
        while time.monotonic() - start < duration:
            t = time.monotonic() - start
            for name, proc in (("gateway", dep.gateway), ("replay sidecar", dep.sidecar)):
                assert proc is not None  # both run for the whole observation
                samples[name].append((t, rss_bytes(proc.pid) / 2**20))
            if len(samples["gateway"]) % 20 == 0:
                progress(f"{t:.0f}/{duration:.0f} s: RSS gateway {samples['gateway'][-1][1]:.0f} MiB, "
                         f"sidecar {samples['replay sidecar'][-1][1]:.0f} MiB")  # fmt: skip
            time.sleep(SAMPLE_S)
        clients = {"reader": reader.result(timeout=60), "stuck": stuck.result(timeout=60)}
    finally:
        stop(reader, stuck, live)
    if history and clients["reader"]["records"] == 0:
        raise BenchError("client A read nothing from the sidecar")
    return samples, clients


def _result(
    settings: Settings,
    progress: Progress,
    journal_bytes: int,
    written: int,
    duration: float,
    samples: dict,
    clients: dict,
) -> Result:
    # PGM keeps what it sent for repairs: its transmit window, RATE x RECOVERY_IVL, fills and then stays.
    window = RATE_KBPS * 1000 / 8 * Tuning().recovery_ivl_ms / 1000 / 2**20
    rows, flat = [], True
    for name, series in samples.items():
        values = [mib for _, mib in series]
        tail = values[len(values) * 3 // 4 :] or values
        bound = values[0] + FLAT_MIB + (window * 1.1 if name == "gateway" else 0)  # + packet overhead
        flat &= max(tail) - tail[0] <= FLAT_MIB and max(values) <= bound
        rows.append((name, f"{values[0]:.1f}", f"{max(values):.1f}", f"{values[-1]:.1f}",
                     f"{max(tail) - tail[0]:+.1f}", f"{bound:.0f}"))  # fmt: skip
    reader, stuck = clients["reader"], clients["stuck"]
    return Result(
        "memory",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"RSS in MiB over {duration:.0f} s, journal of {journal_bytes / 2**30:.2f} GiB ({written:,} records)",
                ("process", "first sample", "peak", "last sample", "growth, last quarter", "bound"),
                rows,
            ),
            Table(
                "the clients",
                ("client", "records received", "bytes received"),
                [
                    ("A: reads from sequence 1 at full speed", f"{reader['records']:,}", f"{reader['bytes']:,}"),
                    ("B: 4 MiB of credit once, then none", f"{stuck['records']:,}", f"{stuck['bytes']:,}"),
                ],
            ),
        ],
        targets=[
            Target(
                f"RSS flat: at most {FLAT_MIB:g} MiB more over the last quarter, never above the bound",
                ", ".join(f"{r[0]} peak {r[2]} MiB, {r[4]} MiB" for r in rows),
                flat,
            )
        ],
        plots=[
            Plot(
                "memory",
                f"RSS with a {journal_bytes / 2**30:.1f} GiB journal",
                "seconds",
                "RSS MiB",
                {name: ([t for t, _ in s], [m for _, m in s]) for name, s in samples.items()},
            )
        ],
        notes=[
            f"Journal size used: {journal_bytes / 2**30:.2f} GiB (--journal-gb); it was deleted afterwards.",
            f"The gateway's bound is its start plus PGM's transmit window, {window:.0f} MiB of data (10% more for "
            f"packet headers) at --rate-kbps "
            f"{RATE_KBPS:,} and the default 2 s recovery interval: OpenPGM keeps sent packets for "
            "repairs until the window is full, whatever the traffic, so RSS climbs to it and then stays. Lower "
            "--rate-kbps or --recovery-ivl-ms to lower it. The sidecar's bound is its start: one read buffer per "
            "cursor, and frames only while a client has credit.",
        ],
        runs=1,
        seconds=time.monotonic() - progress.start,
    )


def read_for(endpoint: str, seconds: float) -> dict[str, int]:
    """In sub, client A: read from sequence 1 for `seconds`, walking every record."""
    records = nbytes = 0
    with ReplayClient(endpoint, STREAM, window=16 << 20) as client:
        client.subscribe()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            event = client.recv(timeout=1)
            if isinstance(event, B.Batch):
                nbytes += event.nbytes
                for _ in event.raw():
                    records += 1
    return {"records": records, "bytes": nbytes}


def stop_granting(endpoint: str, seconds: float) -> dict[str, int]:
    """In sub, client B: ZEPS by hand, so that credit is granted exactly once; then it only answers PINGs."""
    records = nbytes = 0
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        for request in (P.Attach(P.PROTOCOL, P.VERSION, STREAM), P.Extend((P.FEATURE_BATCH,)), P.Subscribe("", 0),
                        P.Credit(STUCK_WINDOW)):  # fmt: skip
            sock.send(P.encode(request))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not sock.poll(200):
                continue
            cmd = P.decode(sock.recv())
            if isinstance(cmd, P.Ping):
                sock.send(P.encode(P.PingOk()))
            elif isinstance(cmd, P.DeliverBatch):
                nbytes += len(cmd.batch)
                records += B.HEADER.unpack_from(cmd.batch)[5]
            elif isinstance(cmd, P.Invalid | P.Detach):
                raise BenchError(f"the sidecar ended the stuck client's session: {cmd}")
    return {"records": records, "bytes": nbytes}
