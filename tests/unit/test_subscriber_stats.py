"""SubscriberStats stays bounded however long a subscriber runs under loss."""

from __future__ import annotations

from gateway.client.subscriber import STATES_KEPT, SubscriberStats


def test_state_changes_keep_only_the_latest() -> None:
    stats = SubscriberStats()
    for gap in range(10_000):  # a gap filled is two changes; a day at 1% loss is millions
        stats.states.append("RECOVERING")
        stats.states.append(f"MERGED {gap}")
    assert len(stats.states) == STATES_KEPT
    assert stats.states[-1] == "MERGED 9999"
