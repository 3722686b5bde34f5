"""The reconciler's counters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ReconcilerStats:
    """Counters for metrics; read them, do not write them."""

    delivered_batches: int = 0
    records_from_live: int = 0  # coverage delivered from live (dense: records)
    ranges_from_replay: int = 0  # coverage delivered from replay (sparse when filtered)
    ranges_from_snapshot: int = 0  # coverage delivered from a snapshot (sparse: last values only)
    gaps_detected: int = 0
    gaps_filled: int = 0  # gaps closed by delivered data (not by Loss)
    duplicates_dropped: int = 0  # batches wholly covered already
    losses: int = 0
    records_lost: int = 0
    requests: int = 0
    retries: int = 0  # requests re-issued (timeout, short answer, replay lost)
    stalls: int = 0
    buffer_overflows: int = 0
    live_skipped: int = 0  # live batches not held while catching up (lag, or too big to hold)
    replay_dropped: int = 0  # stale replay batches (unknown request id) not at N
    stale_heartbeats: int = 0  # heartbeats of an older epoch than one seen (a deposed leader's), ignored
