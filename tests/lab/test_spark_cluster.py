"""The `zeps` data source on a Spark standalone cluster: master, two workers and the driver on hosts of their own
in a namespace lab, the replay sidecar and a gateway on another. Executors are separate JVMs and Python workers
that unpickle the readers and writers and reach the sidecar and the gateway over the lab network, as on a real
cluster."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.servers import Stream, journal_records
from support.spark_cluster import INGEST_PORT, Cluster, batch_read, gateway_host, stream_read, stream_sink

from gateway.errors import NotAJournal
from gateway.journal import JournalReader
from netlab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

PER_BATCH = 100  # records per journal batch
RECORDS = PER_BATCH * 200


@pytest.fixture
def cluster(make_lab: Callable[..., Lab], tmp_path: Path) -> Iterator[tuple[Lab, Cluster, str]]:
    """The lab, the cluster, and the sidecar's endpoint (journal at tmp_path / "journal"); on host gw also a
    gateway journaling stream "derived" (journal at tmp_path / "gateway", ingest on INGEST_PORT)."""
    lab = make_lab(["gw", "master", "w1", "w2", "drv"])
    (tmp_path / "journal").mkdir()
    with gateway_host(lab, tmp_path) as (replay, _):
        spark = Cluster(lab, tmp_path / "spark")
        try:
            yield lab, spark, replay
        finally:
            spark.stop()


def test_batch_and_streaming_reads_on_the_cluster_survive_a_killed_executor_and_a_restart(
    cluster: tuple[Lab, Cluster, str], tmp_path: Path
) -> None:
    lab, spark, replay = cluster
    stream = Stream(tmp_path / "journal", "ticks")
    stream.write(RECORDS // PER_BATCH, PER_BATCH)
    driver_ip, work = lab.host("drv").ip, str(tmp_path / "driver")
    Path(work).mkdir()

    # Batch over the journal files: every record once, read by executors on both workers.
    batch = lab.run("drv", batch_read, spark.url, driver_ip, work, str(tmp_path / "journal"), "ticks", timeout=300)
    assert (batch["rows"], batch["distinct"], batch["first"], batch["last"]) == (RECORDS, RECORDS, 1, RECORDS)
    executors = batch["executors"]
    assert isinstance(executors, list) and {lab.host("w1").ip, lab.host("w2").ip} <= set(executors)

    # Streaming from the sidecar, with an executor killed -9 mid-query: Spark retries its tasks elsewhere and
    # the parquet sink holds every record exactly once.
    job = lab.start("drv", stream_read, spark.url, driver_ip, work, replay, "ticks", 2_000)
    killed = spark.kill_executor("w1")
    assert job.join(300), "the streaming query did not finish"
    first = job.result()
    assert killed and first == {
        "rows": RECORDS,
        "distinct": RECORDS,
        "first": 1,
        "last": RECORDS,
        "body_bytes": RECORDS * 100,
    }

    # More records, then the query restarted from its checkpoint (a new driver): it goes on where it stopped.
    stream.write(50, PER_BATCH)
    total = RECORDS + 50 * PER_BATCH
    again = lab.run("drv", stream_read, spark.url, driver_ip, work, replay, "ticks", 2_000, timeout=300)
    assert (again["rows"], again["distinct"], again["first"], again["last"]) == (total, total, 1, total)

    # Streaming write: the sidecar's stream published through the `zeps` sink into the gateway, with an executor
    # killed -9 once the gateway has journaled some of it. Spark runs the lost tasks again as the same producers:
    # the derived stream holds every record once, in order.
    ingest = f"tcp://{lab.host('gw').ip}:{INGEST_PORT}"
    sink = (spark.url, driver_ip, work, replay, "ticks", ingest, "derived", 2_000)
    job = lab.start("drv", stream_sink, *sink)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _journaled(tmp_path / "gateway", "derived") < 2_000:
        time.sleep(0.05)
    assert _journaled(tmp_path / "gateway", "derived") < total, "the sink finished before the kill"
    killed = spark.kill_executor("w1" if spark.executors("w1") else "w2")
    assert job.join(300), "the streaming sink query did not finish"
    first_sink = job.result()
    assert killed and first_sink["batches"] >= total // 2_000
    assert _derived(tmp_path) == _expected(stream)

    # The sink's query restarted from its checkpoint after the commit of its last micro-batch is deleted, as if
    # the driver died between the tasks' writes and the commit: the new driver runs that micro-batch again (same
    # query id, batch id and rows: the same producers, deduplicated by the gateway), then the new records.
    commits = Path(work) / "sink-checkpoint" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink()
    stream.write(10, PER_BATCH)
    stream.writer.close()
    again = lab.run("drv", stream_sink, *sink, timeout=300)
    assert again["rows"][0] == first_sink["rows"][-1] > 0  # the re-run micro-batch: rows the gateway already had
    assert sum(again["rows"]) == first_sink["rows"][-1] + 10 * PER_BATCH
    assert (commits / str(last)).exists() and (commits / str(last + 1)).exists()
    assert _derived(tmp_path) == _expected(stream)


def _derived(root: Path) -> list[tuple[str, bytes]]:
    return [(key, body) for _, key, body in journal_records(root / "gateway", "derived")]


def _expected(stream: Stream) -> list[tuple[str, bytes]]:
    return [(r.key, bytes(r.body)) for r in stream.records]


def _journaled(root: Path, stream: str) -> int:
    try:
        return JournalReader(root, stream).last_seq
    except NotAJournal:
        return 0


def test_cluster_processes_are_ours_and_stop(cluster: tuple[Lab, Cluster, str]) -> None:
    """The fixture's JVMs run in their lab hosts and end when stopped (nothing is left behind)."""
    _, spark, _ = cluster
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(p.poll() is not None for p in spark.procs.values()):
        time.sleep(0.2)
    assert all(p.poll() is None for p in spark.procs.values()), "a master or worker JVM exited early"
    spark.stop()
    assert all(p.poll() is not None for p in spark.procs.values())
