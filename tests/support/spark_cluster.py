"""A Spark standalone cluster in a namespace lab: a master and workers on hosts of their own, a driver on another.

Every JVM is a process we start (pyspark's wheel ships `spark-class`), inside a lab host, so executors on the
workers reach the replay sidecar and the driver over the lab network, as on a real cluster. The driver jobs
below run in a Python process of their own on the driver host (`Lab.start`), and return plain dicts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import DataFrame, SparkSession

from netlab import Lab

SPARK_CLASS = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
MASTER_PORT = 7077
REPLAY_PORT = 5571
INGEST_PORT = 5570


@contextmanager
def gateway_host(lab: Lab, root: Path, host: str = "gw", sink: str = "derived") -> Iterator[tuple[str, str]]:
    """On `host`: `zeps replay` over the journal at root / "journal" (which must exist), and a `zeps gateway`
    journaling stream `sink` at root / "gateway"; yields their endpoints (replay, ingest). Logs in
    root / "gw.log"; both stopped on exit."""
    ip = lab.host(host).ip
    replay, ingest = f"tcp://{ip}:{REPLAY_PORT}", f"tcp://{ip}:{INGEST_PORT}"
    cli = [sys.executable, "-m", "gateway.cli"]
    with open(root / "gw.log", "wb") as log:
        procs = [
            lab.popen(host, [*cli, "replay", "--journal", str(root / "journal"), "--bind", replay],
                      stdout=log, stderr=subprocess.STDOUT),
            lab.popen(host, [*cli, "gateway", "--journal", str(root / "gateway"), "--ingest", ingest,
                             "--stream", sink], stdout=log, stderr=subprocess.STDOUT),
        ]  # fmt: skip
        try:
            yield replay, ingest
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)


def spark_env(host_ip: str, work: Path) -> dict[str, str]:
    """What every JVM and Python worker of the cluster needs: this interpreter, its address, small heaps."""
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": host_ip,
        "SPARK_LOCAL_DIRS": str(work / "local"),
        "SPARK_WORKER_DIR": str(work / "worker"),
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_NO_DAEMONIZE": "1",
    }


class Cluster:
    """Master on `master`, one worker per host in `workers` (1 core, 1 GiB each); stopped by `stop()`."""

    def __init__(self, lab: Lab, work: Path, master: str = "master", workers: tuple[str, ...] = ("w1", "w2")):
        self.lab, self.work = lab, work
        self.master_ip = lab.host(master).ip
        self.url = f"spark://{self.master_ip}:{MASTER_PORT}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._start(master, "org.apache.spark.deploy.master.Master", "--host", self.master_ip,
                    "--port", str(MASTER_PORT), "--webui-port", "8080")  # fmt: skip
        for name in workers:
            ip = lab.host(name).ip
            self._start(name, "org.apache.spark.deploy.worker.Worker", self.url, "--host", ip,
                        "--cores", "1", "--memory", "1g", "--webui-port", "8081")  # fmt: skip

    def _start(self, host: str, cls: str, *args: str) -> None:
        work = self.work / host
        work.mkdir(parents=True, exist_ok=True)
        log = open(work / "jvm.log", "wb")  # noqa: SIM115 (the child keeps it)
        argv = [SPARK_CLASS, cls, *args]
        env = spark_env(self.lab.host(host).ip, work)
        self.procs[host] = self.lab.popen(host, argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def executors(self, worker: str) -> list[int]:
        """Pids of the executor JVMs the worker on `worker` runs (its children)."""
        pid = self.procs[worker].pid
        done = subprocess.run(["pgrep", "-P", str(pid), "-f", "CoarseGrainedExecutorBackend"], capture_output=True)
        return [int(p) for p in done.stdout.split()]

    def kill_executor(self, worker: str, timeout_s: float = 60.0) -> int:
        """Waits for an executor on `worker`, kills it -9, returns its pid."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.executors(worker)
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                return pids[0]
            time.sleep(0.1)
        raise AssertionError(f"no executor appeared on {worker} within {timeout_s} s")

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _session(master: str, driver_ip: str, work: str) -> SparkSession:
    os.environ.update(spark_env(driver_ip, Path(work)))
    from gateway.spark import get_session

    return get_session(
        "zeps-cluster-test",
        master=master,
        conf={
            "spark.driver.host": driver_ip,
            "spark.driver.bindAddress": driver_ip,
            "spark.ui.enabled": "false",
            "spark.executor.cores": "1",
            "spark.executor.memory": "512m",
            "spark.cores.max": "2",
            "spark.sql.shuffle.partitions": "2",
            "spark.task.maxFailures": "4",
        },
    )


