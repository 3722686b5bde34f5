"""The replay sidecar: serves the journal over ZEPS on a ROUTER socket, apart from the gateway's real-time path.

It is a separate process that only reads the journal files the gateway writes, so replay load (disk reads,
slow clients, a thousand late joiners at 9:00) never slows sequencing or multicast. One thread, one loop:

    drain commands (bounded) -> each client in turn: at most `frames_per_turn` frames, `reads_per_turn`
    journal reads and `turn_s` seconds (gateway.sidecar.session.Turn) -> timers: tail polls, pings, idle timeouts

Clients are Sessions (gateway.sidecar.session, sans-IO); this module owns the socket, the timers and the
metrics. Sends never block: the ROUTER has a bounded SNDHWM and ROUTER_MANDATORY, so a full pipe raises
EAGAIN, which means "this client is slow": it gets nothing more this turn and no one else waits for it.
A client at the journal's end is switched to the live tail. While any such client has credit, each stream
it reads is checked every `tail_poll_ms` with two stats (the directory, for new segments; the newest
segment's size, for appends; and, on a node of a replicated group, its committed mark, with a pread), and
only when one changed do that stream's tailing cursors read again. The poll is the backstop: each stream
being tailed is also watched with inotify (appends, segments created or replaced, the committed mark), whose
descriptor wakes the loop at once, so the live tail and a follower gateway's copy do not wait for the poll
(docs/replay.md, "The live tail"). On such a node the sidecar serves only
committed records (gateway.journal.committed; docs/ha.md, "Guarantees"), to subscriptions, fetches, fills
and snapshots alike.
Snapshot indexes (gateway.sidecar.snapshots) follow their journals on a timer of their own, in bounded slices.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from inotify_simple import INotify, flags

from gateway.discovery.announcer import Announcer, Discovery, journal_streams
from gateway.discovery.registrar import node_registrar
from gateway.errors import JournalCorrupt, JournalError, NotAJournal
from gateway.journal import JournalReader
from gateway.journal.committed import MarkReader, open_mark
from gateway.journal.layout import list_segments, seg_path
from gateway.sidecar.fills import FillAnswerer, FillLimits, FillPort
from gateway.sidecar.metrics import ReplayMetrics
from gateway.sidecar.session import Phase as SessionPhase
from gateway.sidecar.session import Session, Turn
from gateway.sidecar.snapshots import SnapshotIndexes
from gateway.sidecar.tail import TailLimits, TailSender
from gateway.transport.curve import CurveServerKeys, TcpGuard
from gateway.transport.routing import route
from gateway.wire import announce as A
from gateway.wire import batch as B
from gateway.wire import handshake as H
from gateway.wire import protocol as P
from gateway.wire.reasons import retry_later
from gateway.wire.streamkey import StreamKey

log = logging.getLogger(__name__)

_MAX_WAIT_S = 0.1  # longest poll: keeps stop() and signals prompt
_FULL_WAKE_S = 1.0  # every tailing cursor reads at least this often, whatever the change check said
# What changes a stream for its readers: an append or the committed mark (a write), a new segment, a cut
# segment replaced by rename, a deleted one.
_CHANGES = flags.MODIFY | flags.CREATE | flags.MOVED_TO | flags.DELETE


@dataclass
class ReplayConfig:
    """Everything `zeps replay` can be told."""

    journal: Path
    bind: str
    metrics: str | None = None
    client_timeout: float = 30.0  # drop a client silent this long; PING it after a third of it
    tail_poll_ms: float = 5.0
    sndhwm: int = 256  # frames queued per client in ZeroMQ before a send counts as "client slow"
    max_clients: int = 256
    max_fetches: int = 16  # outstanding FETCHes per client
    # ZMQ_MAXMSGSIZE: larger frames close the connection unread. Clients send only commands, the largest valid
    # one (EXTEND naming 255 features of 255 bytes) is 65,284 bytes.
    max_command_bytes: int = 65_536
    frames_per_turn: int = 256
    reads_per_turn: int = 8
    turn_s: float = 0.02  # nor a frame begun this long into a client's turn (5 ms cut `bench replay`'s rate ~20%)
    max_replies: int = 256  # answers queued for a client that sends commands but reads nothing
    curve: CurveServerKeys | None = None  # CURVE with allowed client keys; None: plain TCP
    snapshots: bool = True  # keep a last-value index per stream and grant 'snapshot' (docs/snapshots.md)
    snapshot_poll_s: float = 0.05  # how often snapshot indexes read what their journals gained
    snapshot_budget_s: float = 0.01  # index work per loop turn while an index catches up with its journal
    announce: Discovery | None = None  # announce this sidecar's streams and endpoint (discovery.announcer)
    stream_key: StreamKey | None = None  # signs the announcements, and fill datagrams (then required on requests)
    etcd: tuple[str, ...] = ()  # etcd client URLs: register in the directory beyond one subnet (discovery.registrar)
    # The fill port (gateway.sidecar.fills): UDP re-requests answered by datagrams. None: the TCP port's number;
    # 0: off. With CURVE it opens only with a stream key (datagrams would bypass CURVE's client keys).
    fill_udp: int | None = None
    fill_limits: FillLimits = field(default_factory=FillLimits)
    # TAIL-UDP (gateway.sidecar.tail): a session may ask for its live tail as datagrams to its own address too
    # (a site mirror across a WAN). Never granted with CURVE: the datagrams are not encrypted.
    datagram_tail: bool = True
    tail_limits: TailLimits = field(default_factory=TailLimits)

    def __post_init__(self) -> None:
        self.journal = Path(self.journal)
        if self.journal.exists() and not self.journal.is_dir():
            raise ValueError(f"journal root {self.journal} is not a directory: pass the gateway's --journal DIR")
        if self.client_timeout <= 0 or self.tail_poll_ms <= 0 or self.turn_s <= 0:
            raise ValueError("client timeout, tail poll interval and turn_s must be positive")
        if min(self.sndhwm, self.max_clients, self.max_fetches, self.frames_per_turn, self.reads_per_turn) < 1:
            raise ValueError("sndhwm, max_clients, max_fetches, frames_per_turn and reads_per_turn must be >= 1")
        if self.max_command_bytes < 1024:
            raise ValueError("max_command_bytes must be at least 1024: clients' ATTACH and FETCH must fit")


class _TailWatch:
    """Whether a stream may have grown since the last look, for the price of two stats.

    The newest segment's size changes with every append (one write() per batch); the directory's mtime
    changes when a segment is created or deleted, and only then is the directory listed again (and the
    committed mark looked for: a node of a group has one, which changes as its records are committed).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._mtime = -1
        self._newest: Path | None = None
        self._mark: MarkReader | None = None
        self._stamp: tuple[int, int, int | None] | None = None
        self.notify = _notifier(directory)  # None: the poll alone (inotify limits reached)

    def changed(self) -> bool:
        try:
            mtime = os.stat(self.directory).st_mtime_ns
            if mtime != self._mtime or self._newest is None:
                self._mtime = mtime
                segments = list_segments(self.directory)
                self._newest = seg_path(self.directory, segments[-1]) if segments else None
                if self._mark is not None:
                    self._mark.close()
                self._mark = open_mark(self.directory)
            mark = self._mark.read() if self._mark is not None else None
            stamp = (mtime, os.stat(self._newest).st_size if self._newest else 0, mark)
        except OSError:  # a segment deleted between listing and stat, or the stream removed: look again
            self._newest, stamp = None, None
        changed = stamp is None or stamp != self._stamp
        self._stamp = stamp
        return changed

    def drain(self) -> None:
        """Read the pending change events (their content does not matter: the stream changed)."""
        assert self.notify is not None
        with contextlib.suppress(BlockingIOError):
            while os.read(self.notify.fileno(), 1 << 16):
                pass

    def close(self) -> None:
        if self.notify is not None:
            self.notify.close()
        if self._mark is not None:
            self._mark.close()


