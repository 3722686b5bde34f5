"""The `zeps` sink: a DataFrame published as a stream, exactly once across task retries and query restarts.

Batch: ``df.write.format("zeps").option("ingest", EP).option("stream", S).mode("append").save()``; streaming:
``df.writeStream.format("zeps")...start()``. Each row (a string `key`, a binary `body`, optionally a TTL) is one
record. Every task publishes its partition with its own `Publisher(confirm=True)` and returns only once the
gateway has confirmed every record as journaled; a task that cannot (gateway down past `timeout`) fails, and
Spark retries it.

Exactly once. A task publishes as producer `producer_id(write, partition, epoch)`, numbering its records from 0:

    write     batch: the option writeId, else a random id drawn once per save() on the driver (in the pickled
              writer, so every attempt of a task sees the same); streaming: the query id (kept in the checkpoint)
    epoch     batch: 0; streaming: the micro-batch id
    partition the task's partition

A retried task (or a micro-batch re-run after a restart from the checkpoint) is the same producer and numbers
the same rows the same way, so the gateway's per-producer dedup (gateway.sequencer.producers) drops the records
an earlier attempt journaled and confirms them: each row is journaled once. The condition: a retry produces the
same rows in the same order (a deterministic input: a file or `zeps` source, no rand(), no nondeterministic
shuffle order feeding the sink). Otherwise the retry's first k records are dropped where an earlier attempt
journaled k, and the rest are journaled: no row twice by number, but the rows may be a mix of both attempts.
The gateway remembers a producer for its --producer-expiry-s (1 h) and up to --max-producers per stream; a
retry later than that publishes again. Rows a failed job published stay in the stream: a stream has no rollback.

Bad rows (null key or body, a key over 255 bytes in UTF-8, key and body over `maxMessageBytes`) fail the task,
naming the row's position in its partition and the fix; with badRecords=skip they are left out, counted in the
commit message, and the first few named. Options are listed in docs/spark.md.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, DataType, NumericType, StringType, StructType

from gateway.client.publisher import Publisher
from gateway.errors import BadRecord
from gateway.spark import options as opt
from gateway.transport.curve import client_keys
from gateway.wire.streamkey import StreamKey

log = logging.getLogger(__name__)

BATCH_ID = "streaming.sql.batchId"  # Spark's local properties of a micro-batch's tasks
QUERY_ID = "sql.streaming.queryId"
NAMED_SKIPS = 10  # skipped rows named in a commit message


@dataclass(frozen=True)
class SinkConfig:
    """What every task needs, from the options, checked against the DataFrame's schema on the driver."""

    stream: str
    ingest: str | None = None
    interface: str | None = None
    stream_key: str | None = None  # file: discovery takes only announcements signed with it
    key: str = "key"
    body: str = "body"
    body_format: str = "binary"  # or "json": the `columns` as a JSON object
    columns: tuple[str, ...] = ()
    ttl: str | None = None
    curve_key: str | None = None
    curve_server: str | None = None
    batch_records: int = 1024
    batch_bytes: int = 60_000
    linger_ms: int = 5
    max_message_bytes: int = 1024 * 1024
    timeout: float = 30.0
    skip_bad: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: StructType) -> SinkConfig:
        ingest, interface = options.get("ingest"), options.get("interface")
        if bool(ingest) == bool(interface):
            raise ValueError(
                "zeps: give option ingest (the gateway's endpoint, e.g. tcp://10.0.0.1:5570) or option interface "
                "(find the stream's ingest by its announcements heard there), not both"
            )
        key, body, ttl = options.get("keyColumn", "key"), options.get("bodyColumn", "body"), options.get("ttlColumn")
        body_format = opt.choice(options, "bodyFormat", "binary", ("binary", "json"))
        names = schema.fieldNames()
        if body_format == "json":
            listed = options.get("bodyColumns")
            columns = tuple(c.strip() for c in listed.split(",")) if listed else ()
            columns = columns or tuple(n for n in names if n not in (key, ttl))
        else:
            columns = (body,)
        types = {f.name: f.dataType for f in schema.fields}
        _check_column(types, "keyColumn", key, (StringType,), "a string")
        for column in columns:
            if body_format == "binary":
                _check_column(types, "bodyColumn", column, (BinaryType, StringType), "binary (or string: UTF-8)")
            elif column not in types:
                raise ValueError(f"zeps: bodyColumns names {column!r}, which the DataFrame lacks: it has {names}")
        if ttl is not None:
            _check_column(types, "ttlColumn", ttl, (NumericType,), "a number of seconds")
        skip = opt.choice(options, "badRecords", "fail", ("fail", "skip")) == "skip"
        if bool(options.get("curveKey")) != bool(options.get("curveServer")):
            raise ValueError("zeps: options curveKey FILE and curveServer FILE go together: give both, or neither")
        return cls(
            stream=opt.required(options, "stream", "the stream to publish to"),
            ingest=ingest,
            interface=interface,
            stream_key=options.get("streamKey"),
            key=key,
            body=body,
            body_format=body_format,
            columns=columns,
            ttl=ttl,
            curve_key=options.get("curveKey"),
            curve_server=options.get("curveServer"),
            batch_records=opt.integer(options, "batchRecords", 1024, minimum=1),
            batch_bytes=opt.integer(options, "batchBytes", 60_000, minimum=1),
            linger_ms=opt.integer(options, "lingerMs", 5),
            max_message_bytes=opt.integer(options, "maxMessageBytes", 1024 * 1024, minimum=1),
            timeout=opt.seconds(options, "timeout", 30.0),
            skip_bad=skip,
        )

    def publisher(self, producer_id: int) -> Publisher:
        return Publisher(
            self.ingest,
            self.stream,
            confirm=True,
            producer=(producer_id, 0),
            batch_records=self.batch_records,
            batch_bytes=self.batch_bytes,
            linger_ms=self.linger_ms,
            timeout=self.timeout,
            max_message_bytes=self.max_message_bytes,
            curve=client_keys(self.curve_key, self.curve_server),
            interface=self.interface,
            stream_key=[StreamKey.load(self.stream_key)] if self.stream_key else (),
        )


