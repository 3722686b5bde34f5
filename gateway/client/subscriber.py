"""`Subscriber`: the dual-connection client. Multicast and replay in, one gap-free ordered stream out.

A façade over three parts, each testable alone: the reconciler (`gateway.reconcile`: every decision about
what the application sees), the feed intake (`gateway.client.feed_intake`: the multicast feeds, the stream
key check, the drain thread) and the replay link (`gateway.client.replay_link`: the sidecars, the catch-up
and fill connections, datagram fills, reconnects, the start probe; its state is a table in
`gateway.client.link_state`). The parts turn what arrives into reconciler events; this class feeds them to
the reconciler one at a time (an event that arrives while another's actions are carried out waits its turn:
the reconciler is never re-entered), carries out the actions, and hands the application what they emit.

The replay endpoint may be given, or several (sidecars on one journal, or on the nodes of a replicated
gateway), or learnt from the multicast heartbeats. Replay uses one at a time and moves on to the next
whenever a connection to it is lost, cannot be made, is refused or times out; the reconciler then asks the
new one for what it still needs, so the application sees only a pause. With several, a fill that hears
nothing at all from its sidecar within FIRST_ANSWER_S (0.3 s; a healthy one answers in milliseconds) moves
on too, instead of waiting out `progress_timeout` at a paused or cut-off node (the reconciler's first-answer
deadline, told the count by `ReplayServers`). Records the application asked not to see (topic prefixes) are
filtered here; the reconciler still sees every sequence.

Without multicast (TCP only) replay is the only source: history, then the sidecar's live tail. The
reconciler runs in its replay-only mode, with the head the sidecar reports every quarter of
`progress_timeout` (at most HEAD_EVERY_S) for heartbeats: `state` is MERGED while the stream is caught up
to that head (docs/reconciler.md says when exactly), CATCHING_UP while it is behind.

Loss the journal can no longer repair is never skipped in silence: iteration raises `DataLoss` naming the
range, and iterating again continues after it.

start="snapshot" begins with the last record of every key (docs/snapshots.md); `view` is then the
application's key -> value map, kept current as records are handed out (or by `update()`).

Never blocking. Nothing here waits on the network: the constructor only opens sockets, and every replay
handshake, request and reconnect is a phase of a connection (`ReplayClient`) that the poll loop advances
with its own deadline. So `next(timeout)` and `next_batch(timeout)` return by their deadline whatever the
network does. A start that needs an answer first (a time; the last N; "latest" without multicast, which means
the journal's head when subscribing) is a probe run by the same loop; until it ends, `state` is "STARTING".

Failures. A final one (`ReplayRefused`: unknown stream, protocol version, refused or missing CURVE keys,
a corrupt journal at the server, a missing extension; with several sidecars, once every one has refused
since the last success) is raised from `next()`/`next_batch()` once what came before it has been handed
out, and again at every later call. Anything else (no answer, refused TCP, a restart) is retried, at the
next sidecar if there are several, after a capped exponential backoff with jitter (0.1 s doubling to 5 s
each round of the sidecars); it is logged (the first of a run as a warning), counted (`replay_retries`), and
reported to `on_replay_state(state, error)`: "connecting", "ready", "retrying" (with the error) and "failed"
(with the error). While a sidecar does not answer, a warning says so at once and again with the time waited.

Threading. One application thread drives a Subscriber: the one calling next()/next_batch()/update()/
poll(); it runs the reconciler, the replay link and the on_replay_state callback (keep it short), and reads
the multicast feeds during each poll turn. With `drain` (the default) a second thread reads the feeds
whenever the application has been away for 20 ms (gateway.client.feed_intake says why and how). While the
application keeps calling, that costs one uncontended lock per turn. With drain=False the feeds are read
only during those calls: for an application that never stops calling. A `checkpoint` is written, fsynced and
renamed on the application thread too, inside next() at most every 0.5 s (gateway.client.checkpoint): about a
millisecond, at times a tenth of a second on a busy disk, during which the drain (not the poll turn) reads.

Size: just over 600 lines, kept whole: it is the façade alone, a public API of some 20 methods and properties
with their docstrings (the API reference, `make docs`, is made from them); its parts (feed intake, replay link,
reconciler, checkpoint, statistics) are modules of their own.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, cast

import zmq

from gateway import reconcile as R
from gateway.client.checkpoint import Checkpoint
from gateway.client.directory import Directory, resolve_feeds
from gateway.client.feed_intake import FeedIntake, open_feeds
from gateway.client.replay_link import HEAD_EVERY_S, ReplayLink
from gateway.client.snapshot_view import LastValues
from gateway.client.start_point import StartPoint, parse_start
from gateway.client.subscriber_stats import STATES_KEPT, SubscriberStats
from gateway.errors import Closed, ConfigError, DataLoss, ReplayRefused, SlowConsumer, ZepsError
from gateway.mcast import Endpoint, Tuning
from gateway.transport.curve import CurveClientKeys
from gateway.wire import batch as B
from gateway.wire.columns import Columns
from gateway.wire.streamkey import StreamKey

__all__ = ["STATES_KEPT", "TICK_S", "Checkpoint", "Delivery", "Received", "Subscriber", "SubscriberStats"]

log = logging.getLogger(__name__)

TICK_S = 0.02
_GAP_CYCLE = {R.State.MERGED, R.State.RECOVERING}  # logged at DEBUG: every gap under loss is one
LAG_POLICIES = ("replay", "raise")


@dataclass(frozen=True, slots=True)
class Received:
    """A record as the application gets it, from `Subscriber.next()` or iterating a Subscriber.

    seq: its sequence number in the stream (from 1, gap-free). ts_ns: when the gateway sequenced it, in
    nanoseconds since the epoch (publish time). key: its key (UTF-8, undecodable bytes replaced). body: its
    bytes; empty: the key is deleted. source: where it came from: "live:A" (multicast feed A, ...), "replay"
    (the sidecar's journal) or "snapshot" (start="snapshot"). ttl_ms: its time to live after ts_ns, in ms
    (0: none).

        for rec in Subscriber("orders", replay="tcp://127.0.0.1:5571", start="earliest"):
            print(rec.seq, rec.key, rec.body, rec.source)
    """

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
    with the subscriber's topics applied: the fast path, no object per record. `records()` yields `Received`
    copies; `columns()` columns of arrays.

    batch: the record batch (gateway.wire.batch.Batch) the records are in. lo, hi: the first and last sequence
    handed out (the batch may cover more). source: where it came from ("live:A", "replay", "snapshot", as
    `Received.source`). prefixes: the subscriber's topics as key prefixes (empty: every key); records whose
    keys start with none of them are skipped.

        while (d := sub.next_batch(timeout=1.0)) is not None:
            for seq, ts_ns, key, body in d.raw():
                total += len(body)
    """

    batch: B.Batch
    lo: int
    hi: int
    source: str
    prefixes: tuple[bytes, ...] = ()

    def raw(self) -> Iterator[tuple[int, int, memoryview, memoryview]]:
        """(seq, ts_ns, key, body) per record, key and body as views into the batch, the topics applied."""
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


def _start_point(start: str | int | datetime | None) -> StartPoint:
    try:
        return parse_start("latest" if start is None else start)
    except ConfigError as exc:
        raise ConfigError(f"start: {exc}") from None


def _prefixes(topics: str | Sequence[str]) -> tuple[str, ...]:
    """Topics as a tuple of key prefixes: a str is one prefix (not a sequence of one-letter prefixes)."""
    prefixes = (topics,) if isinstance(topics, str) else tuple(topics)
    for topic in prefixes:
        if not isinstance(topic, str):
            raise TypeError(f"topics: {topic!r} is a {type(topic).__name__}: give key prefixes as str, e.g. 'eu.'")
    return prefixes


def _reconciler_start(point: StartPoint) -> tuple[R.Start | None, int | None, int]:
    """(the reconciler's start, or None when the sidecar must be asked first; the time to ask for, in ns;
    the last N records to start with, 0 for none)."""
    match point:
        case StartPoint(word="earliest"):
            return R.Start.earliest(), None, 0
        case StartPoint(word="snapshot"):
            return R.Start.snapshot(), None, 0
        case StartPoint(seq=int(seq)):
            return R.Start.at_seq(max(1, seq)), None, 0
        case StartPoint(back=int(back)):
            return None, None, back
        case StartPoint(time_ns=int(ns)):
            return None, ns, 0
    return R.Start.latest(), None, 0


def reported_as(sock: Any) -> Any:
    """How zmq.Poller names `sock` in what `poll()` returns: a ZeroMQ socket as itself, anything else (a datagram
    fill socket) by its fd, taken while it is open."""
    return sock if isinstance(sock, zmq.Socket) else sock.fileno()


class Subscriber:
    """Iterate to receive a stream's records gap-free and in order; see the module docstring.

        Arguments (all but `stream` by keyword):

        - `stream`: the stream's name.
        - `multicast`: multicast endpoints of the stream (epgm://IF;GROUP:PORT, norm://..., udp://...), one per
          feed (A/B). `replay`: a sidecar's tcp://HOST:PORT, or several serving the stream, tried in turn. With
          neither, the stream is found by name on `interface` or in `directory` (below).
        - `start`: where to begin when `checkpoint` holds nothing. "latest" (default: from now on), "earliest"
          (the first record the journal retains), "snapshot" (the last record of every key, then what follows;
          docs/snapshots.md), a sequence number (int, or its digits: from it on), -N (the last N records), or a
          time (an aware datetime, or ISO-8601 text with a zone, e.g. "2026-05-01T09:30:00Z": the first record
          journaled at or after it). Anything else raises ConfigError naming these forms.
        - `topics`: key prefixes to deliver: one prefix as a str ("eu."), or several as a list (default: all).
        - `checkpoint`: a file path. The last sequence handed out and finished with is saved there (atomically,
          at most every 0.5 s and on close); when the file exists, the stream resumes after it and `start` is
          ignored.
        - `max_lag` and `lag_policy`: when the application is more than `max_lag` records behind the live feed,
          "replay" (default) reads on from the journal instead of holding live records (nothing is lost, the
          application catches up at its pace); "raise" raises SlowConsumer from next().
        - `view`: keep `self.view`, the last value of every key (default: with start="snapshot").
        - `replay_timeout`: the deadline of each replay handshake. `on_replay_state(state, error)`: told
          "connecting", "ready", "retrying" and "failed" (module docstring).
        - `drain`: read the multicast feeds in an IO thread (`FeedDrain`) into a queue of at most
          `buffer_limit_bytes`, so they are read even while the application does not call (see "Threading").
        - `interface`, `directory`, `discovery_timeout`: with neither `multicast` nor `replay`, the stream is
          found by name (gateway.client.directory): on the announcements heard on `interface` (or in
          `directory`) within `discovery_timeout` seconds; replay then goes where the directory says, and a
          sidecar that moves or dies is left for the one announced instead.
        - `fill_udp`: the sidecar's fill port for datagram gap fills (gateway.client.datagram_fills); None: the
          replay endpoint's port when a feed is udp://, else off; 0: off.
        - `stream_key`: accept only multicast signed with this key (two while one is rotated). `curve`: keys for
          CURVE replay connections.
    - `tuning`: multicast socket settings (gateway.mcast.Tuning: rate, recovery interval, buffers) for the
      feeds; None: the defaults. `progress_timeout`: seconds without progress (no live record, no replay answer)
      before the reconciler falls back to replay or asks again. `ctx`: the ZeroMQ context to make sockets in
      (default: one of its own).
    """

    def __init__(
        self,
        stream: str,
        *,
        multicast: Sequence[str] = (),
        replay: str | Sequence[str] | None = None,
        topics: str | Sequence[str] = (),
        start: str | int | datetime | None = "latest",
        checkpoint: str | Path | None = None,
        tuning: Tuning | None = None,
        max_lag: int | None = None,
        lag_policy: Literal["replay", "raise"] = "replay",
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
        """See the class docstring. Bad arguments raise ConfigError (a ValueError) or TypeError at once."""
        point = _start_point(start)
        topics = _prefixes(topics)
        if lag_policy not in LAG_POLICIES:
            raise ConfigError(f"lag_policy {lag_policy!r}: use one of {', '.join(map(repr, LAG_POLICIES))}")
        # The reconciler's own checks would come only once the start is known (after a probe: from next()).
        if max_lag is not None and max_lag < 1:
            raise ConfigError(f"max_lag {max_lag!r}: give a number of records >= 1, or None for no limit")
        for name, seconds in (("progress_timeout", progress_timeout), ("replay_timeout", replay_timeout)):
            if not seconds > 0:
                raise ConfigError(f"{name} {seconds!r}: give a number of seconds > 0")
        keys = [stream_key] if isinstance(stream_key, StreamKey) else list(stream_key)
        self._directory: Directory | None = None
        if not multicast and not replay:
            self._directory, multicast = resolve_feeds(stream, interface, directory, keys, discovery_timeout)
        self._own_directory = directory is None
        self.stream = stream
        self.stats = SubscriberStats()
        self._prefixes = tuple(t.encode() for t in topics)
        self._checkpoint = Checkpoint(Path(checkpoint)) if checkpoint else None
        self._reconciler: R.Reconciler | None = None  # made once the start is known
        self._inbox: deque[R.Event] = deque()  # events that came while another's actions were carried out
        self._servers_told = 0  # the sidecar count the reconciler was last told (ReplayServers)
        self._feeding = False
        self._now = time.monotonic()  # the current poll turn's clock, for the events the parts hand on
        ctx = ctx or zmq.Context.instance()
        udp_feeds = any(Endpoint.parse(text).transport == "udp" for text in multicast)
        self._link = ReplayLink(
            stream,
            replay,
            topics=topics,
            timeout=replay_timeout,
            curve=curve,
            ctx=ctx,
            directory=self._directory,
            fill_udp=fill_udp if fill_udp is not None else (None if udp_feeds else 0),  # on for udp:// feeds
            keys=keys,
            stats=self.stats,
            emit=self._feed,
            next_seq=lambda: (self._reconciler.next_seq if self._reconciler is not None else None) or 1,
            on_start=self._started,
            on_state=on_replay_state,
            # Without multicast no heartbeat says where the live tail is: the sidecar is asked (replay-only mode).
            head_every=None if multicast else min(HEAD_EVERY_S, progress_timeout / 4),
        )
        self._intake = FeedIntake(
            stream,
            open_feeds(ctx, stream, multicast, tuning),
            keys=keys,
            drain=drain,
            buffer_limit_bytes=buffer_limit_bytes,
            stats=self.stats,
            emit=self._feed,
            on_sidecar=self._link.heard,
        )
        self.send_errors = self._link.send_errors  # sends the network refused (SubscriberMetrics counts them)
        self._poller = zmq.Poller()
        for receiver in self._intake.feeds:
            self._poller.register(receiver, zmq.POLLIN)
        if self._directory is not None:
            self._poller.register(self._directory, zmq.POLLIN)
        self._polled_link: tuple[Any, ...] = ()
        self._link_keys: tuple[Any, ...] = ()  # how the poller reports them (reported_as)
        self._chores_owed = False  # the last turn handed records out before its replay link turn and Tick
        # Deliveries are expanded into Received only as next() asks: no object per record on next_batch().
        self._pending: deque[Delivery | DataLoss | SlowConsumer] = deque()
        self._current: tuple[Delivery, Iterator[Received]] | None = None  # the Delivery next() is reading
        self._position: int | None = None  # last sequence the application has finished with
        self._handed: int | None = None  # the record the application holds now (finished at its next call)
        self._closed = False
        self.view = LastValues() if (point.word == "snapshot" if view is None else view) else None

        resume = self._checkpoint.load() if self._checkpoint else None
        begin, since_ns, self._back = (
            (R.Start.after_seq(resume), None, 0) if resume is not None else _reconciler_start(point)
        )
        self._options = {
            "key_filter_active": bool(self._prefixes),
            "buffer_limit_bytes": buffer_limit_bytes,
            "progress_timeout": progress_timeout,
            "max_lag": max_lag,
            "lag_policy": lag_policy,
            "replay_only": not multicast,
        }
        # Without multicast, "latest" is the journal's head now: asked of the sidecar, like a time start.
        if begin is not None and (self._intake.feeds or begin != R.Start.latest()):
            self._begin(begin)
        else:
            self._link.probe(since_ns)

    # --- the application's side -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Received]:
        while not self._closed:
            item = self.next(timeout=None)
            if item is not None:
                yield item

    def next(self, timeout: float | None = None) -> Received | None:
        """The next record, or None after `timeout` seconds (None: wait for ever). Raises DataLoss/SlowConsumer,
        and Closed after close()."""
        self._check_open()
        self._finish_handed()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._current is not None:
                rec = next(self._current[1], None)
                if rec is not None:
                    self._handed = rec.seq
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

        The fast path for high rates: one object per batch, records as views. Raises DataLoss/SlowConsumer,
        and Closed after close().
        """
        self._check_open()
        self._finish_handed()
        item = self._rest_of_current()
        if item is None:
            item = self._wait(None if timeout is None else time.monotonic() + timeout)
        if item is not None:
            self._handed = item.hi
            if self.view is not None:
                for rec in item.records():
                    self.view.apply(rec)
        return item

    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"this Subscriber of {self.stream!r} is closed: nothing more will come; create a new one")

    def _rest_of_current(self) -> Delivery | None:
        """What next() has not yet handed out of the Delivery it was reading, if anything."""
        if self._current is None:
            return None
        item, self._current = self._current[0], None
        lo = item.lo if self._position is None else max(item.lo, self._position + 1)
        return Delivery(item.batch, lo, item.hi, item.source, item.prefixes) if lo <= item.hi else None

    def _finish_handed(self) -> None:
        if self._handed is not None:
            self._finished(self._handed)
            self._handed = None

    def _wait(self, deadline: float | None) -> Delivery | None:
        """The next Delivery, polling until one is pending or the deadline passes; raises what is pending."""
        while not self._pending:
            if self._link.failed is not None:
                raise self._link.failed
            wait = TICK_S if deadline is None else min(TICK_S, deadline - time.monotonic())
            self.poll(max(wait, 0.0))  # timeout=0 still takes in what has arrived
            if wait <= 0:
                break
        if not self._pending:
            return None
        item = self._pending.popleft()
        if isinstance(item, Exception):
            raise item
        return item

    def update(self, timeout: float = 0.0) -> int:
        """Take every record that arrives within `timeout` seconds (0: what has arrived) into `view`; return
        how many. For applications that want the current values rather than each record."""
        if self.view is None:
            raise ValueError("update() keeps `view` current: create the Subscriber with view=True")
        self._check_open()
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
        """The reconciler's state (gateway.reconcile.State), or "STARTING" until the start is known."""
        return "STARTING" if self._reconciler is None else self._reconciler.state.name

    @property
    def reconciler(self) -> R.Reconciler | None:
        """The reconciler, for its counters (None until the start is known)."""
        return self._reconciler

    @property
    def replay_state(self) -> str:
        """Where replay stands: "connecting", "ready", "retrying" or "failed" (gateway.client.link_state)."""
        return self._link.state.value

    @property
    def failed(self) -> ReplayRefused | None:
        """The final replay failure, raised at every call once what came before it is handed out."""
        return self._link.failed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def replay_endpoint(self) -> str | None:
        """The replay sidecar in use, or next to try (None until one is known)."""
        return self._link.endpoint

    @property
    def waiting_for_replay(self) -> float | None:
        """Seconds the subscriber has been waiting for a replay sidecar to answer (retries included); None
        while one answers, or while replay is not needed."""
        return self._link.waiting

    @property
    def head(self) -> int:
        """The highest sequence known to exist (0 until the start is known)."""
        return 0 if self._reconciler is None else self._reconciler.head

    @property
    def lag(self) -> int:
        return 0 if self._reconciler is None else self._reconciler.lag

    def pgm_counters(self) -> dict[str, dict[str, int]]:
        """OpenPGM's own counters, per feed name, of the feeds read through gateway.transport.pgm (repairs,
        resets, lost, junk, overruns: `ReceiverStats`); none for libzmq's engine, which exposes none. The
        receivers' I/O threads update them; a read is a snapshot."""
        return self._intake.pgm_counters()

    def summary(self) -> dict[str, int]:
        if self._intake.drain is not None:
            self.stats.feed_dropped = self._intake.drain.dropped
        if (datagrams := self._link.datagrams) is not None:
            self.stats.fill_datagrams = datagrams.stats.answers
            self.stats.fills_escalated = datagrams.stats.escalated
        return self.stats.summary(self._reconciler)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reconciler is not None:
            self._execute(self._reconciler.handle(R.Close(), time.monotonic()))
        if self._handed is not None:
            self._finished(self._handed)
        if self._checkpoint and self._position is not None:
            self._checkpoint.save(self._position, force=True)
        self._intake.close()
        self._link.close()
        if self._directory is not None and self._own_directory:
            self._directory.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop ---------------------------------------------------------------------------------------

    def pollables(self) -> list:
        """What an event loop should wait on instead of calling `poll` (sockets and file-like objects): with a
        drain, its queue instead of the feeds (call `away()` before awaiting, so that its thread reads them
        meanwhile)."""
        self._sync_poller()
        if self._intake.drain is None:
            return [sock for sock, _ in self._poller.sockets]
        feeds = self._intake.feeds
        return [self._intake.drain, *(sock for sock, _ in self._poller.sockets if sock not in feeds)]

    def away(self) -> None:
        """The application is about to await (not call) for a while: the drain's thread reads the feeds now."""
        if self._intake.drain is not None:
            self._intake.drain.away()

    def _sync_poller(self) -> None:
        polled = self._link.pollables()
        if polled != self._polled_link:  # connections come and go; the feeds stay registered
            for sock in self._polled_link:
                self._poller.unregister(sock)
            for sock in polled:
                self._poller.register(sock, zmq.POLLIN)
            self._polled_link = polled
            self._link_keys = tuple(map(reported_as, polled))

    def poll(self, timeout: float) -> None:
        """Wait up to `timeout` for input, feed it all to the reconciler, carry out its actions."""
        with self._intake.holding():  # the feeds are ours for this turn
            self._turn(timeout)

    def _turn(self, timeout: float) -> None:
        """Take in what arrives within `timeout`, then the chores: the replay link's turn and the reconciler's
        Tick. A turn whose multicast handed records out, with nothing from replay or the directory, leaves its
        chores to the start of the next turn (the application's next call): the records reach the application
        before them (docs/benchmarks.md, "Sub-hops"), and the chores still run once per turn."""
        self._now = time.monotonic()
        if self._chores_owed:
            self._chores_owed = False
            self._chores({}, self._now)
        self._sync_poller()
        queued = self._intake.take_queued()
        direct = queued is not False  # read the feeds themselves: not while older messages are queued
        if queued is not None:
            timeout = 0.0  # hand out what was taken at once
        datagrams = self._link.datagrams
        due = datagrams.hedge.next_due() if datagrams is not None else None
        if due is not None:  # a datagram's timer: wake for it (rounded up, so a due timer is not polled at 0)
            timeout = min(timeout, max(0.0, due - time.monotonic()) + 0.0005)
        if self._poller.sockets:
            ready = dict(self._poller.poll(math.ceil(timeout * 1000)))
        else:  # nothing to wait on (replay only, between tries): sleep, never spin
            time.sleep(timeout)
            ready = {}
        self._now = now = time.monotonic()
        pending = len(self._pending)
        if direct:
            self._intake.read(ready)
        quiet = not any(key in ready for key in (*self._link_keys, self._directory))  # nothing but multicast
        if len(self._pending) > pending and quiet:
            self._chores_owed = True
            return
        self._chores(ready, now)

    def _chores(self, ready: dict[Any, int], now: float) -> None:
        if self._directory is not None and self._directory in ready:
            self._directory.drain()
            self._link.follow_directory(now)
        self._link.turn(ready, now)
        if self._reconciler is not None:
            self._tell_servers()
            self._feed(R.Tick())

    # --- the reconciler ---------------------------------------------------------------------------------

    def _feed(self, event: R.Event) -> None:
        """One event to the reconciler and its actions carried out; an event handed on while earlier actions
        are carried out (a failed request's ReplayLost) waits until they are done: never re-entered."""
        if self._reconciler is None:
            return  # before the start is known, replay covers what passes now
        self._inbox.append(event)
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._inbox:
                self._execute(self._reconciler.handle(self._inbox.popleft(), self._now))
        finally:
            self._feeding = False

    def _execute(self, actions: list[R.Action]) -> None:
        for action in actions:
            match action:
                case R.Emit(batch=batch, lo=lo, hi=hi, source=source):
                    self._deliver(cast(B.Batch, batch), lo, hi, source)  # the batches fed to the reconciler
                case R.Request():
                    self._link.request(action)
                case R.Cancel(request_id=rid):
                    self._link.cancel(rid)
                case R.Loss(lo=lo, hi=hi, reason=reason):
                    self.stats.losses += hi - lo + 1
                    log.warning("records %d..%d of %s are lost: %s", lo, hi, self.stream, reason)
                    self._pending.append(DataLoss(lo, hi, reason))
                case R.NoProgress(short=short):
                    self._link.no_progress(self._now, short=short)
                case R.Stalled(lo=lo, hi=hi, attempts=attempts):
                    log.warning("replay of %s..%s made no progress after %d attempts; still trying", lo, hi, attempts)
                case R.LagExceeded(lag=lag):
                    self._pending.append(SlowConsumer(f"the application is {lag} records behind the live feed"))
                case R.StateChanged(old=old, new=new):
                    self.stats.states.append(new.name)
                    # a gap and its fill (MERGED <-> RECOVERING) are routine, hundreds a second under loss
                    level = logging.DEBUG if {old, new} == _GAP_CYCLE else logging.INFO
                    log.log(level, "%s: %s", self.stream, new.name)

    def _deliver(self, batch: B.Batch, lo: int, hi: int, source: str) -> None:
        delivery = Delivery(batch, lo, hi, source, self._prefixes)
        # Dense and unfiltered (every live batch, and replay without topics): the count needs no walk.
        n = hi - lo + 1 if batch.dense and not self._prefixes else sum(1 for _ in delivery.raw())
        if n:
            self._pending.append(delivery)
        if source.startswith("live"):
            self.stats.from_live += n
        elif source == "snapshot":
            self.stats.from_snapshot += n
        else:
            self.stats.from_replay += n
        if not n and not self._pending and self._current is None:
            self._finished(hi)  # a range with nothing for this client still moves the checkpoint

    def _finished(self, seq: int) -> None:
        self._position = seq
        if self._checkpoint:
            self._checkpoint.save(seq)

    # --- the start ----------------------------------------------------------------------------------------

    def _started(self, after_head_or_time: int) -> None:
        """The start probe's answer: the head + 1 (or the first since the time asked for)."""
        first = max(1, after_head_or_time - self._back)
        log.info("%s: starting at sequence %d", self.stream, first)
        self._begin(R.Start.at_seq(first))

    def _begin(self, begin: R.Start) -> None:
        self._reconciler = R.Reconciler(begin, **self._options)  # type: ignore[arg-type]
        self._tell_servers()
        self._feed(R.Tick())

    def _tell_servers(self) -> None:
        """ReplayServers to the reconciler at the start and whenever the sidecars to try change in number (learnt
        from heartbeats, named by a directory): with several, a fill that hears nothing moves on quickly."""
        if (count := self._link.servers) != self._servers_told:
            self._servers_told = count
            self._feed(R.ReplayServers(count))