def _summary(df: DataFrame) -> dict[str, int]:
    from pyspark.sql import functions as F

    row = df.agg(
        F.count("*").alias("rows"),
        F.countDistinct("seq").alias("distinct"),
        F.min("seq").alias("first"),
        F.max("seq").alias("last"),
        F.sum(F.length("body")).alias("body_bytes"),
    ).collect()[0]
    return {k: int(row[k] or 0) for k in ("rows", "distinct", "first", "last", "body_bytes")}


def batch_read(master: str, driver_ip: str, work: str, journal: str, stream: str) -> dict[str, object]:
    """The journal read as a batch on the cluster: a summary, and the executors that took part."""
    spark = _session(master, driver_ip, work)
    try:
        df = spark.read.format("zeps").option("stream", stream).load(journal)
        out = dict(_summary(df))
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
        out["executors"] = sorted(k.split(":")[0] for k in status.keySet().mkString(",").split(","))
        return out
    finally:
        spark.stop()


def stream_read(master: str, driver_ip: str, work: str, replay: str, stream: str, per_batch: int) -> dict[str, int]:
    """One availableNow query from the sidecar into parquet on a checkpoint under `work` (a second call is the
    job restarted: it goes on from the checkpoint), then a summary of everything the sink holds."""
    spark = _session(master, driver_ip, work)
    out_dir, checkpoint = Path(work) / "out", Path(work) / "checkpoint"
    try:
        source = (
            spark.readStream.format("zeps")
            .option("replay", replay)
            .option("stream", stream)
            .option("maxRecordsPerBatch", str(per_batch))
        )
        query = (
            source.load()
            .writeStream.format("parquet")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(str(out_dir))
        )
        query.awaitTermination(300)
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        return _summary(spark.read.parquet(str(out_dir)))
    finally:
        spark.stop()


def stream_sink(
    master: str, driver_ip: str, work: str, replay: str, stream: str, ingest: str, sink: str, per_batch: int
) -> dict[str, Any]:
    """One availableNow query from the sidecar's `stream` into the gateway's `sink` through the `zeps` sink,
    on a checkpoint under `work`; the micro-batches it ran, and the rows of each."""
    spark = _session(master, driver_ip, work)
    try:
        query = (
            spark.readStream.format("zeps")
            .option("replay", replay)
            .option("stream", stream)
            .option("maxRecordsPerBatch", str(per_batch))
            .load()
            .select("key", "body")
            .writeStream.format("zeps")
            .option("ingest", ingest)
            .option("stream", sink)
            .option("checkpointLocation", str(Path(work) / "sink-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        rows = [int(p.numInputRows) for p in query.recentProgress]
        return {"batches": len(rows), "rows": rows}
    finally:
        spark.stop()


def rates(
    master: str,
    driver_ip: str,
    work: str,
    replay: str,
    stream: str,
    ingest: str,
    sink: str,
    runs: int,
    per_partition: int = 100_000,
) -> dict[str, list[float]]:
    """Seconds per run, in one driver session: a streaming read of all of `stream` from the sidecar into Parquet,
    and the same read through the `zeps` sink into the gateway's `sink`; availableNow, 100,000 records a
    micro-batch read as tasks of `per_partition` records, a new checkpoint (so a new query and new producers)
    every run. Timed from start() to the query's end: the session start is not timed."""
    spark = _session(master, driver_ip, work)
    out: dict[str, list[float]] = {"read": [], "write": []}
    try:
        for run in range(runs):
            for what in ("read", "write"):
                df = (
                    spark.readStream.format("zeps")
                    .option("replay", replay)
                    .option("stream", stream)
                    .option("maxRecordsPerBatch", "100000")
                    .option("recordsPerPartition", str(per_partition))
                    .load()
                )
                checkpoint = str(Path(work) / f"rates-{what}-{run}")
                if what == "read":
                    writer = df.writeStream.format("parquet").option("path", str(Path(work) / f"rates-out-{run}"))
                else:
                    writer = df.select("key", "body").writeStream.format("zeps")
                    writer = writer.option("ingest", ingest).option("stream", sink)
                started = time.monotonic()
                query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
                query.awaitTermination(600)
                out[what].append(time.monotonic() - started)
                if query.exception() is not None:
                    raise RuntimeError(f"the {what} query failed: {query.exception()}")
        return out
    finally:
        spark.stop()
