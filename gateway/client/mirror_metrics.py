"""A site mirror's Prometheus metrics (`zeps_mirror_*`; conventions in gateway.transport.metrics).

Read from the mirror's `status` when scraped, from the HTTP server's thread: nothing on the mirror's path.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.client.mirror import Mirror
from gateway.transport.metrics import Metrics


class MirrorMetrics(Metrics):
    """One mirror's progress and lag, for its stream."""

    def __init__(self, mirror: Mirror) -> None:
        super().__init__()
        self.registry.register(_MirrorCollector(mirror))


class _MirrorCollector(Collector):
    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror

    def collect(self) -> Iterator[Metric]:
        st, stream = self.mirror.status, [self.mirror.config.stream]
        for name, help_text, value in (
            ("mirrored_records", "Records the mirror site confirmed journaled, per stream", st.mirrored_records),
            ("mirrored_batches", "Batches the mirror site confirmed journaled, per stream", st.mirrored_batches),
            ("resumes", "Rounds started again after a failure (each resumes from the mirror site's head)", st.resumes),
        ):
            counter = CounterMetricFamily(f"zeps_mirror_{name}", help_text, labels=["stream"])
            counter.add_metric(stream, value)
            yield counter
        gauges: tuple[tuple[str, str, float], ...] = (
            ("head_sequence", "The mirror site's head as confirmed, per stream", st.head),
            ("source_head_sequence", "The source site's head as last seen, per stream", st.source_head),
            ("lag_records", "Records the source holds that the mirror site does not yet, per stream", st.lag_records),
            (
                "lag_seconds",
                "Age of the oldest source record not yet at the mirror site (0 when level), per stream",
                st.lag_seconds,
            ),
        )
        for name, help_text, level in gauges:
            gauge = GaugeMetricFamily(f"zeps_mirror_{name}", help_text, labels=["stream"])
            gauge.add_metric(stream, level)
            yield gauge
