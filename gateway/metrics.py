"""Prometheus metrics, one registry per server object so that several can live in one process (tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.registry import Collector

from gateway.reconcile import State

if TYPE_CHECKING:
    from gateway.subscriber import Subscriber


def parse_listen(addr: str) -> tuple[str, int]:
    """'HOST:PORT' or ':PORT' (all interfaces) -> (host, port), with an error that shows the form."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics address {addr!r}: expected HOST:PORT, e.g. 127.0.0.1:9108")
    return host or "0.0.0.0", int(port)


class Metrics:
    """Base: a private registry and an optional HTTP endpoint serving it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server = None

    def serve(self, addr: str) -> None:
        host, port = parse_listen(addr)
        self._server, _ = start_http_server(port, host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class GatewayMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.published = Counter("zeps_published_records", "Records accepted from publishers", registry=r)
        self.journaled = Counter("zeps_journaled_records", "Records written to the journal", registry=r)
        self.multicast = Counter("zeps_multicast_batches", "Batches queued for multicast, per endpoint", registry=r)
        self.heartbeats = Counter("zeps_heartbeats", "Heartbeats sent, per endpoint and stream", registry=r)
        self.rejected = Counter("zeps_rejected_input", "Input refused or dropped", ["kind"], registry=r)
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


class SubscriberMetrics(Metrics):
    """A subscriber's summary counters, lag and state, read from it when scraped: nothing on the hot path."""

    def __init__(self, subscriber: Subscriber) -> None:
        super().__init__()
        self.registry.register(_SubscriberCollector(subscriber))


class _SubscriberCollector(Collector):
    def __init__(self, subscriber: Subscriber) -> None:
        self.sub = subscriber

    def collect(self) -> Iterator[Metric]:
        labels = ["stream"]
        for name, value in self.sub.summary().items():
            family = CounterMetricFamily(f"zeps_subscriber_{name}", f"Subscriber summary: {name}", labels=labels)
            family.add_metric([self.sub.stream], value)
            yield family
        lag = GaugeMetricFamily(
            "zeps_subscriber_lag_records", "Records known to exist, not yet delivered", labels=labels
        )
        lag.add_metric([self.sub.stream], self.sub.lag)
        yield lag
        state = StateSetMetricFamily("zeps_subscriber_state", "The reconciler's state", labels=labels)
        state.add_metric([self.sub.stream], {s.name: s.name == self.sub.state for s in State})
        yield state
