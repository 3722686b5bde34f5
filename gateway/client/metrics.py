"""A subscriber's Prometheus metrics (`zeps_subscriber_*`; conventions in gateway.transport.metrics).

Read from the subscriber when scraped, from the HTTP server's thread: nothing on the hot path. Every value is
an int the subscriber's own thread writes, so a scrape sees each one whole (not all of them at one instant).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.registry import Collector

from gateway.reconcile import ReconcilerStats, State
from gateway.transport.metrics import Metrics

if TYPE_CHECKING:
    from gateway.client.subscriber import Subscriber


class SubscriberMetrics(Metrics):
    """A subscriber's counters, lag, head and state, for one stream."""

    def __init__(self, subscriber: Subscriber) -> None:
        super().__init__()
        self.registry.register(_SubscriberCollector(subscriber))
        self.registry.register(subscriber.send_errors.counter)  # zeps_subscriber_send_errors_total


# OpenPGM's counters of feeds read with gateway.transport.pgm (ReceiverStats); libzmq's engine exposes none.
_PGM_COUNTERS = (
    ("repairs", "PGM repairs received (RDATA delivered: losses PGM itself repaired), per stream and feed"),
    ("resets", "Times OpenPGM reported data lost for good (each starts a new session), per stream and feed"),
    ("lost", "Sequences OpenPGM lost for good (the reconciler fills them from replay), per stream and feed"),
    ("junk", "Packets on the group that are not libzmq's framing (a rogue or broken sender), per stream and feed"),
    ("overruns", "Messages dropped because the reader fell behind the receiver's queue, per stream and feed"),
)


class _SubscriberCollector(Collector):
    def __init__(self, subscriber: Subscriber) -> None:
        self.sub = subscriber

    def collect(self) -> Iterator[Metric]:
        sub, stream = self.sub, [self.sub.stream]
        merge = sub.reconciler  # None until the start position is known (a probe of the sidecar may come first)
        stats, rec = sub.stats, merge.stats if merge is not None else ReconcilerStats()
        delivered = CounterMetricFamily(
            "zeps_subscriber_delivered_records",
            "Records handed to the application, per stream and source (live, replay, snapshot)",
            labels=["stream", "source"],
        )
        for source, n in (("live", stats.from_live), ("replay", stats.from_replay), ("snapshot", stats.from_snapshot)):
            delivered.add_metric([sub.stream, source], n)
        yield delivered
        rejected = CounterMetricFamily(
            "zeps_subscriber_rejected_messages",
            "Multicast messages dropped, per stream and reason (malformed, unauthenticated: failed the stream key)",
            labels=["stream", "reason"],
        )
        rejected.add_metric([sub.stream, "malformed"], stats.rejected_packets - stats.unauthenticated)
        rejected.add_metric([sub.stream, "unauthenticated"], stats.unauthenticated)
        yield rejected
        for name, help_text, value in (
            ("gaps_detected", "Gaps seen in the live feed, per stream", rec.gaps_detected),
            ("gaps_filled", "Gaps repaired with records from replay, per stream", rec.gaps_filled),
            ("lost_records", "Records reported lost (DataLoss: no longer in the journal), per stream", stats.losses),
            (
                "duplicate_batches",
                "Batches dropped as already delivered (A/B feeds, replay overlap)",
                rec.duplicates_dropped,
            ),
            ("replay_requests", "Replay requests sent (catch-up and gap fills), per stream", rec.requests),
            ("replay_retries", "Replay requests sent again (timeout, short answer, lost connection)", rec.retries),
            (
                "replay_reconnects",
                "Replay connections re-established after a loss, per stream",
                stats.replay_reconnects,
            ),
        ):
            family = CounterMetricFamily(f"zeps_subscriber_{name}", help_text, labels=["stream"])
            family.add_metric(stream, value)
            yield family
        for name, help_text, value in (
            ("lag_records", "Records known to exist and not yet delivered, per stream", sub.lag),
            (
                "head_sequence",
                "The highest sequence known to exist, per stream (0: none known)",
                merge.head if merge else 0,
            ),
            (
                "buffered_bytes",
                "Bytes held out of order, waiting for a gap to fill, per stream",
                merge.buffered_bytes if merge else 0,
            ),
        ):
            gauge = GaugeMetricFamily(f"zeps_subscriber_{name}", help_text, labels=["stream"])
            gauge.add_metric(stream, value)
            yield gauge
        pgm = sub.pgm_counters()
        for name, help_text in _PGM_COUNTERS if pgm else ():
            family = CounterMetricFamily(f"zeps_subscriber_pgm_{name}", help_text, labels=["stream", "feed"])
            for feed, counts in pgm.items():
                family.add_metric([sub.stream, feed], counts[name])
            yield family
        state = StateSetMetricFamily("zeps_subscriber_state", "The reconciler's state, per stream", labels=["stream"])
        state.add_metric(stream, {s.name: s.name == sub.state for s in State})
        yield state
