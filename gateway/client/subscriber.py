"""`Subscriber`: the dual-connection client. Multicast and replay in, one gap-free ordered stream out.

This is the IO half of `gateway.reconcile`: it owns the sockets and the clock, turns what arrives into
reconciler events, and carries out the actions the reconciler returns. All decisions are the
reconciler's; nothing here decides what the application sees.

Sockets, all driven by the caller's thread (and the feeds by a drain thread while it is away; "Threading"):
- one SUB per multicast feed ("A", "B", ...), subscribed to the whole stream so every sequence is seen;
- replay, in two ZEPS connections so that every answer can be attributed to its request: the *catch-up*
  connection carries the one open-ended request (SUBSCRIBE: history, then the live tail; cancelling it is
  closing it) and the *fill* connection carries bounded gap fills (FETCH), which the sidecar answers in
  order, each closed by FETCH-END. Small fills go by datagram first when the sidecar has a fill port
  (`DatagramFills`: on by default for udp:// feeds, at the replay endpoint's port; `fill_udp`), and over
  FETCH only when their datagrams go unanswered: a lost TCP segment costs >= 200 ms, a lost datagram one
  short timer.

The replay endpoint may be given, or several (sidecars on one journal, or on the nodes of a replicated
gateway), or learnt from the multicast heartbeats (each sidecar they name is added to the list). Replay uses
one at a time and moves on to the next (`gateway.client.endpoints`) whenever a connection to it is lost,
cannot be made, is refused or times out; the reconciler then asks the new one for what it still needs, so
the application sees only a pause. Records the application asked not to see (topic prefixes) are filtered
here; the reconciler still sees every sequence.

With a stream key, multicast that does not check out with it (a rogue sender, junk) never reaches the
reconciler: it is dropped and counted (`unauthenticated`). Replay connections use CURVE when given keys.

Loss the journal can no longer repair is never skipped in silence: iteration raises `DataLoss` naming the
range, and iterating again continues after it.

start="snapshot" begins with the last record of every key (docs/snapshots.md); `view` is then the
application's key -> value map, kept current as records are handed out (or by `update()`).

Never blocking. Nothing here waits on the network: the constructor only opens sockets, and every replay
handshake, request and reconnect is a phase of a connection (`ReplayClient`) that the poll loop advances
with its own deadline. So `next(timeout)` and `next_batch(timeout)` return by their deadline whatever the
network does. A start that needs an answer first (a time; "latest" without multicast, which means the
journal's head when subscribing) is a probe run by the same loop; until it ends, `state` is "STARTING".

Failures. A final one (`ReplayRefused`: unknown stream, protocol version, refused or missing CURVE keys,
a corrupt journal at the server, a missing extension; with several sidecars, once every one has refused
since the last success) is raised from `next()`/`next_batch()` once what came before it has been handed
out, and again at every later call. Anything else (no answer, refused TCP, a restart) is retried, at the
next sidecar if there are several, after a capped exponential backoff with jitter (0.1 s doubling to 5 s
each round of the sidecars); it is logged
(the first of a run as a warning), counted (`replay_retries`), and reported to `on_replay_state(state,
error)`: "connecting", "ready", "retrying" (with the error) and "failed" (with the error).

Threading. One application thread drives a Subscriber: the one calling next()/next_batch()/update()/
poll(); it runs the reconciler, the replay connections and the on_replay_state callback (keep it short),
and reads the multicast feeds during each poll turn. libzmq 4.3.4 aborts the process when a PGM SUB's pipe
fills (src/pgm_receiver.cpp:131), so with `drain` (the default) a second thread (`FeedDrain`) reads the
feeds whenever the application has been away for 20 ms, into a queue bounded by `buffer_limit_bytes` that
the next poll turn takes first; what overflows it is dropped there and recovered from replay like any
loss. While the application keeps calling, that costs one uncontended lock per turn. With drain=False the
feeds are read only during those calls: for an application that never stops calling.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import zmq

from gateway import reconcile as R
from gateway.client.datagram_fills import DatagramFills
from gateway.client.directory import Directory, resolve_feeds
from gateway.client.endpoints import Endpoints
from gateway.client.feed_drain import FeedDrain
from gateway.client.replay_client import DEFAULT_FEATURES, Event, ReplayClient, start_after
from gateway.client.snapshot_view import LastValues
from gateway.errors import (
    DataLoss,
    McastError,
    ReplayError,
    ReplayRefused,
    SlowConsumer,
    Unauthenticated,
    ZepsError,
)
from gateway.mcast import Endpoint, Tuning, open_sub
from gateway.transport.curve import CurveClientKeys
from gateway.transport.pgm import PgmReceiver
from gateway.wire import batch as B
from gateway.wire.columns import Columns
from gateway.wire.heartbeat import Heartbeat, parse_payload
from gateway.wire.protocol import FEATURE_SNAPSHOT, FetchEnd
from gateway.wire.protocol import Deliver as ZepsDeliver
from gateway.wire.protocol import SnapshotEnd as ZepsSnapshotEnd
from gateway.wire.protocol import Trimmed as ZepsTrimmed
from gateway.wire.streamkey import StreamKey, Verifier

log = logging.getLogger(__name__)

TICK_S = 0.02
FEED_BURST = 256  # multicast messages taken in per turn
REPLAY_DRAIN_LIMIT = 64  # replay frames taken in per connection per turn: bounds a turn, so deadlines hold
STATES_KEPT = 64  # state changes kept in SubscriberStats.states
_GAP_CYCLE = {R.State.MERGED, R.State.RECOVERING}  # logged at DEBUG: every gap under loss is one
MAX_LEARNT_SIDECARS = 8  # sidecars learnt from heartbeats (a replicated gateway's nodes), at most


@dataclass(frozen=True, slots=True)
class Received:
    """A record as the application gets it: where it came from is `source` ("live:A", "replay", "snapshot")."""

    seq: int
    ts_ns: int
    key: str
    body: bytes
    source: str
    ttl_ms: int = 0  # time to live after ts_ns (0: none); an empty body deletes the key


@dataclass(frozen=True, slots=True)
class Delivery:
    """Records `lo..hi` of one batch, in order: what `Subscriber.next_batch()` hands out, one object per batch.

    `raw()` yields (seq, ts_ns, key, body) with key and body as memoryviews into the batch (copy what you keep),
    with the subscriber's topics applied: the fast path, no object per record.
    """

    batch: B.Batch
    lo: int
    hi: int
    source: str
    prefixes: tuple[bytes, ...] = ()

    def raw(self) -> Iterator[tuple[int, int, memoryview, memoryview]]:
        records = self.batch.raw(self.lo, self.hi)
        if not self.prefixes:
            return records
        return (r for r in records if r[2].tobytes().startswith(self.prefixes))

    def columns(self) -> Columns:
        """The records as columns (gateway.wire.columns): sequences and times as int64 arrays, keys and bodies as
        offsets into the batch, no object per record; `.to_arrow()` makes a pyarrow RecordBatch of them."""
        return Columns(self.batch, self.lo, self.hi, self.prefixes)

    def records(self) -> Iterator[Received]:
        """The records as Received objects (copies; with their TTL): the convenient path."""
        prefixes, source = self.prefixes, self.source
        for seq, ts, key, body, ttl in self.batch.entries(self.lo, self.hi):
            kb = key.tobytes()
            if not prefixes or kb.startswith(prefixes):
                yield Received(seq, ts, kb.decode(errors="replace"), body.tobytes(), source, ttl)


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


def parse_start(start: str | int | datetime | None) -> tuple[R.Start | None, int | None]:
    """(reconciler start, or None for a time start; the time in ns for a time start)."""
    if start is None or start == "latest":
        return R.Start.latest(), None
    if start == "earliest":
        return R.Start.earliest(), None
    if start == "snapshot":
        return R.Start.snapshot(), None
    if isinstance(start, int) or (isinstance(start, str) and start.isdigit()):
        return R.Start.at_seq(max(1, int(start))), None
    when = start if isinstance(start, datetime) else datetime.fromisoformat(start)
    if when.tzinfo is None:
        raise ValueError(f"start time {start!r} needs a time zone, e.g. 2026-11-21T13:00:00Z")
    return None, int(when.timestamp() * 1e9)


class Checkpoint:
    """The last sequence the application finished with, kept in a file that is replaced atomically."""

    def __init__(self, path: Path, every_s: float = 0.5) -> None:
        self.path = path
        self.every_s = every_s
        self.saved_at = 0.0
        self.saved: int | None = None

    def load(self) -> int | None:
        try:
            return int(self.path.read_text().strip())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ValueError(f"checkpoint {self.path} does not hold a sequence number: delete it or fix it") from exc

    def save(self, seq: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if seq == self.saved or (not force and now - self.saved_at < self.every_s):
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(f"{seq}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.saved, self.saved_at = seq, now


class Subscriber:
    """Iterate to receive a stream's records gap-free and in order; see the module docstring."""

    def __init__(
        self,
        stream: str,
        *,
        multicast: Sequence[str] = (),
        replay: str | Sequence[str] | None = None,
        topics: Sequence[str] = (),
        start: str | int | datetime | None = "latest",
        checkpoint: str | Path | None = None,
        tuning: Tuning | None = None,
        max_lag: int | None = None,
        lag_policy: str = "replay",
        buffer_limit_bytes: int = 64 << 20,
        progress_timeout: float = 2.0,
        replay_timeout: float = 5.0,
        stream_key: StreamKey | Sequence[StreamKey] = (),
        curve: CurveClientKeys | None = None,
        view: bool | None = None,
        on_replay_state: Callable[[str, ZepsError | None], None] | None = None,
        drain: bool = True,
        interface: str | None = None,
        directory: Directory | None = None,
        discovery_timeout: float = 3.0,
        fill_udp: int | None = None,
        ctx: zmq.Context | None = None,
    ) -> None:
        """`replay`: a sidecar endpoint, or several serving the same stream, tried in turn (module docstring).
        `view`: keep `self.view`, the last value of every key (default: with start="snapshot").
        `replay_timeout`: the deadline of each replay handshake. `on_replay_state`: see the module docstring.
        `drain`: read the multicast feeds in an IO thread (`FeedDrain`) into a queue of at most
        `buffer_limit_bytes`, so they are read even while the application does not call (see "Threading").

        With neither `multicast` nor `replay`, the stream is found by name (gateway.client.directory): on the
        announcements heard on `interface` (or in `directory`) within `discovery_timeout` seconds; replay then
        goes where the directory says, and a sidecar that moves or dies is left for the one announced instead.

        `fill_udp`: the sidecar's fill port for datagram gap fills (gateway.client.datagram_fills); None: the
        replay endpoint's port when a feed is udp://, else off; 0: off."""
        keys = [stream_key] if isinstance(stream_key, StreamKey) else list(stream_key)
        self.directory: Directory | None = None
        if not multicast and not replay:
            self.directory, multicast = resolve_feeds(stream, interface, directory, keys, discovery_timeout)
        self._own_directory = directory is None
        self.stream = stream
        self.stream_name = stream.encode()
        self.ctx = ctx or zmq.Context.instance()
        self.topics = tuple(topics)
        self.prefixes = tuple(t.encode() for t in topics)
        self.pattern = topics[0] if len(topics) == 1 else ""
        # The sidecars, tried in turn; with none given, those the heartbeats name.
        self.sidecars = Endpoints(replay or (), first=0.1, cap=5.0)
        self.sidecars_given = bool(self.sidecars.all)
        self.replay_timeout = replay_timeout
        self.curve = curve
        # With a key (two while one is rotated), only multicast that checks out with it is let in.
        self.verifier = Verifier(stream, keys)
        self.stats = SubscriberStats()
        self.checkpoint = Checkpoint(Path(checkpoint)) if checkpoint else None
        self.feeds: dict[Any, str] = {}  # receiver -> feed name
        for i, text in enumerate(multicast):
            sock = open_sub(self.ctx, Endpoint.parse(text), tuning or Tuning(), [stream])
            self.feeds[sock] = chr(ord("A") + i)
        # With `drain`, the feeds are read by whoever holds the drain's lock: poll() while it runs, the drain's
        # thread while the application is away.
        self.drain = FeedDrain(self.feeds, buffer_limit_bytes, f"zeps-feeds-{stream}") if drain and multicast else None
        self._poller = zmq.Poller()
        for receiver in self.feeds:
            self._poller.register(receiver, zmq.POLLIN)
        if self.directory is not None:
            self._poller.register(self.directory, zmq.POLLIN)
        self._polled_replay: tuple[zmq.Socket, ...] = ()
        self.catchup: ReplayClient | None = None
        self.catchup_id: int | None = None
        self.fill: ReplayClient | None = None
        self.fills: deque[int] = deque()  # fill request ids in the order the sidecar answers them
        udp_feeds = any(Endpoint.parse(text).transport == "udp" for text in multicast)
        self.fill_udp = fill_udp if fill_udp is not None else (None if udp_feeds else 0)
        self.datagrams: DatagramFills | None = None  # for the current replay endpoint, made when first needed
        self.replay_up = True  # the reconciler has not been told ReplayLost
        self.reconnect_at = 0.0
        self.unready_since: float | None = None  # the first connection opened since one was last ready
        self.replay_state = "connecting"
        self.on_replay_state = on_replay_state
        self.failed: ReplayRefused | None = None  # raised at every call once what came before is handed out
        self.starter: tuple[ReplayClient, Generator[None, Event, int]] | None = None
        # Deliveries are expanded into Received only as next() asks: no object per record on next_batch().
        self.pending: deque[Delivery | DataLoss | SlowConsumer] = deque()
        self._current: tuple[Delivery, Iterator[Received]] | None = None  # the Delivery next() is reading
        self.position: int | None = None  # last sequence the application has finished with
        self.handed: int | None = None  # the record the application holds now (finished at its next call)
        self.closed = False
        self.view = LastValues() if (start == "snapshot" if view is None else view) else None

        resume = self.checkpoint.load() if self.checkpoint else None
        begin, self.since_ns = (R.Start.after_seq(resume), None) if resume is not None else parse_start(start)
        self.options = {
            "key_filter_active": bool(self.prefixes),
            "buffer_limit_bytes": buffer_limit_bytes,
            "progress_timeout": progress_timeout,
            "max_lag": max_lag,
            "lag_policy": lag_policy,
        }
        # Without multicast, "latest" is the journal's head now: asked of the sidecar, like a time start.
        self.reconciler: R.Reconciler | None = None
        if begin is not None and (self.feeds or begin != R.Start.latest()):
            self._begin(begin, time.monotonic())
        else:
            self._start_probe()

    # --- the application's side -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Received]:
        while not self.closed:
            item = self.next(timeout=None)
            if item is not None:
                yield item

    def next(self, timeout: float | None = None) -> Received | None:
        """The next record, or None after `timeout` seconds (None: wait for ever). Raises DataLoss/SlowConsumer."""
        self._finish_handed()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._current is not None:
                rec = next(self._current[1], None)
                if rec is not None:
                    self.handed = rec.seq
                    if self.view is not None:
                        self.view.apply(rec)
                    return rec
                self._current = None
            item = self._wait(deadline)
            if item is None:
                return None
            self._current = (item, item.records())

    def next_batch(self, timeout: float | None = None) -> Delivery | None:
        """The next records as one Delivery (the rest of one next() began), or None after `timeout` seconds.

        The fast path for high rates: one object per batch, records as views. Raises DataLoss/SlowConsumer.
        """
        self._finish_handed()
        item = self._rest_of_current()
        if item is None:
            item = self._wait(None if timeout is None else time.monotonic() + timeout)
        if item is not None:
            self.handed = item.hi
            if self.view is not None:
                for rec in item.records():
                    self.view.apply(rec)
        return item

    def _rest_of_current(self) -> Delivery | None:
        """What next() has not yet handed out of the Delivery it was reading, if anything."""
        if self._current is None:
            return None
        item, self._current = self._current[0], None
        lo = item.lo if self.position is None else max(item.lo, self.position + 1)
        return Delivery(item.batch, lo, item.hi, item.source, item.prefixes) if lo <= item.hi else None

    def _finish_handed(self) -> None:
        if self.handed is not None:
            self._finished(self.handed)
            self.handed = None

    def _wait(self, deadline: float | None) -> Delivery | None:
        """The next Delivery, polling until one is pending or the deadline passes; raises what is pending."""
        while not self.pending:
            if self.failed is not None:
                raise self.failed
            wait = TICK_S if deadline is None else min(TICK_S, deadline - time.monotonic())
            self.poll(max(wait, 0.0))  # timeout=0 still takes in what has arrived
            if wait <= 0:
                break
        if not self.pending:
            return None
        item = self.pending.popleft()
        if isinstance(item, Exception):
            raise item
        return item

    def update(self, timeout: float = 0.0) -> int:
        """Take every record that arrives within `timeout` seconds (0: what has arrived) into `view`; return
        how many. For applications that want the current values rather than each record."""
        if self.view is None:
            raise ValueError("update() keeps `view` current: create the Subscriber with view=True")
        deadline = time.monotonic() + timeout
        n = 0
        while True:
            self.poll(max(0.0, min(TICK_S, deadline - time.monotonic())))
            while self.next(0.0) is not None:  # next(0) hands out what is pending without waiting
                n += 1
            if time.monotonic() >= deadline:
                return n

    @property
    def state(self) -> str:
        return "STARTING" if self.reconciler is None else self.reconciler.state.name

    @property
    def replay_endpoint(self) -> str | None:
        """The replay sidecar in use, or next to try (None until one is known)."""
        return self.sidecars.current

    @property
    def head(self) -> int:
        """The highest sequence known to exist (0 until the start is known)."""
        return 0 if self.reconciler is None else self.reconciler.head

    @property
    def lag(self) -> int:
        return 0 if self.reconciler is None else self.reconciler.lag

    def pgm_counters(self) -> dict[str, dict[str, int]]:
        """OpenPGM's own counters, per feed name, of the feeds read through gateway.transport.pgm (repairs,
        resets, lost, junk, overruns: `ReceiverStats`); none for libzmq's engine, which exposes none. The
        receivers' I/O threads update them; a read is a snapshot."""
        return {
            feed: dataclasses.asdict(receiver.stats)
            for receiver, feed in self.feeds.items()
            if isinstance(receiver, PgmReceiver)
        }

    def summary(self) -> dict[str, int]:
        if self.drain is not None:
            self.stats.feed_dropped = self.drain.dropped
        if self.datagrams is not None:
            self.stats.fill_datagrams = self.datagrams.stats.answers
            self.stats.fills_escalated = self.datagrams.stats.escalated
        return self.stats.summary(self.reconciler)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.reconciler is not None:
            self._execute(self.reconciler.handle(R.Close(), time.monotonic()))
        if self.handed is not None:
            self._finished(self.handed)
        if self.checkpoint and self.position is not None:
            self.checkpoint.save(self.position, force=True)
        if self.drain is not None:
            self.drain.close()
        else:
            for sock in self.feeds:
                sock.close(linger=0)
        self._close_replay()
        if self.datagrams is not None:
            self.datagrams.close()
        if self.directory is not None and self._own_directory:
            self.directory.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop ---------------------------------------------------------------------------------------

    def pollables(self) -> list:
        """What an event loop should wait on instead of calling `poll` (sockets and file-like objects): with a
        drain, its queue instead of the feeds (call `drain.away()` before awaiting, so that its thread reads
        them meanwhile)."""
        self._sync_poller()
        if self.drain is None:
            return [sock for sock, _ in self._poller.sockets]
        return [self.drain, *(sock for sock, _ in self._poller.sockets if sock not in self.feeds)]

    def _replay_clients(self) -> tuple[ReplayClient, ...]:
        starter = self.starter[0] if self.starter is not None else None
        return tuple(c for c in (starter, self.catchup, self.fill) if c is not None)

    def _sync_poller(self) -> None:
        # A connection's monitor too: a connection that ends says so there, not on the socket.
        replay = tuple(sock for c in self._replay_clients() for sock in (c.sock, c.handshake.monitor) if sock)
        if replay != self._polled_replay:  # connections come and go; the feeds stay registered
            for sock in self._polled_replay:
                self._poller.unregister(sock)
            for sock in replay:
                self._poller.register(sock, zmq.POLLIN)
            self._polled_replay = replay

    def poll(self, timeout: float) -> None:
        """Wait up to `timeout` for input, feed it all to the reconciler, carry out its actions."""
        if self.drain is None:
            self._turn(timeout)
            return
        self.drain.acquire()  # the feeds are ours for this turn
        try:
            self._turn(timeout)
        finally:
            self.drain.release()

    def _turn(self, timeout: float) -> None:
        self._sync_poller()
        direct = True  # read the feeds themselves: not while older messages wait in the drain's queue
        if self.drain is not None and self.drain.queue:
            now = time.monotonic()
            for feed, frames in self.drain.take(FEED_BURST):
                self._on_feed(feed, frames, now)
            direct, timeout = not self.drain.queue, 0.0
        due = self.datagrams.hedge.next_due() if self.datagrams is not None else None
        if due is not None:  # a datagram's timer: wake for it (rounded up, so a due timer is not polled at 0)
            timeout = min(timeout, max(0.0, due - time.monotonic()) + 0.0005)
        if self._poller.sockets:
            ready = dict(self._poller.poll(math.ceil(timeout * 1000)))
        else:  # nothing to wait on (replay only, between tries): sleep, never spin
            time.sleep(timeout)
            ready = {}
        now = time.monotonic()
        if direct:
            for sock, feed in self.feeds.items():
                if sock in ready:
                    self._drain_feed(sock, feed, now)
        if self.directory is not None and self.directory in ready:
            self.directory.drain()
            self._follow_sidecar(now)
        for client in self._replay_clients():
            # A handshake is looked at every turn (its deadline), a ready connection when it or its monitor stirs.
            if not client.ready or client.sock in ready or client.handshake.monitor in ready:
                self._drain_replay(client, now)
        if self.datagrams is not None and self.reconciler is not None:
            self._on_datagrams(self.datagrams, self.datagrams.fileno() in ready, now)
        if self.failed is None and not self.replay_up and now >= self.reconnect_at:
            self._reconnect(now)
        if self.reconciler is None:
            if self.starter is None and self.replay_up and self.failed is None:
                self._start_probe()  # the replay endpoint may have been learnt from a heartbeat
        else:
            self._execute(self.reconciler.handle(R.Tick(), now))

    def _drain_feed(self, sock: Any, feed: str, now: float) -> None:
        for _ in range(FEED_BURST):
            frames: list[bytes] | McastError
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except McastError as exc:  # a datagram that is no message (udp://)
                frames = exc
            self._on_feed(feed, frames, now)

    def _on_feed(self, feed: str, frames: list[bytes] | McastError, now: float) -> None:
        """One multicast message: a batch or a heartbeat of this stream, or something to drop and count."""
        if isinstance(frames, McastError):  # the receiver's refusal (udp://)
            self._reject(feed, frames)
            return
        if frames[0] != self.stream_name:
            return  # another stream sharing the group and prefix
        try:
            item = parse_payload(self.verifier.open(frames))
        except McastError as exc:
            self._reject(feed, exc)
            return
        if isinstance(item, Heartbeat):
            learnt = self.sidecars.all
            if (
                item.replay
                and not self.sidecars_given
                and item.replay not in learnt
                and len(learnt) < MAX_LEARNT_SIDECARS
            ):
                self.sidecars.add(item.replay)
                log.info("replay sidecar found from heartbeats: %s", item.replay)
            if self.reconciler is not None:
                self._execute(self.reconciler.handle(R.HeadSeen(item.head, feed, item.epoch), now))
        elif self.reconciler is not None:  # before the start is known, replay covers what passes now
            self._execute(self.reconciler.handle(R.Live(item, feed), now))

    def _reject(self, feed: str, exc: McastError) -> None:
        self.stats.rejected_packets += 1
        if isinstance(exc, Unauthenticated):
            self.stats.unauthenticated += 1
        log.debug("feed %s: dropped a packet: %s", feed, exc)

    def _drain_replay(self, client: ReplayClient, now: float) -> None:
        try:
            # An action may close this connection mid-drain (Cancel of the catch-up): then stop reading it.
            for _ in range(REPLAY_DRAIN_LIMIT):
                if client not in self._replay_clients() or (event := client.recv(0)) is None:
                    break
                self._on_replay(client, event, now)
        except ReplayRefused as exc:
            if not self.sidecars.refused(exc.reason):
                self._replay_lost(now, exc.reason, hint=exc.reason)
            elif self.sidecars.several:
                self._fail(type(exc)(f"every replay sidecar refused: {self.sidecars.refused_text()}"))
            else:
                self._fail(exc)
        except ReplayError as exc:
            self._replay_lost(now, exc.reason)
        else:
            if client.ready and client in self._replay_clients():
                self.unready_since = None
                if self.replay_state != "ready":
                    self.sidecars.succeeded()
                    self._set_replay_state("ready", None)

    def _on_replay(self, client: ReplayClient, event: Event, now: float) -> None:
        if self.starter is not None and client is self.starter[0]:
            self._start_step(event, now)
            return
        assert self.reconciler is not None  # the starter is the only connection before it exists
        if client is self.catchup:
            request_id = self.catchup_id
        else:
            request_id = self.fills[0] if self.fills else None
        if request_id is None:
            return  # an answer to something already given up
        match event:
            case B.Batch():
                self._execute(self.reconciler.handle(R.Replay(event, request_id), now))
            case ZepsDeliver(sequence=seq, key=key, body=body):
                # A plain ZEPS server: one record, covering just its own sequence.
                single = B.Batch.parse(B.encode(seq, [(0, key.encode(), bytes(body))]))
                self._execute(self.reconciler.handle(R.Replay(single, request_id), now))
            case ZepsTrimmed(first_retained=first):
                self._execute(self.reconciler.handle(R.ReplayTrimmed(request_id, first), now))
            case FetchEnd():
                self.fills.popleft()
                self._execute(self.reconciler.handle(R.ReplayEnd(request_id), now))
            case ZepsSnapshotEnd(last=last):
                self._execute(self.reconciler.handle(R.SnapshotDone(request_id, last), now))

    def _on_datagrams(self, fills: DatagramFills, readable: bool, now: float) -> None:
        """Datagram answers to the reconciler, as FETCH answers are; ranges out of tries to FETCH."""
        assert self.reconciler is not None
        for rid, batch in fills.receive(now) if readable else ():  # the poller names a plain socket by its fd
            self._execute(self.reconciler.handle(R.Replay(batch, rid), now))
            if fills is not self.datagrams:
                return  # an action closed it (replay lost)
        for rid, lo, hi in fills.expire(now, self.reconciler.next_seq or 1):
            self._fetch(rid, lo, hi)

    # --- actions ----------------------------------------------------------------------------------------

    def _execute(self, actions: list[R.Action]) -> None:
        assert self.reconciler is not None
        for action in actions:
            match action:
                case R.Emit(batch=batch, lo=lo, hi=hi, source=source):
                    self._deliver(cast(B.Batch, batch), lo, hi, source)  # the batches fed to the reconciler
                case R.Request():
                    self._request(action)
                case R.Cancel(request_id=rid):
                    self._cancel(rid)
                case R.Loss(lo=lo, hi=hi, reason=reason):
                    self.stats.losses += hi - lo + 1
                    log.warning("records %d..%d of %s are lost: %s", lo, hi, self.stream, reason)
                    self.pending.append(DataLoss(lo, hi, reason))
                case R.Stalled(lo=lo, hi=hi, attempts=attempts):
                    log.warning("replay of %s..%s made no progress after %d attempts; still trying", lo, hi, attempts)
                case R.LagExceeded(lag=lag):
                    self.pending.append(SlowConsumer(f"the application is {lag} records behind the live feed"))
                case R.StateChanged(old=old, new=new):
                    self.stats.states.append(new.name)
                    # a gap and its fill (MERGED <-> RECOVERING) are routine, hundreds a second under loss
                    level = logging.DEBUG if {old, new} == _GAP_CYCLE else logging.INFO
                    log.log(level, "%s: %s", self.stream, new.name)

    def _deliver(self, batch: B.Batch, lo: int, hi: int, source: str) -> None:
        delivery = Delivery(batch, lo, hi, source, self.prefixes)
        # Dense and unfiltered (every live batch, and replay without topics): the count needs no walk.
        n = hi - lo + 1 if batch.dense and not self.prefixes else sum(1 for _ in delivery.raw())
        if n:
            self.pending.append(delivery)
        if source.startswith("live"):
            self.stats.from_live += n
        elif source == "snapshot":
            self.stats.from_snapshot += n
        else:
            self.stats.from_replay += n
        if not n and not self.pending and self._current is None:
            self._finished(hi)  # a range with nothing for this client still moves the checkpoint

    def _finished(self, seq: int) -> None:
        self.position = seq
        if self.checkpoint:
            self.checkpoint.save(seq)

    def _request(self, req: R.Request) -> None:
        if not self.replay_up:
            return  # ReplayRestored re-issues it
        try:
            if req.hi is None:
                if self.catchup is not None:
                    self.catchup.close()
                self.catchup = self._connect()
                self.catchup_id = req.request_id
                if req.snapshot:
                    self.catchup.snapshot(self.topics)
                else:
                    self.catchup.subscribe(self.pattern, latest=req.lo - 1)
            else:
                fills = self._datagram_fills()
                if fills is None or not fills.ask(req.request_id, req.lo, req.hi, time.monotonic()):
                    self._fetch(req.request_id, req.lo, req.hi)
        except ReplayError as exc:
            self._replay_lost(time.monotonic(), exc.reason)

    def _fetch(self, request_id: int, lo: int, hi: int) -> None:
        """FETCH lo..hi over TCP for the reconciler's request `request_id`."""
        try:
            if self.fill is None:
                self.fill = self._connect()
            self.fill.fetch(lo, hi, self.pattern)
            self.fills.append(request_id)
        except ReplayError as exc:
            self._replay_lost(time.monotonic(), exc.reason)

    def _datagram_fills(self) -> DatagramFills | None:
        """The datagram path to the current sidecar's fill port; None when off or its address is no IPv4
        literal (a name would need a resolver call, which may block)."""
        if self.fill_udp == 0 or self.replay_endpoint is None:
            return None
        host, _, port = self.replay_endpoint.removeprefix("tcp://").rpartition(":")
        try:
            socket.inet_aton(host)
            address = (host, self.fill_udp or int(port))
        except (OSError, ValueError):
            return None
        old, moved = self.datagrams, []
        if old is not None and old.sidecar != address:  # the sidecar moved: ask the new one what is outstanding
            moved = [(rid, ask.lo, ask.hi) for rid, ask in old.hedge.asks.items()]
            self._poller.unregister(old)
            old.close()
            self.datagrams = None
        if self.datagrams is None:
            self.datagrams = DatagramFills(address, self.stream, keys=self.verifier.keys)
            self._poller.register(self.datagrams, zmq.POLLIN)
            if self.fill is None:  # the fallback's connection, ready before a range needs it: a TCP handshake
                self.fill = self._connect()  # under loss can take a second (the SYN's retransmission timer)
            now = time.monotonic()
            for rid, lo, hi in moved:
                if not self.datagrams.ask(rid, lo, hi, now):
                    self._fetch(rid, lo, hi)
        return self.datagrams

    def _cancel(self, request_id: int) -> None:
        if self.datagrams is not None:
            self.datagrams.hedge.cancel(request_id)
        if request_id == self.catchup_id and self.catchup is not None:
            self.catchup.close()  # ZEPS has no unsubscribe: the connection was the subscription
            self.catchup, self.catchup_id = None, None
        # A FETCH cannot be recalled; its answer is bounded and the reconciler ignores what it no longer needs.

    def _connect(self) -> ReplayClient:
        """A new replay connection, handshaking in the background of the poll loop (never waits)."""
        info = self.directory.lookup(self.stream) if self.directory is not None else None
        if info is not None and info.sidecar and self.replay_endpoint not in info.sidecars + info.named:
            log.info("%s: replay sidecar at %s (announced)", self.stream, info.sidecar)
            self.sidecars.move_to(info.sidecar)
        for sidecar in info.sidecars if info is not None else ():  # a group's nodes' sidecars, tried in turn
            self.sidecars.add(sidecar)
        if self.replay_endpoint is None:
            raise ReplayError("no replay endpoint yet: give --replay, or wait for a heartbeat that names one")
        # The handshake deadline runs from the first connection opened since one was ready, so that the
        # reconciler re-issuing a request (a new connection) cannot keep a dead server looking "connecting".
        now = time.monotonic()
        if self.unready_since is None:
            self.unready_since = now
        features = (*DEFAULT_FEATURES, FEATURE_SNAPSHOT)
        return ReplayClient(
            self.replay_endpoint,
            self.stream,
            features=features,
            timeout=max(0.001, self.unready_since + self.replay_timeout - now),
            curve=self.curve,
            ctx=self.ctx,
            fail_unreachable=self.sidecars.several,
        )

    def _close_replay(self) -> None:
        for client in self._replay_clients():
            client.close()
        self.catchup = self.fill = self.starter = None
        self.catchup_id = None
        self.fills.clear()
        if self.datagrams is not None:
            self.datagrams.hedge.clear()

    def _follow_sidecar(self, now: float) -> None:
        """Leave a sidecar that no longer announces itself (killed, moved) for one that does: a connection to a
        dead one may never fail by itself."""
        assert self.directory is not None
        info = self.directory.lookup(self.stream)
        connected = self.catchup is not None or self.fill is not None
        if connected and info is not None and info.sidecars and self.replay_endpoint not in info.sidecars:
            self._replay_lost(now, f"{self.replay_endpoint} is no longer announced; {info.sidecar} is")

    def _replay_lost(self, now: float, reason: str, *, hint: str = "") -> None:
        """The sidecar in use failed (`hint`: its refusal, which may name another): the next one, after a backoff."""
        # The first failure of a run is a warning; the retries that follow it are debug lines.
        level = logging.WARNING if self.sidecars.backoff.failures == 0 else logging.DEBUG
        delay = self.sidecars.failed(hint)
        self.stats.replay_retries += 1
        log.log(level, "%s: replay: %s; retrying at %s in %.2f s", self.stream, reason, self.replay_endpoint, delay)
        self._close_replay()
        self.unready_since = None
        if self.replay_up:
            self.replay_up = False
            if self.reconciler is not None:
                self._execute(self.reconciler.handle(R.ReplayLost(), now))
        self.reconnect_at = now + delay
        self._set_replay_state("retrying", ReplayError(reason))

    def _reconnect(self, now: float) -> None:
        if self.reconciler is None:
            self.replay_up = True
            self._start_probe()
            return
        try:
            self.fill = self._connect()
        except ReplayError:  # no endpoint known yet
            self.reconnect_at = now + self.sidecars.backoff.next()
            return
        self.replay_up = True
        self.stats.replay_reconnects += 1
        self._set_replay_state("connecting", None)
        self._execute(self.reconciler.handle(R.ReplayRestored(), now))

    def _fail(self, exc: ReplayRefused) -> None:
        """A final failure: no more tries; next() raises it once what came before is handed out."""
        log.error("%s: %s", self.stream, exc)
        self._close_replay()
        self.failed = exc
        self._set_replay_state("failed", exc)

    def _set_replay_state(self, state: str, error: ZepsError | None) -> None:
        if state == self.replay_state and error is None:
            return
        self.replay_state = state
        if self.on_replay_state is not None:
            self.on_replay_state(state, error)

    # --- the start ----------------------------------------------------------------------------------------

    def _start_probe(self) -> None:
        """Ask the sidecar where to start (the journal's head, or the first record since a time)."""
        try:
            client = self._connect()
        except ReplayError:
            return  # no endpoint yet: a heartbeat will name one
        steps = start_after(client, self.since_ns)
        next(steps)
        self.starter = (client, steps)

    def _start_step(self, event: Event, now: float) -> None:
        assert self.starter is not None
        client, steps = self.starter
        try:
            steps.send(event)
        except StopIteration as stop:
            client.close()
            self.starter = None
            log.info("%s: starting at sequence %d", self.stream, stop.value)
            self._begin(R.Start.at_seq(stop.value), now)

    def _begin(self, begin: R.Start, now: float) -> None:
        self.reconciler = R.Reconciler(begin, **self.options)  # type: ignore[arg-type]
        self._execute(self.reconciler.handle(R.Tick(), now))
