"""Prometheus exposition shared by servers and clients: one registry per object, so several live in one process.

Conventions, the same in the gateway (`zeps_gateway_`), the replay sidecar (`zeps_replay_`) and the subscriber
(`zeps_subscriber_`): base units in the name (`_records`, `_bytes`, `_seconds`), `_total` on counters, a
`stream` label on every series that is about one stream, and every label value known at start exported at 0
from the start (a series that appears only after its first event breaks `rate()` and alerts on it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

_CREATED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


def parse_listen(addr: str) -> tuple[str, int]:
    """'HOST:PORT' or ':PORT' (all interfaces) -> (host, port), with an error that shows the form."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics address {addr!r}: expected HOST:PORT, e.g. 127.0.0.1:9108")
    return host or "0.0.0.0", int(port)


class Registry(CollectorRegistry):
    """A registry without the `_created` samples prometheus_client adds to counters and histograms: noise to
    operators (a timestamp per series). Per registry, unlike `disable_created_metrics()`, which is process-wide
    and would change the metrics of an application that embeds a subscriber."""

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            if metric.type in _CREATED_TYPES:
                created = metric.name + "_created"
                metric.samples = [s for s in metric.samples if s.name != created]
            yield metric


def precreate(metric: MetricWrapperBase, *label_sets: Iterable[str]) -> None:
    """Create the children for every combination given (one label value per tuple item), so they show at 0."""
    for values in label_sets:
        metric.labels(*values)


class Metrics:
    """Base: a private registry and an optional HTTP endpoint serving it."""

    def __init__(self) -> None:
        self.registry = Registry()
        self._server: WSGIServer | None = None

    def serve(self, addr: str) -> None:
        host, port = parse_listen(addr)
        self._server, _ = start_http_server(port, host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
