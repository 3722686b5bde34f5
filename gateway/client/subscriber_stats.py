"""`SubscriberStats`: what a Subscriber counts, shared by its parts (the façade, the replay link, the feed intake)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gateway import reconcile as R

STATES_KEPT = 64  # state changes kept in SubscriberStats.states


@dataclass
class SubscriberStats:
    from_live: int = 0
    from_replay: int = 0
    from_snapshot: int = 0
    losses: int = 0
    rejected_packets: int = 0  # multicast messages dropped: malformed, or failing the stream key check
    unauthenticated: int = 0  # of those, the ones that failed the stream key check
    replay_reconnects: int = 0
    replay_retries: int = 0  # transient replay failures, each followed by a backoff
    feed_dropped: int = 0  # multicast messages the drain thread dropped while its queue was full
    fill_datagrams: int = 0  # datagram answers to gap fills used (DatagramFills)
    fills_escalated: int = 0  # gap fills whose datagrams went unanswered, handed to FETCH
    # the last STATES_KEPT state changes: under sustained loss every gap is two (RECOVERING, MERGED), so a
    # list of them all would grow for as long as the subscriber runs
    states: deque[str] = field(default_factory=lambda: deque(maxlen=STATES_KEPT))

    @property
    def delivered(self) -> int:
        return self.from_live + self.from_replay + self.from_snapshot

    def summary(self, reconciler: R.Reconciler | None) -> dict[str, int]:
        s = reconciler.stats if reconciler is not None else R.ReconcilerStats()
        return {
            "delivered": self.delivered,
            "from_live": self.from_live,
            "from_replay": self.from_replay,
            "from_snapshot": self.from_snapshot,
            "gaps_detected": s.gaps_detected,
            "gaps_filled": s.gaps_filled,
            "duplicates_dropped": s.duplicates_dropped,
            "losses": self.losses,
            "rejected_packets": self.rejected_packets,
            "unauthenticated": self.unauthenticated,
            "replay_retries": self.replay_retries,
            "feed_dropped": self.feed_dropped,
            "fill_datagrams": self.fill_datagrams,
            "fills_escalated": self.fills_escalated,
        }
