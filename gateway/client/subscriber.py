"""`Subscriber`: the dual-connection client. Multicast and replay in, one gap-free ordered stream out.

This is the IO half of `gateway.reconcile`: it owns the sockets and the clock, turns what arrives into
reconciler events, and carries out the actions the reconciler returns. All decisions are the
reconciler's; nothing here decides what the application sees.

Sockets, all driven by the caller's thread (no background threads):
- one SUB per multicast feed ("A", "B", ...), subscribed to the whole stream so every sequence is seen;
- replay, in two ZEPS connections so that every answer can be attributed to its request: the *catch-up*
  connection carries the one open-ended request (SUBSCRIBE: history, then the live tail; cancelling it is
  closing it) and the *fill* connection carries bounded gap fills (FETCH), which the sidecar answers in
  order, each closed by FETCH-END.

The replay endpoint may be given, or learnt from the multicast heartbeats. Records the application asked
not to see (topic prefixes) are filtered here; the reconciler still sees every sequence.

With a stream key, multicast that does not check out with it (a rogue sender, junk) never reaches the
reconciler: it is dropped and counted (`unauthenticated`). Replay connections use CURVE when given keys.

Loss the journal can no longer repair is never skipped in silence: iteration raises `DataLoss` naming the
range, and iterating again continues after it.

start="snapshot" begins with the last record of every key (docs/snapshots.md); `view` is then the
application's key -> value map, kept current as records are handed out (or by `update()`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal, cast

import zmq

from gateway import reconcile as R
from gateway.client.directory import Directory, resolve_feeds
from gateway.client.replay_client import DEFAULT_FEATURES, ReplayClient, probe
from gateway.client.snapshot_view import LastValues
from gateway.errors import DataLoss, McastError, NotGranted, ReplayError, SlowConsumer, UdpError, Unauthenticated
from gateway.mcast import Endpoint, McastReceiver, Tuning, open_sub
from gateway.transport.curve import CurveClientKeys
from gateway.wire import batch as B
from gateway.wire.heartbeat import Heartbeat, parse_payload
from gateway.wire.protocol import FEATURE_SNAPSHOT, FetchEnd
from gateway.wire.protocol import Deliver as ZepsDeliver
from gateway.wire.protocol import SnapshotEnd as ZepsSnapshotEnd
from gateway.wire.protocol import Trimmed as ZepsTrimmed
from gateway.wire.streamkey import StreamKey, Verifier

log = logging.getLogger(__name__)

TICK_S = 0.02
RECONNECT_S = 0.5


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
    states: list[str] = field(default_factory=list)

    @property
    def delivered(self) -> int:
        return self.from_live + self.from_replay + self.from_snapshot

    def summary(self, reconciler: R.Reconciler) -> dict[str, int]:
        s = reconciler.stats
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
        replay: str | None = None,
        topics: Sequence[str] = (),
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
        interface: str | None = None,
        directory: Directory | None = None,
        discovery_timeout: float = 3.0,
        ctx: zmq.Context | None = None,
    ) -> None:
        """`view`: keep `self.view`, the last value of every key (default: with start="snapshot").

        With neither `multicast` nor `replay`, the stream is found by name (gateway.client.directory): on the
        announcements heard on `interface` (or in `directory`) within `discovery_timeout` seconds; replay then
        goes where the directory says, and a sidecar that moves or dies is left for the one announced instead.
        """
        keys = [stream_key] if isinstance(stream_key, StreamKey) else list(stream_key)
        self.directory: Directory | None = None
        if not multicast and not replay:
            self.directory, multicast = resolve_feeds(stream, interface, directory, keys, discovery_timeout)
        self._own_directory = directory is None
        self.stream = stream
        self.ctx = ctx or zmq.Context.instance()
        self.topics = tuple(topics)
        self.prefixes = tuple(t.encode() for t in topics)
        self.pattern = topics[0] if len(topics) == 1 else ""
        self.replay_endpoint = replay
        self.replay_timeout = replay_timeout
        self.curve = curve
        # With a key (two while one is rotated), only multicast that checks out with it is let in.
        self.verifier = Verifier(stream, keys)
        self.stats = SubscriberStats()
        self.checkpoint = Checkpoint(Path(checkpoint)) if checkpoint else None
        self.feeds: dict[McastReceiver, str] = {}
        for i, text in enumerate(multicast):
            sock = open_sub(self.ctx, Endpoint.parse(text), tuning or Tuning(), [stream])
            self.feeds[sock] = chr(ord("A") + i)
        self._poller = zmq.Poller()
        for sock in self.feeds:
            self._poller.register(sock, zmq.POLLIN)
        if self.directory is not None:
            self._poller.register(self.directory, zmq.POLLIN)
        self._polled_replay: tuple[zmq.Socket, ...] = ()
        self.catchup: ReplayClient | None = None
        self.catchup_id: int | None = None
        self.fill: ReplayClient | None = None
        self.fills: deque[int] = deque()  # fill request ids in the order the sidecar answers them
        self.replay_up = True
        self.reconnect_at = 0.0
        # Deliveries are expanded into Received only as next() asks: no object per record on next_batch().
        self.pending: deque[Delivery | DataLoss | SlowConsumer] = deque()
        self._current: tuple[Delivery, Iterator[Received]] | None = None  # the Delivery next() is reading
        self.position: int | None = None  # last sequence the application has finished with
        self.handed: int | None = None  # the record the application holds now (finished at its next call)
        self.closed = False
        self.view = LastValues() if (start == "snapshot" if view is None else view) else None

        resume = self.checkpoint.load() if self.checkpoint else None
        begin, since_ns = (R.Start.after_seq(resume), None) if resume is not None else parse_start(start)
        if begin is None:
            assert since_ns is not None  # parse_start gives a time whenever it gives no start
            begin = R.Start.at_seq(self._seq_for_time(since_ns))
        self.reconciler = R.Reconciler(
            begin,
            key_filter_active=bool(self.prefixes),
            buffer_limit_bytes=buffer_limit_bytes,
            progress_timeout=progress_timeout,
            max_lag=max_lag,
            lag_policy=lag_policy,
        )
        self._execute(self.reconciler.handle(R.Tick(), time.monotonic()))

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
        return self.reconciler.state.name

    @property
    def lag(self) -> int:
        return self.reconciler.lag

    def summary(self) -> dict[str, int]:
        return self.stats.summary(self.reconciler)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._execute(self.reconciler.handle(R.Close(), time.monotonic()))
        if self.handed is not None:
            self._finished(self.handed)
        if self.checkpoint and self.position is not None:
            self.checkpoint.save(self.position, force=True)
        for sock in self.feeds:
            sock.close(linger=0)
        for client in (self.catchup, self.fill):
            if client is not None:
                client.close()
        if self.directory is not None and self._own_directory:
            self.directory.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop ---------------------------------------------------------------------------------------

    def pollables(self) -> list:
        """What `poll` waits on now (sockets and file-like objects), for an event loop to watch instead."""
        self._sync_poller()
        return [sock for sock, _ in self._poller.sockets]

    def _sync_poller(self) -> None:
        replay = tuple(c.sock for c in (self.catchup, self.fill) if c is not None)
        if replay != self._polled_replay:  # connections come and go; the feeds stay registered
            for sock in self._polled_replay:
                self._poller.unregister(sock)
            for sock in replay:
                self._poller.register(sock, zmq.POLLIN)
            self._polled_replay = replay

    def poll(self, timeout: float) -> None:
        """Wait up to `timeout` for input, feed it all to the reconciler, carry out its actions."""
        self._sync_poller()
        ready = dict(self._poller.poll(int(timeout * 1000)))
        now = time.monotonic()
        for sock, feed in self.feeds.items():
            if sock in ready:
                self._drain_feed(sock, feed, now)
        if self.directory is not None and self.directory in ready:
            self.directory.drain()
            self._follow_sidecar(now)
        if self.catchup is not None and self.catchup.sock in ready:
            self._drain_replay(self.catchup, now)
        if self.fill is not None and self.fill.sock in ready:
            self._drain_replay(self.fill, now)
        if not self.replay_up and now >= self.reconnect_at:
            self._reconnect(now)
        self._execute(self.reconciler.handle(R.Tick(), now))

    def _drain_feed(self, sock: McastReceiver, feed: str, now: float, limit: int = 256) -> None:
        name = self.stream.encode()
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
                if frames[0] != name:
                    continue  # another stream sharing the group and prefix
                item = parse_payload(self.verifier.open(frames))
            except zmq.Again:
                return
            except (McastError, UdpError) as exc:
                self.stats.rejected_packets += 1
                if isinstance(exc, Unauthenticated):
                    self.stats.unauthenticated += 1
                log.debug("feed %s: dropped a packet: %s", feed, exc)
                continue
            if isinstance(item, Heartbeat):
                if self.replay_endpoint is None and item.replay:
                    self.replay_endpoint = item.replay
                    log.info("replay sidecar found from heartbeats: %s", item.replay)
                self._execute(self.reconciler.handle(R.HeadSeen(item.head, feed), now))
            else:
                self._execute(self.reconciler.handle(R.Live(item, feed), now))

    def _drain_replay(self, client: ReplayClient, now: float) -> None:
        try:
            # An action may close this connection mid-drain (Cancel of the catch-up): then stop reading it.
            while client in (self.catchup, self.fill) and (event := client.recv(0)) is not None:
                self._on_replay(client, event, now)
        except ReplayError as exc:
            self._replay_lost(now, exc.reason)

    def _on_replay(self, client: ReplayClient, event, now: float) -> None:
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

    # --- actions ----------------------------------------------------------------------------------------

    def _execute(self, actions: list[R.Action]) -> None:
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
                case R.StateChanged(new=new):
                    self.stats.states.append(new.name)
                    log.info("%s: %s", self.stream, new.name)

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
                if self.fill is None:
                    self.fill = self._connect()
                self.fill.fetch(req.lo, req.hi, self.pattern)
                self.fills.append(req.request_id)
        except NotGranted:
            raise  # a server that cannot serve this (no snapshots): retrying will not help; the caller must know
        except ReplayError as exc:
            self._replay_lost(time.monotonic(), exc.reason)

    def _cancel(self, request_id: int) -> None:
        if request_id == self.catchup_id and self.catchup is not None:
            self.catchup.close()  # ZEPS has no unsubscribe: the connection was the subscription
            self.catchup, self.catchup_id = None, None
        # A FETCH cannot be recalled; its answer is bounded and the reconciler ignores what it no longer needs.

    def _connect(self) -> ReplayClient:
        info = self.directory.lookup(self.stream) if self.directory is not None else None
        if info is not None and info.sidecar and info.sidecar != self.replay_endpoint:
            log.info("%s: replay sidecar at %s (announced)", self.stream, info.sidecar)
            self.replay_endpoint = info.sidecar
        if self.replay_endpoint is None:
            raise ReplayError("no replay endpoint yet: give --replay, or wait for a heartbeat that names one")
        features = (*DEFAULT_FEATURES, FEATURE_SNAPSHOT)
        return ReplayClient(
            self.replay_endpoint,
            self.stream,
            features=features,
            timeout=self.replay_timeout,
            curve=self.curve,
            ctx=self.ctx,
        )

    def _follow_sidecar(self, now: float) -> None:
        """Leave a sidecar that no longer announces itself (killed, moved) for one that does: a connection to a
        dead one may never fail by itself."""
        assert self.directory is not None
        info = self.directory.lookup(self.stream)
        connected = self.catchup is not None or self.fill is not None
        if connected and info is not None and info.sidecars and self.replay_endpoint not in info.sidecars:
            self._replay_lost(now, f"{self.replay_endpoint} is no longer announced; {info.sidecar} is")

    def _replay_lost(self, now: float, reason: str) -> None:
        log.warning("replay connection lost (%s); reconnecting", reason)
        for client in (self.catchup, self.fill):
            if client is not None:
                client.close()
        self.catchup = self.fill = None
        self.catchup_id = None
        self.fills.clear()
        if self.replay_up:
            self.replay_up = False
            self._execute(self.reconciler.handle(R.ReplayLost(), now))
        self.reconnect_at = now + RECONNECT_S

    def _reconnect(self, now: float) -> None:
        try:
            self.fill = self._connect()
        except ReplayError:
            self.reconnect_at = now + RECONNECT_S
            return
        self.replay_up = True
        self.stats.replay_reconnects += 1
        self._execute(self.reconciler.handle(R.ReplayRestored(), now))

    def _seq_for_time(self, since_ns: int) -> int:
        """The first sequence journaled at or after `since_ns`, asked of the replay sidecar."""
        with self._connect() as client:
            client.subscribe_time("", since_ns)
            deadline = time.monotonic() + self.replay_timeout
            while time.monotonic() < deadline:
                event = client.recv(0.1)
                if isinstance(event, B.Batch):
                    return next((seq for seq, *_ in event.raw()), event.last_seq + 1)
                if isinstance(event, ZepsDeliver):
                    return event.sequence
            # Nothing journaled since then yet: start with the next record.
            return probe(client, B.MAX_SEQ)[0].last + 1
