"""The `zeps` sink on a real local Spark (local[2], a failed task tried up to 4 times) into a real gateway process:
batch and streaming writes, exactly once across a retried task and a re-run micro-batch, bad rows, and the
one-second bars of docs/spark.md read back by a Subscriber."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType, StructField, StructType
from support.servers import GatewayProcess, journal_records, start_sidecar

from gateway.client.publisher import Publisher
from gateway.client.subscriber import Subscriber
from gateway.journal import JournalReader
from gateway.spark.sink import SinkCommit, summary

STREAMS = ("batch", "retry", "source", "derived", "bad", "skipped", "ticks", "bars")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(tmp_path_factory.mktemp("sink") / "journal", streams=STREAMS)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def root(gateway: GatewayProcess) -> Path:
    return Path(gateway.argv[gateway.argv.index("--journal") + 1])


def numbered(spark, n: int, parts: int = 2):
    """Rows key k<i%5>, body b"<i>" for i in 0..n-1; spark.range gives each partition a contiguous run."""
    return spark.range(n, numPartitions=parts).select(
        F.format_string("k%d", F.col("id") % 5).alias("key"), F.col("id").cast("string").cast("binary").alias("body")
    )


def sink(df, gateway: GatewayProcess, stream: str, **options: object):
    writer = df.write.format("zeps").option("ingest", gateway.ingest).option("stream", stream).mode("append")
    for name, value in options.items():
        writer = writer.option(name, str(value))
    return writer


def bodies(root: Path, stream: str) -> list[int]:
    return [int(body) for _, _, body in journal_records(root, stream)]


def assert_once_in_order(got: list[int], runs: list[range]) -> None:
    """Each number once, and each run (one task's rows) in its order: the journal interleaves tasks only."""
    assert sorted(got) == sorted(i for run in runs for i in run)
    for run in runs:
        assert [i for i in got if i in run] == list(run)


def test_batch_write_publishes_every_row_once_in_order(spark, gateway: GatewayProcess, root: Path) -> None:
    sink(numbered(spark, 20_000), gateway, "batch").save()
    got = bodies(root, "batch")
    assert_once_in_order(got, [range(0, 10_000), range(10_000, 20_000)])
    keys = {key for _, key, _ in journal_records(root, "batch")}
    assert keys == {f"k{i}" for i in range(5)}


def test_a_retried_task_is_deduplicated_by_its_producer_id(spark, gateway: GatewayProcess, root: Path) -> None:
    """Partition 1 fails once at its row 3,000, after the gateway has journaled at least 1,000 of its rows; Spark
    runs the task again, which re-sends from its first row as the same producer: the gateway drops what the
    first attempt journaled, and the stream holds each row once."""
    n, fail_at, marker = 10_000, 8_000, root.parent / "retry.marker"
    journal, first_of_p1 = str(root), n // 2

    def journaled_from_p1() -> int:  # runs in the Spark task (pickled by value: no module-level helpers)
        try:
            with JournalReader(journal, "retry").cursor(1) as cursor:
                n = 0
                while (batch := cursor.next_batch()) is not None:
                    n += sum(int(r.body) >= first_of_p1 for r in batch.records())
                return n
        except Exception:  # nothing journaled yet
            return 0

    def body(i: int) -> bytes:
        if i == fail_at and not os.path.exists(marker):
            deadline, seen = time.monotonic() + 30, 0
            while time.monotonic() < deadline and (seen := journaled_from_p1()) < 1_000:
                time.sleep(0.05)
            Path(marker).write_text(str(seen))
            raise RuntimeError("injected failure, first attempt only")
        return str(i).ljust(100).encode()  # 100 bytes: Python workers flush their output every 64 KiB

    flaky = F.udf(body, BinaryType())
    df = spark.range(n, numPartitions=2).select(
        F.format_string("k%d", F.col("id") % 5).alias("key"), flaky("id").alias("body")
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")  # the sink sees rows as they come
    try:
        sink(df, gateway, "retry", lingerMs=1).save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    journaled_before_failure = int(marker.read_text())
    assert journaled_before_failure >= 1_000  # so the retry did re-send records the gateway had
    assert_once_in_order(bodies(root, "retry"), [range(0, first_of_p1), range(first_of_p1, n)])


def test_stream_write_exactly_once_across_a_re_run_micro_batch(
    spark, gateway: GatewayProcess, root: Path, tmp_path: Path
) -> None:
    """`zeps` source (the sidecar) -> `zeps` sink, availableNow, 500 records a micro-batch. After the first run
    the commit of its last micro-batch is deleted, as if the driver died between the tasks' writes and the
    commit: the restarted query runs that micro-batch again (same batch id, same rows), then the new records.
    The derived stream holds every source record exactly once, in order."""
    with Publisher(gateway.ingest, "source", confirm=True) as pub:
        for i in range(3_000):
            pub.publish(f"k{i % 3}", b"%d" % i)
    checkpoint = tmp_path / "chk"
    with start_sidecar(root) as side:

        def run() -> None:
            query = (
                spark.readStream.format("zeps")
                .option("replay", side.endpoint)
                .option("stream", "source")
                .option("maxRecordsPerBatch", "500")
                .load()
                .select("key", "body")
                .writeStream.format("zeps")
                .option("ingest", gateway.ingest)
                .option("stream", "derived")
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            assert query.awaitTermination(180), "the query did not finish within 180 s"
            assert query.exception() is None

        run()
        assert bodies(root, "derived") == list(range(3_000))
        commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
        assert commits[-1].name == "5"
        for name in ("5", ".5.crc"):  # batch 5 (records 2,500..2,999) written but not committed
            (checkpoint / "commits" / name).unlink()
        with Publisher(gateway.ingest, "source", confirm=True) as pub:
            for i in range(3_000, 4_000):
                pub.publish(f"k{i % 3}", b"%d" % i)
        run()
    assert bodies(root, "derived") == list(range(4_000))
    assert (checkpoint / "commits" / "5").exists() and (checkpoint / "commits" / "7").exists()


BAD = StructType([StructField("key", StringType()), StructField("body", BinaryType())])
ROWS = [("a", b"0"), ("b", b"1"), (None, b"2"), ("c", b"3"), ("k" * 300, b"4"), ("d", None), ("e", b"x" * 2_000)]


def test_a_bad_row_fails_the_job_naming_its_position_and_the_fix(spark, gateway: GatewayProcess, root: Path) -> None:
    df = spark.createDataFrame(ROWS, BAD).coalesce(1)
    with pytest.raises(Exception, match=r"row 2 of partition 0 cannot be published: its key is null.*badRecords=skip"):
        sink(df, gateway, "bad").save()
    assert bodies(root, "bad") in ([], [0, 1])  # what came before the bad row may have left


def test_bad_rows_skipped_are_left_out_and_counted(spark, gateway: GatewayProcess, root: Path) -> None:
    df = spark.createDataFrame(ROWS, BAD).coalesce(1)
    sink(df, gateway, "skipped", badRecords="skip", maxMessageBytes=1_000).save()
    assert journal_records(root, "skipped") == [
        (s, k, b) for s, (k, b) in enumerate([("a", b"0"), ("b", b"1"), ("c", b"3")], start=1)
    ]


def test_the_commit_summary_names_what_was_confirmed_and_skipped() -> None:
    messages = [
        SinkCommit(0, 0, 1, rows=10, confirmed=9, last_seq=40, skipped=1, skips=("row 3 of partition 0: key null",)),
        SinkCommit(1, 1, 2, rows=5, confirmed=5, last_seq=42),
        None,
    ]
    assert summary(messages) == (
        "2/3 tasks, 15 rows, 14 records confirmed, last sequence 42, "
        "1 bad rows skipped (row 3 of partition 0: key null)"
    )


def test_options_are_checked_on_the_driver_with_the_fix(spark, gateway: GatewayProcess) -> None:
    df = numbered(spark, 10)
    with pytest.raises(Exception, match=r"no column 'payload' .*set bodyColumn"):
        sink(df, gateway, "batch", bodyColumn="payload").save()
    with pytest.raises(Exception, match="append-only: use mode"):
        sink(df, gateway, "batch").mode("overwrite").save()
    with pytest.raises(Exception, match="give option ingest"):
        df.write.format("zeps").option("stream", "batch").mode("append").save()


# --- the worked example of docs/spark.md: one-second bars per key ---------------------------------------------


def bars_job(spark, journal: str, ingest: str) -> None:
    """Ticks (JSON bodies {"px": .., "qty": ..}) from the journal, one bar per key and second, published as the
    stream "bars" with a JSON body."""
    tick = "struct<px: double, qty: bigint>"
    ticks = (
        spark.read.format("zeps")
        .option("stream", "ticks")
        .load(journal)
        .select(
            "key",
            "seq",
            (F.col("ts_ns") / 1_000_000_000).cast("bigint").alias("second"),
            F.from_json(F.col("body").cast("string"), tick).alias("t"),
        )
    )
    bars = ticks.groupBy("key", "second").agg(
        F.min_by("t.px", "seq").alias("open"),
        F.max("t.px").alias("high"),
        F.min("t.px").alias("low"),
        F.max_by("t.px", "seq").alias("close"),
        F.sum("t.qty").alias("volume"),
        F.count("*").alias("trades"),
    )
    (
        bars.orderBy("second", "key")
        .write.format("zeps")
        .option("ingest", ingest)
        .option("stream", "bars")
        .option("bodyFormat", "json")
        .option("bodyColumns", "second,open,high,low,close,volume,trades")
        .mode("append")
        .save()
    )


def test_one_second_bars_published_as_a_derived_stream(spark, gateway: GatewayProcess, root: Path) -> None:
    with Publisher(gateway.ingest, "ticks", confirm=True) as pub:
        for i in range(3_000):  # about 2 s of ticks
            pub.publish(f"s{i % 3}", json.dumps({"px": 100 + (i * 7919 % 101) / 10, "qty": i % 9 + 1}).encode())
            if i % 10 == 0:
                time.sleep(0.007)
    expected: dict[tuple[str, int], dict] = {}
    for rec in _records(str(root), "ticks"):
        t = json.loads(rec.body)
        bar = expected.setdefault(
            (rec.key, rec.ts_ns // 1_000_000_000),
            {"open": t["px"], "high": t["px"], "low": t["px"], "volume": 0, "trades": 0},
        )
        bar.update(high=max(bar["high"], t["px"]), low=min(bar["low"], t["px"]), close=t["px"])
        bar["volume"] += t["qty"]
        bar["trades"] += 1
    assert len(expected) >= 6  # three keys over at least two seconds

    bars_job(spark, str(root), gateway.ingest)

    got = {}
    with start_sidecar(root) as side, Subscriber("bars", replay=side.endpoint, start="earliest") as sub:
        while len(got) < len(expected) and (rec := sub.next(timeout=10.0)) is not None:
            bar = json.loads(rec.body)
            got[(rec.key, bar.pop("second"))] = bar
    assert got == expected


def _records(journal: str, stream: str) -> list:
    with JournalReader(journal, stream).cursor(1) as cursor:
        out: list = []
        while (batch := cursor.next_batch()) is not None:
            out.extend(batch.records())
        return out
