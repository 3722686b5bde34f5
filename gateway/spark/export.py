"""`zeps export`: a stream's records from the journal into Parquet, through Spark (one task per segment)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gateway.spark.progress import Progress


@dataclass(frozen=True, slots=True)
class Exported:
    path: str
    records: int
    first_seq: int | None
    last_seq: int | None
    seconds: float

    def describe(self, stream: str) -> str:
        if not self.records:
            return f"exported no records of stream {stream} (the range holds none) to {self.path}"
        rate = self.records / self.seconds if self.seconds > 0 else float("inf")
        return (
            f"exported {self.records:,} records of stream {stream} (sequences {self.first_seq:,}..{self.last_seq:,}) "
            f"to {self.path} in {self.seconds:.1f} s ({rate:,.0f} records/s)"
        )


def read_journal(spark: SparkSession, journal: str, stream: str, options: Mapping[str, str] | None = None) -> DataFrame:
    """The zeps batch source over a journal root; `options` as in docs/spark.md (fromSeq, toTime, ...)."""
    return spark.read.format("zeps").option("stream", stream).options(**(options or {})).load(journal)


def export(
    spark: SparkSession,
    journal: str,
    stream: str,
    path: str,
    *,
    options: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> Exported:
    """Write the records of `stream` (the range in `options`) as Parquet at `path`, showing progress."""
    start = time.monotonic()
    df = read_journal(spark, journal, stream, options)
    with Progress(spark, f"export {stream}"):
        df.write.mode("overwrite" if overwrite else "errorifexists").parquet(path)
    seconds = time.monotonic() - start
    row = spark.read.parquet(path).agg(F.count("*").alias("n"), F.min("seq").alias("lo"), F.max("seq").alias("hi"))
    first = row.first()
    assert first is not None  # an aggregate has exactly one row
    n, lo, hi = first
    return Exported(path, n, lo, hi, seconds)
