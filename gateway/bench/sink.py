"""Spark sink: records/s from a local[2] Spark job into one gateway on loopback, through the `zeps` sink.

A gateway journals one stream on loopback (no multicast). A DataFrame of records (100-byte bodies, 100 keys)
is generated in Spark and cached, in two partitions, and a tenth of it written once to warm up (Python
workers start, modules load); the timed part is `df.write.format("zeps")...save()`:
two tasks, each publishing its partition with its own confirming Publisher and waiting for every confirm.
The journal's head is checked against the records written (each exactly once). Spark's session start is not
timed; it needs the spark extra (docs/spark.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import zmq

from gateway.bench import BenchError
from gateway.bench.runner import (
    BODY,
    KEYS,
    STREAM,
    Progress,
    Result,
    Settings,
    Stat,
    Table,
    Target,
    repeat,
    stop_process,
)
from gateway.errors import NotAJournal
from gateway.journal import JournalReader
from gateway.spark import SparkUnavailable
from gateway.wire import protocol as P

TITLE = "Spark sink: local[2] into one gateway on loopback"
TARGET = 200_000  # records/s (issue #22)
READY_S = 30.0


def estimate(settings: Settings) -> float:
    return 40 + settings.runs * (5 if settings.quick else 15)


@contextlib.contextmanager
def gateway(journal: Path) -> Iterator[str]:
    """`zeps gateway` journaling STREAM on a free loopback port; its ingest endpoint. Stopped (by pid) on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        ingest = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    cmd = [sys.executable, "-m", "gateway.cli", "gateway", "--journal", str(journal), "--ingest", ingest]
    proc = subprocess.Popen([*cmd, "--stream", STREAM], stderr=subprocess.DEVNULL)
    try:
        _await_ping(proc, ingest)
        yield ingest
    finally:
        stop_process(proc)


def _await_ping(proc: subprocess.Popen, ingest: str) -> None:
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(ingest)
    try:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline and proc.poll() is None:
            sock.send(P.encode(P.Ping()))
            if sock.poll(200):
                return
    finally:
        sock.close()
    raise BenchError(f"the gateway at {ingest} did not answer PING within {READY_S} s (exit {proc.poll()})")


def run(settings: Settings) -> Result:
    from gateway.spark import session

    progress = Progress("sink")
    count = settings.size(1_000_000, 20_000)
    failures: list[str] = []
    load_before = os.getloadavg()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="zeps-bench-", dir=settings.tmp) as tmp,
            gateway(Path(tmp) / "journal") as ingest,
            session("zeps-bench-sink", master="local[2]") as spark,
        ):
            from pyspark.sql import DataFrame
            from pyspark.sql import functions as F

            def frame(n: int) -> DataFrame:
                return spark.range(n, numPartitions=2).select(
                    F.format_string("key%03d", F.col("id") % KEYS).alias("key"), F.lit(b"x" * BODY).alias("body")
                )

            def write(df: DataFrame) -> None:
                df.write.format("zeps").option("ingest", ingest).option("stream", STREAM).mode("append").save()

            df = frame(count).cache()
            df.count()
            progress(f"gateway at {ingest}, {count:,} records cached in 2 partitions; a write to warm up")
            write(frame(count // 10))  # not timed: Python workers start, modules load

            def once(_: int) -> dict[str, float]:
                head = _head(Path(tmp) / "journal")
                start = time.perf_counter()
                write(df)
                seconds = time.perf_counter() - start
                if (got := _head(Path(tmp) / "journal") - head) != count:
                    raise BenchError(f"the journal took {got:,} records of a write of {count:,}")
                return {"rate": count / seconds, "seconds": seconds}

            stats = repeat(settings.runs, progress, f"df.write of {count:,} records", once, failures)
            df.unpersist()
    except SparkUnavailable as exc:
        raise BenchError(str(exc)) from None
    rate = Stat.of(stats.get("rate"), "records/s")
    load = ", ".join(f"{x:.2f}" for x in (*load_before, *os.getloadavg()))
    return Result(
        "sink",
        TITLE,
        method=__doc__.split("\n\n", 1)[1].strip(),
        tables=[
            Table(
                f"{count:,} records of {BODY} bytes, local[2], one gateway",
                ("write", "seconds", "records/s"),
                [("df.write.format('zeps').save()", Stat.of(stats.get("seconds"), "s", 2), rate)],
            )
        ],
        targets=[Target(f"sink >= {TARGET:,} records/s from local[2]", str(rate), rate.median >= TARGET)],
        notes=[*failures, f"load average (1, 5, 15 min) before and after: {load}"],
        runs=settings.runs,
        seconds=time.monotonic() - progress.start,
    )


def _head(journal: Path) -> int:
    try:
        return JournalReader(journal, STREAM).last_seq
    except NotAJournal:  # nothing journaled yet
        return 0
