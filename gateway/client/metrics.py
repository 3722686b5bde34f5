"""A subscriber's Prometheus metrics, read from it when scraped: nothing on the hot path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.registry import Collector

from gateway.reconcile import State
from gateway.transport.metrics import Metrics

if TYPE_CHECKING:
    from gateway.client.subscriber import Subscriber


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