def _check_column(types: Mapping[str, DataType], option: str, name: str, kinds: tuple[type, ...], what: str) -> None:
    if name not in types:
        raise ValueError(
            f"zeps: the DataFrame has no column {name!r} (option {option}): it has {list(types)}; "
            f"rename a column or set {option}"
        )
    if not isinstance(types[name], kinds):
        raise ValueError(f"zeps: column {name!r} is {types[name].simpleString()}, the sink needs {what}: cast it")


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What one task published: rows in, records confirmed (journaled now or by an earlier attempt), rows
    skipped (badRecords=skip; the first NAMED_SKIPS named), and the stream sequence of the last confirmation."""

    partition: int
    attempt: int
    producer_id: int
    rows: int
    confirmed: int
    last_seq: int | None
    skipped: int = 0
    skips: tuple[str, ...] = field(default=())


def producer_id(write: str, partition: int, epoch: int) -> int:
    """A stable 64-bit producer id for one task's output: the same for every attempt of that task."""
    digest = hashlib.blake2b(f"zeps-sink/{write}/{partition}/{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def publish_partition(config: SinkConfig, producer: int, batches: Iterable[pa.RecordBatch]) -> SinkCommit:
    """Publish one task's rows as producer `producer`, and wait until the gateway has confirmed all of them."""
    ctx = TaskContext.get()
    partition, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (0, 0)
    rows = skipped = 0
    skips: list[str] = []
    with config.publisher(producer) as pub:
        publish = pub.publish
        for batch in batches:
            keys, bodies, ttls = _columns(config, batch)
            for i, (key, body, ttl) in enumerate(zip(keys, bodies, ttls, strict=False)):
                try:
                    publish(key, body, ttl)
                except BadRecord as exc:
                    where = f"row {rows + i} of partition {partition}"
                    why = "its key is null" if key is None else "its body is null" if body is None else str(exc)
                    if not config.skip_bad:
                        raise BadRecord(
                            f"zeps sink, stream {config.stream!r}: {where} cannot be published: {why}; fix the row "
                            "(filter or repair it), or set option badRecords=skip"
                        ) from None
                    skipped += 1
                    if len(skips) < NAMED_SKIPS:
                        skips.append(f"{where}: {why}")
            rows += batch.num_rows
        last_seq = pub.flush()
        confirmed = pub.confirmed
    return SinkCommit(partition, attempt, producer, rows, confirmed, last_seq, skipped, tuple(skips))


def _columns(config: SinkConfig, batch: pa.RecordBatch) -> tuple[list, list, Iterable]:
    """The batch's keys, bodies (bytes) and TTLs as Python lists: one conversion per column, not per value."""
    keys = batch.column(config.key).to_pylist()
    if config.body_format == "json":
        table = batch.select(list(config.columns)).to_pylist()
        bodies: list = [json.dumps(row, separators=(",", ":"), default=_json_value).encode() for row in table]
    else:
        column = batch.column(config.body)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = column.cast(pa.binary())
        bodies = column.to_pylist()
    ttls: Iterable = batch.column(config.ttl).to_pylist() if config.ttl else repeat(None)
    return keys, bodies, ttls


def _json_value(value: object) -> object:
    """JSON for what Spark's types hold beyond JSON's own: times as ISO-8601, decimals as text, bytes as base64."""
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"zeps: a {type(value).__name__} cannot go in a JSON body: cast the column to a string")


