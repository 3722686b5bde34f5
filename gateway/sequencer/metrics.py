"""The gateway's Prometheus metrics (`zeps_gateway_*`; conventions in gateway.transport.metrics).

Every stream, multicast endpoint and rejection kind is exported at 0 from the start. The series the loop moves
per batch (records published and journaled, bytes, multicast messages, records per batch) are `Tally`s and a
`SizeTally`: plain integers the loop's thread adds to, read when scraped (`LoopSeries`), with no lock and no call
into prometheus_client per batch. A child's inc() takes a lock and costs about as much as handling a record, a
Histogram's observe() two, and with many small publishers (issue #32) a batch is one record; posting them once per
pass of the loop still cost as much for a lone-record batch, whose pass is its own (docs/benchmarks.md). What is
state rather than an event (a stream's head and producers, a multicast queue's depth) is read when scraped too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from gateway.transport.metrics import Metrics, precreate
from gateway.transport.send_errors import SendErrors

# Messages refused at the ingest, by kind: auth (a connection refused by CURVE, or by TLS on a group's peer link),
# no-signature (not ZEPS),
# invalid (a malformed or misplaced command, answered with INVALID), clients (ATTACH over --max-clients),
# pub-frame (a plain PUB message that is not key + body), oversize (a plain PUB body over the limit),
# not-leader (a publish to a follower node of a group), uncommitted (to a leader below --min-insync whose
# uncommitted batches are at their limit),
# forged-ack (a REPLICA-ACK on the peer link whose mac the leader's ack key did not make: not from the group),
# out-of-order (a producer's batch after a gap: an earlier batch of it was refused and comes again first),
# mirror (a publisher to a mirror stream, or a mirror batch not contiguous, fenced or to a stream not a mirror).
REJECTED_KINDS = (
    "auth",
    "no-signature",
    "invalid",
    "clients",
    "pub-frame",
    "oversize",
    "not-leader",
    "uncommitted",
    "forged-ack",
    "out-of-order",
    "mirror",
)
# Records accepted and then refused because the journal did not take them: journal-full (out of disk space),
# journal (another write error).
REFUSED_REASONS = ("journal-full", "journal")
# Replies that could not go: gone (the client disconnected), unread (it leaves its replies unread).
DROPPED_REASONS = ("gone", "unread")
# Where a follower node's copies came from: push (the leader's peer link, once level with it), sidecar (the
# leader's replay sidecar, while behind).
COPY_SOURCES = ("push", "sidecar")
# What the gateway sends that the network may refuse (gateway.transport.send_errors): multicast batches and
# heartbeats, discovery announcements, the peer link of a group, etcd requests.
SEND_OPS = ("multicast", "heartbeat", "announce", "peer-link", "etcd")


class Tally:
    """A counter's child that the loop's thread adds to with a plain integer addition, read when scraped. Only the
    loop writes it; a scrape's thread reads one int (whole, under the GIL)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def add(self, n: int) -> None:
        self.n += n


