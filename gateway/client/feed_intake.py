"""`FeedIntake`: a Subscriber's multicast feeds, read into reconciler events.

One receiver per feed ("A", "B", ...; `open_feeds`), subscribed to the whole stream so every sequence is
seen. What arrives is checked (with a stream key, multicast that does not check out with it never reaches the
reconciler: it is dropped and counted as `unauthenticated`), parsed, and handed on (`emit`) as `Live` (a
batch) or `HeadSeen` (a heartbeat); the sidecar a heartbeat names goes to `on_sidecar`, with the heartbeat's epoch (a
group's leader names its own: gateway.client.leader_sidecar).

Threading. The feeds are read by the application's thread during each poll turn (`read`), and with `drain`
(the default) by a second thread (`FeedDrain`) whenever the application has been away for 20 ms, into a
queue bounded by `buffer_limit_bytes` that the next turn takes first (`take_queued`): libzmq 4.3.4 aborts the
process when a PGM SUB's pipe fills (src/pgm_receiver.cpp:131). Whoever holds the drain's lock (`holding`)
reads the feeds. Without a drain the feeds are read only during the application's calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gateway import reconcile as R
from gateway.client.feed_drain import FeedDrain, read_burst
from gateway.client.subscriber_stats import SubscriberStats
from gateway.errors import McastError, Unauthenticated
from gateway.mcast import Endpoint, Tuning, open_sub
from gateway.transport.pgm import PgmReceiver
from gateway.wire.heartbeat import Heartbeat, parse_payload
from gateway.wire.streamkey import StreamKey, Verifier

log = logging.getLogger("gateway.client.subscriber")

FEED_BURST = 256  # queued multicast messages taken in per turn


def open_feeds(ctx: Any, stream: str, multicast: Sequence[str], tuning: Tuning | None) -> dict[Any, str]:
    """A receiver per multicast endpoint, named "A", "B", ... in the order given."""
    return {open_sub(ctx, Endpoint.parse(text), tuning or Tuning(), [stream]): chr(ord("A") + i)
            for i, text in enumerate(multicast)}  # fmt: skip


class FeedIntake:
    """The multicast side of one Subscriber; see the module docstring."""

    def __init__(
        self,
        stream: str,
        feeds: dict[Any, str],
        *,
        keys: Sequence[StreamKey],
        drain: bool,
        buffer_limit_bytes: int,
        stats: SubscriberStats,
        emit: Callable[[R.Event], None],
        on_sidecar: Callable[[str, int], None],
    ) -> None:
        self._stream_name = stream.encode()
        # With a key (two while one is rotated), only multicast that checks out with it is let in.
        self._verifier = Verifier(stream, keys)
        self._stats = stats
        self._emit = emit
        self._on_sidecar = on_sidecar
        self.feeds = feeds  # receiver -> feed name
        self.drain = FeedDrain(feeds, buffer_limit_bytes, f"zeps-feeds-{stream}") if drain and feeds else None

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """The feeds are the caller's while this lasts (the drain's thread keeps off them)."""
        if self.drain is None:
            yield
            return
        self.drain.acquire()
        try:
            yield
        finally:
            self.drain.release()

    def take_queued(self) -> bool | None:
        """Hand on what the drain's thread queued (up to a burst): None when nothing was queued; else True when
        nothing older than what the feeds hold waits there any more (the feeds may then be read directly)."""
        if self.drain is None or not self.drain.queue:
            return None
        for feed, frames in self.drain.take(FEED_BURST):
            self._on_message(feed, frames)
        return not self.drain.queue

    def read(self, ready: dict[Any, int]) -> None:
        """Read the feeds `ready` names, up to a burst each."""
        for sock, feed in self.feeds.items():
            if sock in ready:
                for frames in read_burst(sock):
                    self._on_message(feed, frames)

    def pgm_counters(self) -> dict[str, dict[str, int]]:
        """OpenPGM's own counters per feed read through gateway.transport.pgm (see Subscriber.pgm_counters)."""
        return {
            feed: dataclasses.asdict(receiver.stats)
            for receiver, feed in self.feeds.items()
            if isinstance(receiver, PgmReceiver)
        }

    def close(self) -> None:
        if self.drain is not None:
            self.drain.close()
        else:
            for sock in self.feeds:
                sock.close(linger=0)

    def _on_message(self, feed: str, frames: list[bytes] | McastError) -> None:
        """One multicast message: a batch or a heartbeat of this stream, or something to drop and count."""
        if isinstance(frames, McastError):  # the receiver's refusal (udp://)
            self._reject(feed, frames)
            return
        if frames[0] != self._stream_name:
            return  # another stream sharing the group and prefix
        try:
            item = parse_payload(self._verifier.open(frames))
        except McastError as exc:
            self._reject(feed, exc)
            return
        if isinstance(item, Heartbeat):
            if item.replay:
                self._on_sidecar(item.replay, item.epoch)
            self._emit(R.HeadSeen(item.head, feed, item.epoch))
        else:
            self._emit(R.Live(item, feed))

    def _reject(self, feed: str, exc: McastError) -> None:
        self._stats.rejected_packets += 1
        if isinstance(exc, Unauthenticated):
            self._stats.unauthenticated += 1
        log.debug("feed %s: dropped a packet: %s", feed, exc)