def summary(messages: Sequence[WriterCommitMessage | None]) -> str:
    done = [m for m in messages if isinstance(m, SinkCommit)]
    rows, confirmed, skipped = (sum(getattr(m, f) for m in done) for f in ("rows", "confirmed", "skipped"))
    last = max((m.last_seq for m in done if m.last_seq is not None), default=None)
    text = f"{len(done)}/{len(messages)} tasks, {rows} rows, {confirmed} records confirmed, last sequence {last}"
    if skipped:
        named = "; ".join(s for m in done for s in m.skips[:NAMED_SKIPS])
        text += f", {skipped} bad rows skipped ({named})"
    return text


class ZepsWriter(DataSourceArrowWriter):
    """df.write: one producer per partition of this save(), `write` drawn once on the driver (or writeId)."""

    def __init__(self, config: SinkConfig, write: str | None = None) -> None:
        self.config = config
        self.write_id = write or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = TaskContext.get()
        assert ctx is not None  # write() runs in a Spark task
        return publish_partition(self.config, producer_id(self.write_id, ctx.partitionId(), 0), iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("zeps sink to stream %r (write %s): %s", self.config.stream, self.write_id, summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "zeps sink to stream %r (write %s) failed: %s. What the tasks published stays in the stream; run the "
            "job again with option writeId=%s to publish only what is missing",
            self.config.stream,
            self.write_id,
            summary(messages),
            self.write_id,
        )


class ZepsStreamWriter(DataSourceStreamArrowWriter):
    """df.writeStream: one producer per partition of each micro-batch, named by the query id and batch id."""

    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = TaskContext.get()
        assert ctx is not None  # write() runs in a Spark task
        query, batch = ctx.getLocalProperty(QUERY_ID), ctx.getLocalProperty(BATCH_ID)
        if query is None or batch is None:
            raise RuntimeError(f"zeps sink: the task has no {QUERY_ID} or {BATCH_ID}: is this a streaming query?")
        return publish_partition(self.config, producer_id(query, ctx.partitionId(), int(batch)), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("zeps sink to stream %r, batch %d: %s", self.config.stream, batchId, summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "zeps sink to stream %r, batch %d failed: %s. Spark runs the batch again (from the checkpoint, after a "
            "restart): records already journaled are not journaled twice",
            self.config.stream,
            batchId,
            summary(messages),
        )


def writer(options: Mapping[str, str], schema: StructType, overwrite: bool) -> ZepsWriter:
    if overwrite:
        raise ValueError("zeps: a stream is append-only: use mode('append')")
    return ZepsWriter(SinkConfig.from_options(options, schema), options.get("writeId"))


def stream_writer(options: Mapping[str, str], schema: StructType) -> ZepsStreamWriter:
    return ZepsStreamWriter(SinkConfig.from_options(options, schema))
