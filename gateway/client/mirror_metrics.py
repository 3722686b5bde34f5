"""A site mirror's Prometheus metrics (`zeps_mirror_*`; conventions in gateway.transport.metrics).

Read from the mirror's `status` when scraped, from the HTTP server's thread: nothing on the mirror's path.
The `zeps_mirror_path_*` series have a `path` label as well (1..N, as the mirror's log lines number its paths to
the source: gateway.client.mirror_paths rule 10), so an operator sees which path is slow or was replaced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.client.mirror import Mirror
from gateway.client.mirror_paths import PathTally
from gateway.transport.metrics import Metrics


class MirrorMetrics(Metrics):
    """One mirror's progress and lag, for its stream."""

    def __init__(self, mirror: Mirror) -> None:
        super().__init__()
        self.registry.register(_MirrorCollector(mirror))


class _MirrorCollector(Collector):
    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.started = time.monotonic()  # a path's idle time counts from here until its first batch

    def collect(self) -> Iterator[Metric]:
        st, stream = self.mirror.status, [self.mirror.config.stream]
        for name, help_text, value in (
            ("mirrored_records", "Records the mirror site confirmed journaled, per stream", st.mirrored_records),
            ("mirrored_batches", "Batches the mirror site confirmed journaled, per stream", st.mirrored_batches),
            ("resumes", "Rounds started again after a failure (each resumes from the mirror site's head)", st.resumes),
            (
                "tail_records",
                "Records forwarded from the datagram tail (--datagram-tail): its copy came first",
                st.tail_records,
            ),
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
        yield from self._paths()

    def _paths(self) -> Iterator[Metric]:
        stream, now = self.mirror.config.stream, time.monotonic()
        tallies = list(enumerate(self.mirror.status.paths, 1))
        counters: tuple[tuple[str, str, Callable[[PathTally], int]], ...] = (
            (
                "path_records",
                "Records taken from each path to the source (its catch-up ranges, its live-tail first arrivals); "
                "their sum is what the mirror forwarded, per stream and path",
                lambda t: t.records,
            ),
            (
                "path_first_arrivals",
                "Live-tail records whose first copy came on this path (the copy that won), per stream and path",
                lambda t: t.first_arrivals,
            ),
            ("path_bytes", "Bytes received on each path, duplicates included, per stream and path", lambda t: t.bytes),
            (
                "path_reconnects",
                "Times each path was replaced (it failed or stalled) and opened again, per stream and path",
                lambda t: t.reopens,
            ),
        )
        for name, help_text, count in counters:
            counter = CounterMetricFamily(f"zeps_mirror_{name}", help_text, labels=["stream", "path"])
            for i, t in tallies:
                counter.add_metric([stream, str(i)], count(t))
            yield counter
        up = GaugeMetricFamily(
            "zeps_mirror_path_up",
            "1 while the path's session with the source is open, per stream and path",
            labels=["stream", "path"],
        )
        idle = GaugeMetricFamily(
            "zeps_mirror_path_idle_seconds",
            "Seconds since the path last sent a batch (before its first: since the mirror started), per stream and "
            "path",
            labels=["stream", "path"],
        )
        for i, t in tallies:
            up.add_metric([stream, str(i)], float(t.up))
            idle.add_metric([stream, str(i)], max(0.0, now - (t.arrived_at or self.started)))
        yield up
        yield idle
