"""The Subscriber's parts alone: the replay link's state table (and its copy in docs/client.md), and the feed
intake, with an inproc socket standing in for a multicast feed (as tests/unit/test_feed_drain.py does)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import zmq

from gateway import reconcile as R
from gateway.client import link_state as L
from gateway.client.feed_intake import FeedIntake
from gateway.client.subscriber_stats import SubscriberStats
from gateway.wire import batch as B
from gateway.wire.heartbeat import Heartbeat
from gateway.wire.streamkey import StreamKey

CTX = zmq.Context.instance()
DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def test_the_link_state_table() -> None:
    path = [L.CONNECTING]
    for given in (L.ANSWERED, L.LOST, L.LOST, L.RETRY, L.ANSWERED, L.REFUSED, L.RETRY, L.ANSWERED):
        path.append(L.step(path[-1], given))
    assert [s.value for s in path] == [
        "connecting", "ready", "retrying", "retrying", "connecting", "ready", "failed", "failed", "failed",
    ]  # fmt: skip
    assert L.step(L.READY, L.RETRY) is L.READY  # not listed: stays
    assert set(L.TRANSITIONS) == set(L.LinkState) and not L.TRANSITIONS[L.FAILED].go  # FAILED is final


def test_the_docs_hold_the_link_state_table() -> None:
    assert L.describe_transitions() in DOC.read_text(), "docs/client.md is stale: paste describe_transitions()"


def intake_of(
    pull: Any, keys: list[StreamKey]
) -> tuple[FeedIntake, list[R.Event], list[tuple[str, int]], SubscriberStats]:
    events: list[R.Event] = []
    sidecars: list[tuple[str, int]] = []
    stats = SubscriberStats()
    intake = FeedIntake("s", {pull: "A"}, keys=keys, drain=False, buffer_limit_bytes=1 << 20, stats=stats,
                        emit=events.append, on_sidecar=lambda *named: sidecars.append(named))  # fmt: skip
    return intake, events, sidecars, stats


def read_all(intake: FeedIntake, pull: Any, n: int) -> None:
    deadline = time.monotonic() + 5
    while pull.poll(100) and time.monotonic() < deadline:
        intake.read({pull: zmq.POLLIN})


def test_the_intake_hands_on_batches_and_heartbeats_and_counts_what_it_drops(feed) -> None:
    push, pull = feed
    intake, events, sidecars, stats = intake_of(pull, [])
    batch = B.encode(7, [(0, b"k", b"v")])
    push.send_multipart([b"s", batch])
    push.send_multipart([b"s", Heartbeat(9, 0, "tcp://10.0.0.1:5571", 1, epoch=2).encode()])
    push.send_multipart([b"other", batch])  # another stream on the same group: not ours, not counted
    push.send_multipart([b"s", b"junk"])
    read_all(intake, pull, 4)
    assert [type(e).__name__ for e in events] == ["Live", "HeadSeen"]
    assert events[1] == R.HeadSeen(9, "A", 2) and sidecars == [("tcp://10.0.0.1:5571", 2)]
    assert stats.rejected_packets == 1 and stats.unauthenticated == 0


def test_with_a_stream_key_only_signed_messages_get_in(feed) -> None:
    push, pull = feed
    key = StreamKey.generate()
    intake, events, _, stats = intake_of(pull, [key])
    batch = B.encode(1, [(0, b"k", b"v")])
    push.send_multipart(list(key.frames(b"s", batch)))
    push.send_multipart([b"s", batch])  # unsigned: a rogue sender
    push.send_multipart(list(StreamKey.generate().frames(b"s", batch)))  # another key
    read_all(intake, pull, 3)
    assert len(events) == 1 and stats.rejected_packets == 2 and stats.unauthenticated == 2