def _notifier(directory: Path) -> INotify | None:
    """An inotify descriptor that becomes readable when `directory`'s journal changes; None if the system
    refuses one (fs.inotify.max_user_instances or max_user_watches reached): the tail poll still works."""
    notify = INotify(nonblocking=True)
    try:
        notify.add_watch(directory, _CHANGES)
    except OSError as exc:
        notify.close()
        log.warning("replay: no inotify watch on %s (%s): its live tail waits for --tail-poll-ms", directory, exc)
        return None
    return notify


class ReplayServer:
    """Serves every stream under `config.journal` (streams created later included) to ZEPS clients."""

    def __init__(self, config: ReplayConfig, *, ctx: zmq.Context | None = None) -> None:
        self.config = config
        self.metrics = ReplayMetrics(config.journal)
        self.sessions: dict[bytes, Session] = {}
        ctx = ctx or zmq.Context.instance()
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # full pipe -> EAGAIN (slow client), gone -> EHOSTUNREACH
        self.router.setsockopt(zmq.SNDHWM, config.sndhwm)
        self.router.setsockopt(zmq.MAXMSGSIZE, config.max_command_bytes)
        self.router.setsockopt(zmq.LINGER, 500)
        self.guard = TcpGuard(ctx, config.curve, self.metrics.rejected.labels("auth").inc)
        self.guard.secure(self.router, f"replay {config.bind}")
        self.router.bind(config.bind)
        self.endpoint: str = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()
        if config.metrics:
            self.metrics.serve(config.metrics)
        self._ping_after = config.client_timeout / 3
        self._next_tail = 0.0
        self._next_full_wake = 0.0
        self._tails: dict[str, _TailWatch] = {}
        self._poller = zmq.Poller()
        self._notified: dict[int, str] = {}  # inotify descriptor -> stream
        self._next_idle = 0.0
        self._turn = 0
        self._blocked: set[bytes] = set()  # clients whose pipe was full this turn
        self._tail_senders: dict[bytes, TailSender] = {}  # sessions that asked TAIL-UDP, by identity
        self._stopping = False
        self.snapshots = SnapshotIndexes(config.journal) if config.snapshots else None
        self._next_index = 0.0
        self._indexes_current = True
        self.announcer: Announcer | None = None
        if config.announce is not None and config.announce.interval_ms:
            self.announcer = Announcer(config.announce, A.SIDECAR, sidecar=self.endpoint, key=config.stream_key,
                                       errors=self.metrics.send_errors)  # fmt: skip
        discovery = config.announce or Discovery()
        self.registrar = node_registrar(config.etcd, discovery, discovery.interfaces, A.SIDECAR, sidecar=self.endpoint,
                                        key=config.stream_key, errors=self.metrics.send_errors)  # fmt: skip
        self.fill_port = self._open_fill_port()
        log.info("replay: serving %s at %s", config.journal, self.endpoint)
        # Start-up order does not matter: until the gateway creates the root, clients are told to retry later.
        self._root_missing = not config.journal.is_dir()
        if self._root_missing:
            log.warning("replay: %s does not exist yet: waiting for the gateway to create it", config.journal)

    def _open_fill_port(self) -> FillPort | None:
        config = self.config
        if config.fill_udp == 0:
            return None
        if config.curve is not None and config.stream_key is None:
            log.info("replay: no fill port: with CURVE it needs --stream-key (datagrams would bypass client keys)")
            return None
        host, _, port = self.endpoint.removeprefix("tcp://").rpartition(":")
        try:
            fill = FillPort(host, int(port) if config.fill_udp is None else config.fill_udp,
                            FillAnswerer(config.journal, config.fill_limits, config.stream_key),
                            errors=self.metrics.send_errors)  # fmt: skip
        except (OSError, ValueError) as exc:
            if config.fill_udp is not None:
                raise OSError(f"fill port udp:{host}:{config.fill_udp}: {exc}; choose another --fill-udp") from exc
            log.warning("replay: no fill port at udp:%s:%s (%s): subscribers fill over TCP", host, port, exc)
            return None
        fill.answerer.stats.exported = (self.metrics.fill_datagrams, self.metrics.fill_dropped)
        log.info("replay: fill datagrams at udp:%s:%d", *fill.address)
        return fill

    # --- the loop -------------------------------------------------------------------------------------

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Serve until `until()` is true or stop() is called; then tell clients and close."""
        poller = self._poller
        poller.register(self.router, zmq.POLLIN)
        fill_fd = self.fill_port.fileno() if self.fill_port is not None else None
        if fill_fd is not None:
            poller.register(fill_fd, zmq.POLLIN)  # a plain descriptor: poll() reports it by number
        try:
            while not (self._stopping or until()):
                wait = self._on_timers(time.monotonic())
                if any(s.ready and s.identity not in self._blocked for s in self.sessions.values()):
                    wait = 0.0
                elif self._blocked:
                    wait = min(wait, 0.001)  # a slow client's pipe drains without an event on our side
                if self._tail_senders:
                    wait = min(wait, self._tails_due(time.monotonic()))
                ready = dict(poller.poll(math.ceil(wait * 1000)))  # rounded up: a 0 ms poll would spin
                if fill_fd in ready:
                    assert self.fill_port is not None
                    self.fill_port.serve(time.monotonic())  # first: a fill waits for no replay session
                if self.router in ready:
                    self._drain()
                for fd, stream in self._notified.items():
                    if fd in ready:
                        self._changed(stream)
                if self._tail_senders:
                    self._pump_tails(time.monotonic())  # before the sessions' TCP: the datagrams are the fast copy
                self._serve()
        finally:
            self.close()

    def stop(self) -> None:
        self._stopping = True

    def _pump_tails(self, now: float) -> None:
        """Send what the datagram tails have new or due."""
        for identity, tail in list(self._tail_senders.items()):
            try:
                tail.pump(now)
            except Exception as exc:  # a broken journal ends this tail only; the session's TCP copy goes on
                log.warning("replay: the datagram tail to %s:%d stopped: %s", *tail.address, exc)
                self._tail_senders.pop(identity).close()

    def _tails_due(self, now: float) -> float:
        """Seconds until a tail's repeat or parity is due, or its journal is looked at again (the tail poll)."""
        wait = self.config.tail_poll_ms / 1000
        for tail in self._tail_senders.values():
            if (due := tail.next_due) is not None:
                wait = min(wait, max(0.0, due - now))
        return wait

    def _start_tail(self, s: Session, peer: str | None, now: float) -> None:
        """TAIL-UDP was accepted: datagrams to the session's own TCP peer address (never one named in the
        command), replacing any earlier tail of the session."""
        asked, s.tail_asked = s.tail_asked, None
        if asked is None:
            return
        if old := self._tail_senders.pop(s.identity, None):
            old.close()
        if not peer:
            log.warning("replay: %s asked TAIL-UDP but its peer address is unknown: no datagram tail", s)
            return
        port, token, redundancy = asked
        self._tail_senders[s.identity] = TailSender(s.journal, peer, port, token, redundancy, now,
                                                    self.config.tail_limits, self.metrics.send_errors)  # fmt: skip
        log.info("replay: %s: datagram tail (%s) to udp:%s:%d", s, redundancy, peer, port)

    def _on_timers(self, now: float) -> float:
        """Wake tailing clients, ping idle ones, drop silent ones; return seconds to the next timer."""
        if self.snapshots is not None and (now >= self._next_index or not self._indexes_current):
            # Indexes follow their journals; one that is behind (building) gets a slice of work every turn.
            self._next_index = now + self.config.snapshot_poll_s
            self._indexes_current = self.snapshots.follow(self.config.snapshot_budget_s)
            for stream, index in self.snapshots.indexes.items():
                self.metrics.stream(stream).snapshot_keys.set(len(index))
        if now >= self._next_tail:
            self._next_tail = now + self.config.tail_poll_ms / 1000
            self._wake_tails(now)
        if now >= self._next_idle:
            self._next_idle = now + min(1.0, self._ping_after / 2)
            self.metrics.update_sessions(self.sessions.values())
            if self.fill_port is not None:
                self.fill_port.answerer.forget_idle(now)
            for s in list(self.sessions.values()):
                silent = now - s.last_heard
                if silent > self.config.client_timeout:
                    log.info("replay: %s silent for %.1f s, dropped", s, silent)
                    self._end(s, "timeout", notify=True)
                elif now - max(s.last_heard, s.pinged_at) > self._ping_after:
                    s.ping(now)
        deadline = min(self._next_idle, now + _MAX_WAIT_S)
        if self.announcer is not None:
            if now >= self.announcer.due:
                self.announcer.announce(now, journal_streams(self.config.journal))
            deadline = min(deadline, self.announcer.due)
        if self.registrar is not None:
            if now >= self.registrar.due:
                self.registrar.register(now, journal_streams(self.config.journal))
            deadline = min(deadline, self.registrar.due)
        if any(s.tailing for s in self.sessions.values()):
            deadline = min(deadline, self._next_tail)
        if self.snapshots is not None:
            deadline = min(deadline, self._next_index if self._indexes_current else now)
        return max(0.0, deadline - now)

    def _wake_tails(self, now: float) -> None:
        """Let the cursors at the tail read again, on streams that changed (on all of them once a second)."""
        waiting: dict[str, list[Session]] = {}
        for s in self.sessions.values():
            if s.at_tail:
                waiting.setdefault(s.stream, []).append(s)
        if not any(s.tailing for group in waiting.values() for s in group):
            return  # nobody could take a record: look when credit comes
        full = now >= self._next_full_wake
        if full:
            self._next_full_wake = now + _FULL_WAKE_S
        for stream, group in waiting.items():
            if self._watch(stream).changed() or full:
                for s in group:
                    s.wake()

    def _watch(self, stream: str) -> _TailWatch:
        """The stream's watch, made when a client first attaches to it (its inotify registered with the loop)."""
        watch = self._tails.get(stream)
        if watch is None:
            watch = self._tails[stream] = _TailWatch(self.config.journal / stream)
            if watch.notify is not None:
                self._poller.register(watch.notify.fileno(), zmq.POLLIN)
                self._notified[watch.notify.fileno()] = stream
        return watch

    def _unwatch(self, stream: str) -> None:
        """No client reads `stream` any more: stop watching it, or every write to its journal would wake us (a
        follower gateway that caught up from here and went over to its leader's pushes left one behind)."""
        watch = self._tails.pop(stream, None)
        if watch is None:
            return
        if watch.notify is not None:
            self._poller.unregister(watch.notify.fileno())
            del self._notified[watch.notify.fileno()]
        watch.close()

    def _changed(self, stream: str) -> None:
        """inotify says `stream` changed: its cursors at the tail read again now, not at the next poll."""
        self._tails[stream].drain()
        for s in self.sessions.values():
            if s.stream == stream and s.at_tail:
                s.wake()

    # --- input ----------------------------------------------------------------------------------------

    def _drain(self, limit: int = 1024) -> None:
        now = time.monotonic()
        for _ in range(limit):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity, body = frames[0].bytes, [frame.bytes for frame in frames[1:]]
            if not body or not P.is_zeps(body[0]):
                self.metrics.rejected.labels("no-signature").inc()
                continue
            if len(body) != 1:
                self._invalid(identity, f"expected one command per message, got {len(body)} frames", "frames")
                continue
            try:
                cmd = P.decode(body[0])
            except P.ProtocolError as exc:
                self._invalid(identity, exc.reason, "decode")
                continue
            self._on_command(identity, cmd, now)
            if isinstance(cmd, P.TailUdp) and (session := self.sessions.get(identity)) is not None:
                self._start_tail(session, frames[1].get("Peer-Address"), now)

    def _on_command(self, identity: bytes, cmd: P.Command, now: float) -> None:
        """ATTACH opens the stream's journal here; a client without a session gets the handshake's answer; every
        other command is its Session's (gateway.sidecar.session, whose table holds the rules)."""
        session = self.sessions.get(identity)
        match cmd:
            case P.Attach(version=version, stream=stream):
                self._attach(identity, version, stream, now)
            case _ if session is None:
                answer = H.detached(cmd)  # the one handshake (gateway.wire.handshake)
                if isinstance(answer.reply, P.Invalid):
                    self._invalid(identity, answer.reply.reason, "state")
                else:
                    self._send_now(identity, P.encode(answer.reply))
            case _:
                try:
                    accepted = session.handle(cmd, now)
                except Exception as exc:  # the journal, asked for a position, may fail: this session only
                    self._fail(session, exc)
                    return
                if session.phase is SessionPhase.DETACHED:
                    self._end(session, "detach")
                    self._send_now(identity, P.encode(P.DetachOk()))
                    return
                if not accepted:
                    self.metrics.rejected.labels("command").inc()
                elif isinstance(cmd, P.Fetch) and cmd.first != B.MAX_SEQ:  # beyond every sequence: the head, no repair
                    self.metrics.stream(session.stream).fetches.inc()
                self._answer(session)

    def _attach(self, identity: bytes, version: int, stream: str, now: float) -> None:
        if (refusal := H.attach_refusal(version)) is not None:
            self._invalid(identity, refusal, "attach")
            return
        reader = self._reader(identity, stream)
        if reader is None:
            return
        old = self.sessions.pop(identity, None)
        if old is not None:
            old.close()  # a second ATTACH starts over
            if tail := self._tail_senders.pop(identity, None):
                tail.close()
        elif len(self.sessions) >= self.config.max_clients:
            self._invalid(identity, retry_later(f"too many clients (max {self.config.max_clients})"), "attach")
            return
        snapshots = self.snapshots.source(stream) if self.snapshots is not None else None
        offer_tail = self.config.datagram_tail and self.config.curve is None
        session = Session(identity, stream, reader, max_fetches=self.config.max_fetches, now=now, snapshots=snapshots,
                          tail=offer_tail)  # fmt: skip
        self._watch(stream)
        self.sessions[identity] = session
        self.metrics.update_sessions(self.sessions.values())
        log.debug("replay: %s attached", session)

    def _reader(self, identity: bytes, stream: str) -> JournalReader | None:
        """The stream's reader, looked up at every ATTACH so that streams created after start are found."""
        if self._root_missing:
            if not self.config.journal.is_dir():
                reason = retry_later(f"no journal at {self.config.journal} yet (the gateway creates it)")
                self._invalid(identity, reason, "attach")
                return None
            self._root_missing = False
            log.warning("replay: %s has appeared: serving it", self.config.journal)
        try:
            P.validate_stream_name(stream)
            return JournalReader(self.config.journal, stream, committed=True)
        except (P.ProtocolError, ValueError, NotAJournal):
            pass
        have = sorted(p.name for p in self.config.journal.iterdir() if p.is_dir())
        shown = ", ".join(have[:8]) + (", ..." if len(have) > 8 else "") if have else "none yet"
        reason = f"unknown stream {stream!r}; streams here: {shown} (a stream appears when the gateway opens it)"
        if not have:  # a gateway starting beside us has not opened its streams yet: start-up order must not matter
            reason = retry_later(reason)
        self._invalid(identity, reason, "attach")
        return None

    # --- output ---------------------------------------------------------------------------------------

    def _serve(self) -> None:
        """One turn: every ready client in round-robin order, each bounded in frames and journal reads."""
        order = list(self.sessions.values())
        if not order:
            self._blocked.clear()
            return
        self._turn = (self._turn + 1) % len(order)
        self._blocked.clear()
        for s in order[self._turn :] + order[: self._turn]:
            if s.identity in self.sessions and s.ready:
                self._serve_one(s)

    def _serve_one(self, s: Session) -> None:
        s.begin_turn(self.config.reads_per_turn)
        nbytes = records = stalls = 0
        turn = Turn(self.config.frames_per_turn, time.monotonic() + self.config.turn_s)
        while turn.allows(time.monotonic()):
            try:
                frame = s.peek()
            except Exception as exc:  # a broken journal or a bug ends this session only
                self._fail(s, exc)
                break
            if frame is None or not self._send(s, frame):
                break
            sent = s.pop()
            turn.served += 1
            nbytes += sent.data_bytes
            records += sent.records
            stalls += sent.credit_stall
        if nbytes:  # once per turn, not per record: a metric update costs as much as a send
            series = self.metrics.stream(s.stream)
            series.served_bytes.inc(nbytes)
            series.served_records.inc(records)
            series.credit_stalls.inc(stalls)

    def _send(self, s: Session, frame: bytes) -> bool:
        """Send without blocking; False if the client's pipe is full (slow client) or the client is gone."""
        outcome = route(self.router, s.identity, frame)
        if outcome == "unread":
            self.metrics.stream(s.stream).send_stalls.inc()
            self._blocked.add(s.identity)
        elif outcome == "gone":
            self._end(s, "disconnected")
        return outcome == "sent"

    def _answer(self, s: Session) -> None:
        """Send answers to commands at once, so that they queue only while the client's pipe is full; a client
        that lets `max_replies` of them pile up sends commands but reads nothing, and is dropped."""
        while s.replies and self._send(s, s.replies[0]):
            s.pop()
        if len(s.replies) > self.config.max_replies:
            log.warning("replay: %s sends commands but reads no answers; dropped", s)
            self._end(s, "not-reading")

    def _fail(self, s: Session, exc: Exception) -> None:
        if isinstance(exc, JournalError):
            log.error("replay: %s: %s", s, exc)
        else:
            log.exception("replay: %s failed", s)
        self._end(s, "error")
        # The whole message (a repair hint included) is in our log; a ZEPS reason holds 255 bytes, so the
        # client gets a short one that points there rather than a sentence cut mid-word.
        reason = f"{exc.path.name} byte {exc.offset}: {exc.reason}" if isinstance(exc, JournalCorrupt) else str(exc)
        what = "journal corrupt" if isinstance(exc, JournalCorrupt) else "replay failed"
        tail = "; the sidecar's log says more and how to repair it"
        self._send_now(s.identity, P.invalid(f"{what}: {reason[: P.MAX_STRING - len(what) - len(tail) - 2]}{tail}"))

    def _invalid(self, identity: bytes, reason: str, kind: str) -> None:
        self.metrics.rejected.labels(kind).inc()
        session = self.sessions.get(identity)
        if session is None:
            self._send_now(identity, P.invalid(reason))
        else:
            session.replies.append(P.invalid(reason))
            self._answer(session)

    def _send_now(self, identity: bytes, frame: bytes) -> None:
        """Best effort, for clients without a session: there is nowhere to queue, and nothing is owed."""
        with contextlib.suppress(zmq.ZMQError):
            self.router.send_multipart((identity, frame), zmq.NOBLOCK)

    def _end(self, s: Session, reason: str, *, notify: bool = False) -> None:
        if self.sessions.pop(s.identity, None) is None:
            return
        s.close()
        if tail := self._tail_senders.pop(s.identity, None):
            tail.close()
        if not any(other.stream == s.stream for other in self.sessions.values()):
            self._unwatch(s.stream)
        self.metrics.ended.labels(reason).inc()
        self.metrics.update_sessions(self.sessions.values())
        if notify:
            self._send_now(s.identity, P.encode(P.Detach()))

    def close(self) -> None:
        """Tell every client the server is going (DETACH), then close the socket and the metrics endpoint."""
        for s in list(self.sessions.values()):
            self._end(s, "shutdown", notify=True)
        self.guard.close()
        if self.snapshots is not None:
            self.snapshots.close()
        for watch in self._tails.values():
            watch.close()
        self.router.close()
        if self.fill_port is not None:
            self.fill_port.close()
        if self.announcer is not None:
            self.announcer.close()
        if self.registrar is not None:
            self.registrar.close()
        self.metrics.close()
