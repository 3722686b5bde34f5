"""The gateway's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from gateway.transport.metrics import Metrics


class GatewayMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.published = Counter("zeps_published_records", "Records accepted from publishers", registry=r)
        self.journaled = Counter("zeps_journaled_records", "Records written to the journal", registry=r)
        self.multicast = Counter("zeps_multicast_batches", "Batches queued for multicast, per endpoint", registry=r)
        self.heartbeats = Counter("zeps_heartbeats", "Heartbeats sent, per endpoint and stream", registry=r)
        self.rejected = Counter("zeps_rejected_input", "Input refused or dropped", ["kind"], registry=r)
        self.duplicates = Counter("zeps_duplicate_records", "Re-sent records dropped (journaled already)", registry=r)
        self.producers = Gauge("zeps_producers", "Producers with a known highest number", ["stream"], registry=r)
        self.replies_dropped = Counter(
            "zeps_replies_dropped", "Replies that could not go: client gone or not reading", ["reason"], registry=r
        )
        self.journal_full = Gauge(
            "zeps_journal_full",
            "1 while a stream's journal is out of disk space (publishes refused)",
            ["stream"],
            registry=r,
        )
        self.batch_records = Histogram(
            "zeps_batch_records", "Records per journaled batch", buckets=(1, 4, 16, 64, 256, 1024, 4096), registry=r
        )
        self.fsync_seconds = Histogram(
            "zeps_journal_fsync_seconds",
            "Journal fsync latency",
            buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5),
            registry=r,
        )