class SizeTally:
    """A histogram's child of small integers (records per batch), counted per value by the loop's thread and put
    into buckets when scraped. Only the loop writes it; a scrape copies the counts in one C call."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def observe(self, value: int) -> None:
        counts = self.counts
        counts[value] = counts.get(value, 0) + 1


class LoopSeries:
    """The collector of the Tallies and SizeTallies (a registry calls `describe` and `collect`): each family's
    children by label values, created at 0 with their labels."""

    def __init__(self) -> None:
        self._counters: dict[str, tuple[str, list[str], dict[tuple[str, ...], Tally]]] = {}
        self._sizes: dict[str, tuple[str, list[str], tuple[int, ...], dict[tuple[str, ...], SizeTally]]] = {}

    def counter(self, name: str, documentation: str, labelnames: list[str]) -> str:
        """A counter family `name` (exported as NAME_total); its children come from `tally`."""
        self._counters[name] = (documentation, labelnames, {})
        return name

    def histogram(self, name: str, documentation: str, labelnames: list[str], buckets: tuple[int, ...]) -> str:
        """A histogram family `name` of integers, with these upper bounds (and +Inf); children from `sizes`."""
        self._sizes[name] = (documentation, labelnames, buckets, {})
        return name

    def tally(self, name: str, *labels: str) -> Tally:
        return self._counters[name][2].setdefault(labels, Tally())

    def sizes(self, name: str, *labels: str) -> SizeTally:
        return self._sizes[name][3].setdefault(labels, SizeTally())

    def describe(self) -> Iterator[Metric]:
        for name, (doc, labelnames, _) in self._counters.items():
            yield CounterMetricFamily(name, doc, labels=labelnames)
        for name, (doc, labelnames, _, _) in self._sizes.items():
            yield HistogramMetricFamily(name, doc, labels=labelnames)

    def collect(self) -> Iterator[Metric]:
        for name, (doc, labelnames, children) in self._counters.items():
            family = CounterMetricFamily(name, doc, labels=labelnames)
            for labels, tally in list(children.items()):
                family.add_metric(labels, tally.n)
            yield family
        for name, (doc, labelnames, bounds, kids) in self._sizes.items():
            histogram = HistogramMetricFamily(name, doc, labels=labelnames)
            for labels, sizes in list(kids.items()):
                counts = list(sizes.counts.items())
                buckets = [(floatToGoString(b), sum(k for v, k in counts if v <= b)) for b in bounds]
                buckets.append(("+Inf", sum(k for _, k in counts)))
                histogram.add_metric(labels, buckets, sum(v * k for v, k in counts))
            yield histogram


class HasHead(Protocol):
    @property
    def last_seq(self) -> int: ...


class HasProducers(Protocol):
    @property
    def producers(self) -> Sized: ...


class StreamSeries:
    """One stream's children, looked up once: `labels()` takes a lock and a dict lookup on every call."""

    def __init__(self, m: GatewayMetrics, stream: str) -> None:
        self.published = m.loop.tally(m.published, stream)
        self.journaled = m.loop.tally(m.journaled, stream)
        self.journaled_bytes = m.loop.tally(m.journaled_bytes, stream)
        self.batch_records = m.loop.sizes(m.batch_records, stream)
        self.fsync_seconds = m.fsync_seconds.labels(stream)
        self.journal_full = m.journal_full.labels(stream)
        self.publishers = m.publishers.labels(stream)
        self.refused = {reason: m.refused.labels(stream, reason) for reason in REFUSED_REASONS}
        self.head = m.head.labels(stream)
        self.duplicates = m.duplicates.labels(stream)
        self.producers = m.producers.labels(stream)
        self.copied = {source: m.copied.labels(stream, source) for source in COPY_SOURCES}


class OutputSeries:
    """One multicast endpoint's children, per stream."""

    def __init__(self, m: GatewayMetrics, endpoint: str, streams: list[str]) -> None:
        self.messages = {s: m.loop.tally(m.multicast_messages, endpoint, s) for s in streams}
        self.bytes = {s: m.loop.tally(m.multicast_bytes, endpoint, s) for s in streams}
        self.heartbeats = {s: m.heartbeats.labels(endpoint, s) for s in streams}
        self.queued = m.multicast_queue.labels(endpoint)  # the owner reads its queue depth into it
        self.endpoint = endpoint
        self.send_errors = m.send_errors  # the sends to this endpoint that the network refuses


