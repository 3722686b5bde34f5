"""Prometheus metrics, one registry per server object so that several can live in one process (tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


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
