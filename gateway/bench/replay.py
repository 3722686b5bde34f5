"""Scenario 3, replay: records/s from the journal into one Python client, and a late joiner catching up
while live traffic continues; against a JetStream consumer replaying by start sequence.

- Rate: a journal of `catchup_records` records (100-byte bodies in the gateway's default ~60 KB batches)
  is written with `JournalWriter` directly; `zeps replay` serves it on loopback, and one `ReplayClient`
  reads it all from sequence 1 with DELIVER-BATCH (CRC checked, every record walked). The same client
  with plain DELIVER (one frame per record) is shown too. JetStream: nats-server on loopback, the records
  published as messages into a file-backed stream, then an ordered push consumer from sequence 1 walks
  them all (nats-py's fastest consumer here).
- Late joiner: in a lab, the gateway serves the same journal while a publisher adds 10,000 records/s; a
  `Subscriber(start="earliest")` is timed from its start until it has merged with the live feed (every
  record before that delivered, in order). JetStream: the stream holds the history, the same live rate
  is published, and an ordered consumer from sequence 1 is timed until nothing is pending.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.bench import BenchError, nats, pipeline
from gateway.bench.runner import (
    BODY,
    KEYS,
    STREAM,
    Plot,
    Progress,
    Result,
    Settings,
    Stat,
    Table,
    Target,
    need_disk,
    repeat,
    stop,
    stop_process,
)
from gateway.client.replay_client import ReplayClient
from gateway.client.subscriber import Subscriber
from gateway.journal import Durability, JournalWriter
from gateway.mcast import Tuning
from gateway.tools.deployment import Deployment
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire.columns import Columns
from netlab import Lab

TITLE = "Replay: journal -> one Python client, and a late joiner catching up"
LIVE_RATE = 10_000.0
JETSTREAM_MAX = 1_000_000  # JetStream is filled one message per record from Python: bounded for time
DEADLINE_S = 300.0


def estimate(settings: Settings) -> float:
    if settings.quick:
        return 40
    n = settings.catchup_records / 1e6
    return 60 + n * (2 + 3 * settings.runs * 1.5) + (JETSTREAM_MAX / 1e6) * (30 + 2 * settings.runs * 10)


def batch_records(body: int = BODY) -> int:
    """Records in one of the gateway's default ~60 KB batches."""
    return max(1, 60_000 // (body + B.RECORD_OVERHEAD + 6))


def write_journal(root: Path, records: int, *, body: int = BODY, until_bytes: int = 0) -> int:
    """Append `records` records (or batches until the stream holds `until_bytes`) to stream STREAM under
    `root`, fast: one encoded batch appended over and over (the writer gives each its sequences), no fsync.
    Returns the records written."""
    per_batch = batch_records(body)
    names = [k.encode() for k in pipeline.record_keys()]
    template = B.Batch.parse(B.encode(0, [(0, names[i % KEYS], b"x" * body) for i in range(per_batch)]))
    written = nbytes = 0
    with JournalWriter.open(root, STREAM, durability=Durability("never")) as writer:
        while (written < records) if not until_bytes else (nbytes < until_bytes):
            batch = template if written + per_batch <= records or until_bytes else _first(template, records - written)
            nbytes += len(writer.append(batch))
            written += batch.count
    return written


def _first(template: B.Batch, n: int) -> B.Batch:
    return B.Batch.parse(B.encode(0, ((ts, key, body) for _, ts, key, body in template.raw(hi=n - 1))))


@contextmanager
def sidecar(root: Path, *options: str) -> Iterator[tuple[str, int]]:
    """`zeps replay` on loopback serving `root` (with more `options`); its endpoint and pid. Stopped (by pid) on
    exit."""
    cmd = [sys.executable, "-m", "gateway.cli", "replay", "--journal", str(root), "--bind", "tcp://127.0.0.1:0"]
    cmd += options
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None  # stdout=PIPE
        line = proc.stdout.readline().decode()
        match = re.search(r" at (tcp://\S+)", line)
        if not match:
            raise BenchError(f"zeps replay did not start: {line!r}")
        yield match.group(1), proc.pid
    finally:
        stop_process(proc)


def replay_rate(endpoint: str, records: int, features: tuple[str, ...], *, columnar: bool = False) -> dict[str, float]:
    """Records/s for one client reading the whole stream from the start, walking every record (`columnar`:
    taking each batch as columns, no object per record), and the client's CPU seconds per record."""
    with ReplayClient(endpoint, STREAM, features=features, window=16 << 20) as client:
        start, deadline = time.perf_counter(), time.monotonic() + DEADLINE_S
        cpu = time.process_time()
        client.subscribe()
        got = 0
        while got < records and time.monotonic() < deadline:
            event = client.recv(timeout=5)
            if isinstance(event, B.Batch):
                if columnar:
                    got += len(Columns(event, event.first_seq, event.last_seq))
                else:
                    for _ in event.raw():
                        got += 1
            elif isinstance(event, P.Deliver):
                got += 1
            elif event is None:
                raise BenchError(f"the sidecar stopped sending after {got} of {records} records")
        seconds = time.perf_counter() - start
        return {"rate": got / seconds, "cpu_per_record": (time.process_time() - cpu) / max(got, 1)}


def run(settings: Settings) -> Result:
    progress = Progress("replay")
    records = settings.size(settings.catchup_records, 50_000)
    js_records = settings.size(min(records, JETSTREAM_MAX), 20_000)
    failures: list[str] = []
    # The journal (~125 B a record), and JetStream's store twice (loopback, then the lab; ~250 B a message).
    need_disk(settings.tmp, records * 125 + js_records * 500, "the replay benchmark")
    with tempfile.TemporaryDirectory(prefix="zeps-bench-", dir=settings.tmp) as tmp:
        root = Path(tmp)
        progress(f"writing a journal of {records:,} records")
        write_journal(root, records)
        with sidecar(root) as (endpoint, _):
            batched = repeat(settings.runs, progress, f"ZEPS replay of {records:,} records, DELIVER-BATCH",
                             lambda _: replay_rate(endpoint, records, (P.FEATURE_BATCH,)), failures)  # fmt: skip
            plain = repeat(1, progress, f"ZEPS replay of {records // 25:,} records, DELIVER",
                           lambda _: replay_rate(endpoint, records // 25, ()), failures)  # fmt: skip
        with nats.server(settings.tmp) as (url, _):
            progress(f"filling JetStream with {js_records:,} messages")
            nats.create_stream(url)
            filled = nats.publish(url, js_records, 0.0)
            js = repeat(settings.runs, progress, f"JetStream replay of {js_records:,} messages",
                        lambda _: _js_rate(url, js_records), failures)  # fmt: skip
        ours_late = _zeps_late_joiner(settings, progress, root, failures)
    js_late = _js_late_joiner(settings, progress, js_records, failures)
    rate, js_rate = Stat.of(batched.get("rate"), "records/s"), Stat.of(js.get("rate"), "msg/s")
    catch = Stat.of(ours_late.get("seconds"), "s", 1)
    return Result(
        "replay",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                "replay into one Python client, from sequence 1",
                ("system", "records", "rate"),
                [
                    ("ZEPS, DELIVER-BATCH (~60 KB batches)", f"{records:,}", rate),
                    (
                        "ZEPS, DELIVER (one frame per record)",
                        f"{records // 25:,}",
                        Stat.of(plain.get("rate"), "records/s"),
                    ),
                    ("JetStream ordered consumer, by start sequence", f"{js_records:,}", js_rate),
                ],
            ),
            Table(
                f"late joiner catching up while {LIVE_RATE:,.0f} records/s of live traffic continue",
                ("system", "history", "time to catch up", "records delivered by then", "catch-up rate"),
                [
                    (
                        "ZEPS Subscriber (earliest)",
                        f"{records:,}",
                        catch,
                        Stat.of(ours_late.get("records")),
                        Stat.of(ours_late.get("rate"), "records/s"),
                    ),
                    (
                        "JetStream ordered consumer from 1",
                        f"{js_records:,}",
                        Stat.of(js_late.get("seconds"), "s", 1),
                        Stat.of(js_late.get("records")),
                        Stat.of(js_late.get("rate"), "msg/s"),
                    ),
                ],
            ),
        ],
        targets=[
            Target("replay at least 1,000,000 records/s into one client", str(rate), rate.median >= 1_000_000),
            Target(
                "faster than JetStream (replay rate)",
                f"{rate.median / js_rate.median:.1f}x JetStream's",
                rate.median > js_rate.median,
            ),
        ],
        plots=[
            Plot(
                "replay",
                "Replay into one Python client",
                "",
                "records/s",
                {"ZEPS DELIVER-BATCH": ([0], [rate.median]), "JetStream": ([1], [js_rate.median])},
                kind="bar",
            )
        ],
        notes=[*failures, f"JetStream was filled at {js_records / filled['seconds']:,.0f} messages/s by nats-py."],
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
    )


def _js_rate(url: str, count: int) -> dict[str, float]:
    got = nats.replay(url, 1, count)
    if got["records"] < count:
        raise BenchError(f"the JetStream consumer got {got['records']} of {count} messages")
    return {"rate": got["records"] / got["seconds"]}


# --- late joiners ------------------------------------------------------------------------------------------


def _zeps_late_joiner(settings: Settings, progress: Progress, root: Path, failures: list[str]) -> dict:
    with Lab(["pub", "gw", "sub"]) as lab:
        dep = Deployment(lab, root, STREAM, gateway_args=pipeline.gateway_options())
        try:
            return repeat(settings.runs, progress, "ZEPS late joiner",
                          lambda _: _late(lab, lab.start("sub", zeps_late_joiner, dep.for_host("sub"), dep.replay),
                                          pipeline.publish, dep.ingest), failures)  # fmt: skip
        finally:
            dep.close()


def _js_late_joiner(settings: Settings, progress: Progress, count: int, failures: list[str]) -> dict:
    with Lab(["pub", "gw", "sub"]) as lab, nats.server(settings.tmp, lab) as (url, _):
        progress(f"filling JetStream in the lab with {count:,} messages")
        lab.run("pub", nats.create_stream, url)
        lab.run("pub", nats.publish, url, count, 0.0, timeout=DEADLINE_S)
        joiner = lambda: lab.start("sub", nats.catch_up, url)  # noqa: E731
        return repeat(settings.runs, progress, "JetStream late joiner",
                      lambda _: _late(lab, joiner(), nats.publish, url), failures)  # fmt: skip


def _late(lab: Lab, joiner: Any, publish: Any, target: str) -> dict[str, float]:
    """Live traffic from host pub while the late joiner runs; the publisher is stopped when it is done."""
    live = lab.start("pub", publish, target, int(LIVE_RATE * DEADLINE_S), LIVE_RATE)
    try:
        got = joiner.result(timeout=DEADLINE_S + 30)
    finally:
        stop(joiner, live)
    return {"seconds": got["seconds"], "records": got["records"], "rate": got["records"] / got["seconds"]}


def zeps_late_joiner(multicast: list[str], replay: str) -> dict:
    """In sub: from the first record until merged with live and every record up to the live edge (as of the
    merge) handed to the application; every record walked and checked in order."""
    start = time.perf_counter()
    tuning = Tuning(rate_kbps=pipeline.RATE_KBPS)
    with Subscriber(STREAM, multicast=multicast, replay=replay, start="earliest", tuning=tuning) as sub:
        got, edge, deadline = 0, None, time.monotonic() + DEADLINE_S
        while (edge is None or got < edge) and time.monotonic() < deadline:
            delivery = sub.next_batch(timeout=0.5)
            if edge is None and sub.state == "MERGED":
                edge = sub.head
            if delivery is None:
                continue
            if delivery.lo != got + 1:
                raise BenchError(f"the late joiner got {delivery.lo} after {got}")
            for _ in delivery.raw():
                got += 1
        if edge is None or got < edge:
            raise BenchError(f"the late joiner did not catch up within {DEADLINE_S} s ({got:,} records)")
        return {"seconds": time.perf_counter() - start, "records": got}