class GatewayMetrics(Metrics):
    def __init__(self, streams: list[str]) -> None:
        super().__init__()
        r = self.registry
        s, es = ["stream"], ["endpoint", "stream"]
        self.loop = LoopSeries()  # the loop's per-batch series: plain integers, read when scraped
        r.register(self.loop)
        self.published = self.loop.counter(
            "zeps_gateway_published_records", "Records accepted from publishers, per stream", s
        )
        self.journaled = self.loop.counter(
            "zeps_gateway_journaled_records", "Records written to the journal, per stream", s
        )
        self.duplicates = Counter(
            "zeps_gateway_duplicate_records",
            "Records a producer re-sent that the journal held already: dropped and confirmed, per stream",
            s,
            registry=r,
        )
        self.producers = Gauge(
            "zeps_gateway_producers", "Producers whose highest record number is kept, per stream", s, registry=r
        )
        self.journaled_bytes = self.loop.counter(
            "zeps_gateway_journaled_bytes", "Bytes of record batches written to the journal, per stream", s
        )
        self.head = Gauge(
            "zeps_gateway_head_sequence", "The last sequence journaled, per stream (0: none yet)", s, registry=r
        )
        self.publishers = Gauge(
            "zeps_gateway_publishers",
            "ZEPS publisher sessions attached, per stream (plain PUB ones are not seen)",
            s,
            registry=r,
        )
        self.batch_records = self.loop.histogram(
            "zeps_gateway_batch_records", "Records per journaled batch, per stream", s, (1, 4, 16, 64, 256, 1024, 4096)
        )
        self.fsync_seconds = Histogram(
            "zeps_gateway_fsync_seconds",
            "Journal fsync latency, per stream",
            s,
            buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5),
            registry=r,
        )
        self.copied = Counter(
            "zeps_gateway_copied_batches",
            "Batches a follower node copied from its leader, per stream and source (push, sidecar)",
            ["stream", "source"],
            registry=r,
        )
        self.journal_full = Gauge(
            "zeps_gateway_journal_full",
            "1 while a stream's journal is out of disk space (publishes refused)",
            s,
            registry=r,
        )
        self.refused = Counter(
            "zeps_gateway_refused_records",
            "Records accepted but refused by the journal, per stream and reason (journal-full, journal)",
            ["stream", "reason"],
            registry=r,
        )
        self.multicast_messages = self.loop.counter(
            "zeps_gateway_multicast_messages",
            "Batch messages queued for multicast, per endpoint and stream (a datagram transport may cut a batch)",
            es,
        )
        self.multicast_bytes = self.loop.counter(
            "zeps_gateway_multicast_bytes", "Bytes of record batches queued for multicast, per endpoint and stream", es
        )
        self.multicast_head = Gauge(
            "zeps_gateway_multicast_head_sequence", "The last sequence sent, per endpoint and stream", es, registry=r
        )
        self.multicast_queue = Gauge(
            "zeps_gateway_multicast_queue_messages",
            "Messages waiting for the transport, per endpoint",
            ["endpoint"],
            registry=r,
        )
        self.heartbeats = Counter("zeps_gateway_heartbeats", "Heartbeats sent, per endpoint and stream", es, registry=r)
        self.rejected = Counter(
            "zeps_gateway_rejected_messages",
            "Messages refused at the ingest, by kind (auth: connections refused by CURVE)",
            ["kind"],
            registry=r,
        )
        self.replies_dropped = Counter(
            "zeps_gateway_replies_dropped",
            "Replies that could not go, by reason: client gone, or not reading",
            ["reason"],
            registry=r,
        )
        self.send_errors = SendErrors("gateway", SEND_OPS, r)
        precreate(self.rejected, *((k,) for k in REJECTED_KINDS))
        precreate(self.replies_dropped, *((k,) for k in DROPPED_REASONS))
        self.streams = {name: StreamSeries(self, name) for name in streams}
        self.outputs: dict[str, OutputSeries] = {}

    def follow_head(self, stream: str, writer: HasHead) -> None:
        """Read the stream's head from its journal writer when scraped."""
        self.streams[stream].head.set_function(lambda: writer.last_seq)

    def follow_producers(self, stream: str, lane: HasProducers) -> None:
        """Read the stream's producer count from its lane when scraped (its table may be replaced after a cut)."""
        self.streams[stream].producers.set_function(lambda: len(lane.producers))

    def add_output(self, endpoint: str, sent_head: Mapping[str, int]) -> OutputSeries:
        """A multicast endpoint: its series at 0, and its per-stream sent head read from `sent_head` when scraped."""
        streams = [s for s in self.streams if s in sent_head]  # the streams this output carries
        series = self.outputs[endpoint] = OutputSeries(self, endpoint, streams)
        for stream in streams:
            self.multicast_head.labels(endpoint, stream).set_function(_reader(sent_head, stream))
        return series


def _reader(values: Mapping[str, int], key: str) -> Callable[[], int]:
    return lambda: values[key]
