"""The `zeps` PySpark data source: a journal as a table, the replay sidecar as a stream.

Batch, over journal directories (``spark.read.format("zeps").option("stream", S).load(JOURNAL_ROOT)``): one
input partition per segment, planned from the directory listing; sequence and time ranges are resolved
through the journal's index (JournalReader.seq_for_time) before any segment is read, and each partition's
cursor starts at its first sequence through the sparse index and stops at its last. The range ends at the
head as it was when the query was planned, so a read of a live journal is consistent.

Streaming, over the replay sidecar (``spark.readStream.format("zeps").option("replay", EP).option("stream", S)``):
the offset is ``{"seq": N}``, meaning every sequence <= N has been read. A micro-batch (start, end] is read by
FETCHes of sequence ranges, which return the same records however often they are retried: with a checkpoint,
a file sink gets every record exactly once across failures and restarts. maxRecordsPerBatch caps a micro-batch;
trigger(availableNow=True) reads up to the head as it was at query start, then stops.

Writing, into a gateway (``df.write.format("zeps").option("ingest", EP).option("stream", S)``, and writeStream):
gateway.spark.sink, exactly once across task retries and query restarts.

Readers are pickled to the Python workers, so they hold only options; files and sockets are opened in read().
Options are listed in docs/spark.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from gateway.client.replay_client import ReplayClient, ask_head, probe
from gateway.errors import JournalTrimmed, ReplayError
from gateway.journal import JournalReader
from gateway.journal.layout import list_segments
from gateway.spark import options as opt
from gateway.spark.arrow import record_batches, spark_schema
from gateway.spark.options import LAST
from gateway.spark.sink import stream_writer, writer
from gateway.wire import protocol as P
from gateway.wire.batch import Batch

log = logging.getLogger(__name__)

RECORDS_PER_PARTITION = 100_000  # streaming: a micro-batch's range is split into FETCHes of this many sequences


@dataclass(frozen=True)
class SeqRange(InputPartition):
    """Sequences lo..hi (inclusive): one Spark task."""

    lo: int
    hi: int


class ZepsDataSource(DataSource):
    """Records of one stream: `stream STRING, seq BIGINT, ts_ns BIGINT, key STRING, body BINARY` (ts_ns is the
    publish time), plus `journal_ts_ns BIGINT` (the batch's journal time) with option journalTime=true."""

    @classmethod
    def name(cls) -> str:
        return "zeps"

    def schema(self) -> str:
        return spark_schema(opt.flag(self.options, "journalTime"))

    def reader(self, schema: object) -> DataSourceReader:
        return JournalScan.from_options(self.options)

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return ReplayStream.from_options(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return stream_writer(self.options, schema)


# --- batch: the journal directories ----------------------------------------------------------------------


class JournalScan(DataSourceReader):
    """Reads sequences lo..hi (and journal times from_ns..to_ns) of a stream, one partition per segment."""

    def __init__(
        self,
        root: str,
        stream: str,
        *,
        lo: int = 1,
        hi: int = LAST,
        from_ns: int | None = None,
        to_ns: int | None = None,
        journal_time: bool = False,
    ) -> None:
        self.root = root
        self.stream = stream
        self.lo, self.hi = lo, hi
        self.from_ns, self.to_ns = from_ns, to_ns
        self.journal_time = journal_time

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> JournalScan:
        root = options.get("path") or options.get("journal")
        if not root:
            raise ValueError("zeps: give the journal root: spark.read.format('zeps').load(DIR) or option journal=DIR")
        return cls(
            root,
            opt.required(options, "stream", "the stream to read"),
            lo=opt.integer(options, "fromSeq", 1),
            hi=opt.integer(options, "toSeq", LAST),
            from_ns=opt.time_ns(options, "fromTime"),
            to_ns=opt.time_ns(options, "toTime"),
            journal_time=opt.flag(options, "journalTime"),
        )

    def bounds(self) -> tuple[int, int]:
        """The first and last sequence to read: the options resolved against the journal, times by its index."""
        reader = JournalReader(self.root, self.stream)
        lo, hi = max(self.lo, reader.first_seq), min(self.hi, reader.last_seq)
        if self.from_ns is not None:
            lo = max(lo, reader.seq_for_time(self.from_ns))
        if self.to_ns is not None:
            hi = min(hi, reader.seq_for_time(self.to_ns + 1) - 1)
        return lo, hi

    def partitions(self) -> list[SeqRange]:
        """The part of lo..hi in each segment. Segments are named by their first sequence, so this is a listing."""
        lo, hi = self.bounds()
        segments = list_segments(Path(self.root) / self.stream)
        nexts = [*segments[1:], LAST + 1]
        return [
            SeqRange(max(lo, s), min(hi, n - 1)) for s, n in zip(segments, nexts, strict=True) if s <= hi and n > lo
        ]

    def read(self, partition: InputPartition) -> Iterator:
        assert isinstance(partition, SeqRange)  # Spark hands back the partitions this reader made
        batches = journal_batches(JournalReader(self.root, self.stream), partition.lo, partition.hi)
        yield from record_batches(self.stream, batches, partition.lo, partition.hi, journal_time=self.journal_time)


def journal_batches(reader: JournalReader, lo: int, hi: int) -> Iterator[Batch]:
    """The journal batches holding lo..hi: a cursor placed by the index, stopped once past hi.

    Sequences the journal no longer holds (retention, segments removed by hand) are skipped with a warning, as
    `zeps history` does; `zeps analyze` lists them in its gap audit.
    """
    start = lo
    while True:
        try:
            with reader.cursor(start) as cursor:
                while cursor.next_seq <= hi and (batch := cursor.next_batch()) is not None:
                    yield batch
                return
        except JournalTrimmed as exc:
            log.warning("%s", exc)
            if exc.first_retained > hi:
                return
            start = exc.first_retained


# --- streaming: the replay sidecar -----------------------------------------------------------------------


class ReplayStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of sequence ranges, fetched from a replay sidecar. Offsets: {"seq": last sequence read}."""

    def __init__(
        self,
        endpoint: str,
        stream: str,
        *,
        starting: str = "earliest",
        max_records: int = 0,
        records_per_partition: int = RECORDS_PER_PARTITION,
        timeout: float = 10.0,
        journal_time: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.stream = stream
        self.starting = starting
        self.max_records = max_records
        self.records_per_partition = records_per_partition
        self.timeout = timeout
        self.journal_time = journal_time
        self.target: int | None = None  # availableNow: the head when the query started

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ReplayStream:
        starting = options.get("startingSeq", "earliest").lower()
        if starting not in ("earliest", "latest") and not starting.isdigit():
            raise ValueError(f"zeps: startingSeq {starting!r}: use 'earliest', 'latest' or a sequence number")
        return cls(
            opt.required(options, "replay", "the replay sidecar's endpoint, e.g. tcp://127.0.0.1:5571"),
            opt.required(options, "stream", "the stream to read"),
            starting=starting,
            max_records=opt.integer(options, "maxRecordsPerBatch", 0),
            records_per_partition=opt.integer(options, "recordsPerPartition", RECORDS_PER_PARTITION, minimum=1),
            timeout=opt.seconds(options, "timeout", 10.0),
            journal_time=opt.flag(options, "journalTime"),
        )

    def _client(self) -> ReplayClient:
        return ReplayClient(self.endpoint, self.stream, timeout=self.timeout)

    def _head(self) -> int:
        with self._client() as client:
            return ask_head(client)

    def initialOffset(self) -> dict:
        if self.starting.isdigit():
            return {"seq": max(0, int(self.starting) - 1)}
        with self._client() as client:
            if self.starting == "latest":
                return {"seq": ask_head(client)}
            # FETCH from 0 means "from the first retained"; its FETCH-END names that sequence.
            return {"seq": probe(client, 0)[0].first - 1}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._head()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = self.target if self.target is not None else self._head()
        if isinstance(limit, ReadMaxRows):
            end = min(end, start["seq"] + limit.max_rows)
        return {"seq": max(start["seq"], end)}

    def partitions(self, start: dict, end: dict) -> list[SeqRange]:
        step = self.records_per_partition
        return [SeqRange(lo, min(lo + step - 1, end["seq"])) for lo in range(start["seq"] + 1, end["seq"] + 1, step)]

    def read(self, partition: InputPartition) -> Iterator:
        assert isinstance(partition, SeqRange)  # Spark hands back the partitions this reader made
        batches = self.fetch(partition.lo, partition.hi)
        yield from record_batches(self.stream, batches, partition.lo, partition.hi, journal_time=self.journal_time)

    def fetch(self, lo: int, hi: int) -> Iterator[Batch]:
        """The batches of lo..hi, from one FETCH. Sequences the journal no longer holds are skipped, with a warning."""
        with self._client() as client:
            client.require(P.FEATURE_BATCH)
            rid = client.fetch(lo, hi)
            for event in client.events():
                if isinstance(event, Batch):
                    yield event
                elif isinstance(event, P.Trimmed):
                    log.warning(
                        "stream %r: sequences %d..%d are no longer in the journal; skipped",
                        self.stream,
                        event.requested,
                        event.first_retained - 1,
                    )
                elif isinstance(event, P.FetchEnd) and event.request_id == rid:
                    return
            raise ReplayError(f"FETCH {lo}..{hi}: replay server at {self.endpoint} sent nothing for {self.timeout} s")
