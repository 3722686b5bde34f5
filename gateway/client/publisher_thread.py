"""The Publisher's IO thread: it moves bytes between the accumulator, the ingest session and one ZeroMQ socket.

It decides nothing. Smart batching falls out of its loop: each turn it takes everything queued, sends it, and
waits in poll (zero seconds when more is queued), which hands the GIL to the application; what the application
queued meanwhile is the next turn's batch. The application wakes it (an eventfd) only when it is about to wait
(`idle`): a thread that is busy looks at the queue before it waits again. Each turn it feeds the session what
happened (a command received, a drop its socket monitor saw, a refusal the CURVE handshake monitor explains, the
directory's new listing, or only time) and executes the
actions that come back (connect, send, disconnect, release budget); while the session is READY it hands it what
the accumulator has due. It never re-enters the session while executing its actions, and never blocks past the
session's or the accumulator's next deadline.

Threading contract: the socket, its monitors and the directory (once the constructor has resolved the stream) are
this thread's alone, so ZeroMQ's one-thread-per-socket rule holds; the application thread reaches it only
through `wake()` (an eventfd), `stop()` and the shared condition, which is notified after every turn that
changed what the application may wait for (state, counters, budget). The thread never calls the application.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import os
import threading
import time

import zmq

from gateway.client.accumulator import Accumulator
from gateway.client.directory import Directory
from gateway.client.ingest_session import (
    Close,
    Connect,
    Disconnect,
    Dropped,
    Event,
    IngestSession,
    Listed,
    Publish,
    Received,
    Rejected,
    Release,
    Send,
    State,
    Tick,
)
from gateway.errors import PublishError
from gateway.transport.curve import CurveClientKeys, Handshake
from gateway.wire import protocol as P

log = logging.getLogger(__name__)

IDLE_S = 1.0  # the longest poll when nothing is due
_ids = itertools.count()  # monitor addresses


class Stop(enum.Enum):
    """Whether the thread is asked to stop, and how."""

    NOT_ASKED = "not asked"  # run
    AFTER_DELIVERY = "after delivery"  # DETACH once everything queued is delivered (or cannot be)
    AT_ONCE = "at once"  # no DETACH, nothing more delivered


class PublisherThread:
    def __init__(
        self,
        session: IngestSession,
        accumulator: Accumulator,
        *,
        directory: Directory | None,
        own_directory: bool,
        curve: CurveClientKeys | None,
        ctx: zmq.Context,
        timeout: float,
    ) -> None:
        self.session = session
        self.acc = accumulator
        self.cond = accumulator.cond
        self._directory = directory
        self._own_directory = own_directory
        self._curve = curve
        self._ctx = ctx
        self.timeout = timeout  # the Publisher's: a DETACH lingers this long, the flush at exit waits this long
        self.flush_wanted = False  # under cond
        self.stop_asked = Stop.NOT_ASKED  # under cond
        self.closed_error: PublishError | None = None  # set by stop(): what publish() raises from then on
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._handshake: Handshake | None = None
        self._several = False
        self.idle = False  # about to wait in poll: only then does a record queued need a wake-up
        self._unusable: Rejected | Dropped | None = None  # a connect that failed, for the session after its actions
        self._open_failed = False  # the last socket could not be opened (said once until one opens again)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=f"zeps-publisher-{session.stream}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def error(self) -> PublishError | None:
        return self.session.error or self.closed_error

    def wake(self) -> None:
        """No lock: the descriptor is closed only by stop() (the application's thread), once the thread ended."""
        if self._wake_fd >= 0:
            os.eventfd_write(self._wake_fd, 1)

    def stop(self, *, detach: bool, join_s: float | None) -> None:
        """Ask the thread to stop (after DETACH once everything is delivered, if `detach`); wait up to `join_s`
        (None: do not wait)."""
        with self.cond:
            if self.stop_asked is Stop.NOT_ASKED:
                self.stop_asked = Stop.AFTER_DELIVERY if detach else Stop.AT_ONCE
            if self.closed_error is None:
                self.closed_error = PublishError("this Publisher is closed: create a new one")
        self.wake()
        if join_s is not None:
            self._thread.join(join_s)
            if not self._thread.is_alive() and self._wake_fd >= 0:
                os.close(self._wake_fd)
                self._wake_fd = -1

    # --- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_fd, zmq.POLLIN)
        directory = self._directory
        if directory is not None:
            poller.register(directory, zmq.POLLIN)
            self._feed(self._listing())
        watched: tuple[zmq.Socket | None, zmq.Socket | None] = (None, None)
        try:
            while not self._finished():
                wait = self._turn()
                sock, monitor = self._sock, self._monitor
                if (sock, monitor) != watched:  # a new connection, or a new monitor on it
                    for old in watched:
                        if old is not None:
                            poller.unregister(old)
                    for new in (sock, monitor):
                        if new is not None:
                            poller.register(new, zmq.POLLIN)
                    watched = (sock, monitor)
                self.idle = True  # then look at the queue once more: a record queued since needs no wake-up
                if self.session.state is State.READY and (due := self.acc.due(time.monotonic())) is not None:
                    wait = min(wait, due)
                events = dict(poller.poll(max(0, math.ceil(wait * 1000))))
                self.idle = False
                if self._wake_fd in events:
                    os.eventfd_read(self._wake_fd)
                if directory is not None and directory in events:
                    directory.drain()
                    self._feed(self._listing())
                if sock is not None and sock in events:
                    self._receive()
                if monitor is not None and monitor in events and monitor is self._monitor:
                    self._drain_monitor()
        except BaseException as exc:  # a bug, not the network: make it visible to the application
            with self.cond:
                self.closed_error = PublishError(f"publisher IO thread failed: {exc!r}")
                self.cond.notify_all()
            raise
        finally:
            detach = self.stop_asked is Stop.AFTER_DELIVERY
            self._do(self.session.handle(Close(detach=detach), time.monotonic()))
            self._close_socket(linger=int(self.timeout * 1000) if detach else 0)
            if self._directory is not None and self._own_directory:
                self._directory.close()
            with self.cond:
                self.cond.notify_all()

    def _finished(self) -> bool:
        """Stopping, and (for a DETACH) nothing left to deliver, or no way to deliver it."""
        if self.stop_asked is Stop.NOT_ASKED:  # a stale read costs one turn: stop() wakes the thread after
            return False
        with self.cond:
            if self.stop_asked is Stop.AT_ONCE or self.session.state is State.FAILED:
                return True
            return not self.acc.queue and not (self.session.confirming and self.session.unconfirmed)

    def _turn(self) -> float:
        """Time, then what is due; seconds until the next deadline."""
        now = time.monotonic()
        if self._handshake is not None and self.session.state is State.OPENING:
            refused = self._refusal()
            if refused:
                self._feed(Rejected(refused))
            elif self._handshake.unreachable:
                self._feed(Dropped("nothing listens there"))
        if self._directory is not None and self.session.state is State.DOWN:
            self._feed(self._listing())  # entries expire without a word: attach where it lists now
        due = self.session.wait(now)
        if due is not None and due <= 0:
            self._feed(Tick())
        if self.session.state is State.READY:
            # flags: a stale read costs one turn at most
            hurry = self.flush_wanted or self.stop_asked is not Stop.NOT_ASKED
            batches = self.acc.take(now, hurry)
            for i, (records, payload, ttl) in enumerate(batches):
                if self.session.state is not State.READY:  # a batch's timers found the gateway stalled, say
                    self.acc.put_back(batches[i:])
                    break
                self._feed(Publish(records, payload, ttl), notify=False)
        with self.cond:
            if not self.acc.queue:
                self.flush_wanted = False
            self.cond.notify_all()
        waits = [w for w in (self.session.wait(now), self._accumulated(now), IDLE_S) if w is not None]
        if self.session.state is State.OPENING and self._handshake is not None:
            waits.append(Handshake.SLICE_S)  # its monitor explains a silent gateway
        return min(waits)

    def _accumulated(self, now: float) -> float | None:
        return self.acc.due(now) if self.session.state is State.READY else None

    def _feed(self, event: Event, *, notify: bool = True) -> None:
        self._do(self.session.handle(event, time.monotonic()))
        while self._unusable is not None:  # fed after the actions ran, never from inside them
            event, self._unusable = self._unusable, None
            self._do(self.session.handle(event, time.monotonic()))
        if notify:
            with self.cond:
                self.cond.notify_all()

    def _do(self, actions: list) -> None:
        for action in actions:
            match action:
                case Send(frame=frame) if self._sock is not None:  # None: its connect failed, the session learns next
                    # SNDHWM 0, yet Again while no connection is up (a handshake under way, or refused): a lost
                    # frame, which the opening's deadline or the confirm stall sends again. Copied: cheaper than
                    # zero-copy.
                    try:  # noqa: SIM105 (contextlib.suppress is three Python calls more on every batch's path)
                        self._sock.send(frame, zmq.NOBLOCK)
                    except zmq.Again:
                        pass
                case Release(nbytes=n):
                    self.acc.release(n)
                case Connect(
                    endpoint=endpoint, first=first, several=several, connect_timeout_ms=timeout, heartbeat_ms=heartbeat
                ):
                    self._connect(endpoint, first, several, timeout, heartbeat)
                case Disconnect():
                    self._close_socket(linger=0)

    def _listing(self) -> Listed:
        assert self._directory is not None
        info = self._directory.lookup(self.session.stream)
        if info is None or info.ingest is None or not info.ingests:
            return Listed((), 0)
        ingests = (info.ingest, *(i for i in info.ingests if i != info.ingest))
        return Listed(ingests, info.epoch)

    def _connect(
        self, endpoint: str, first: bool, several: bool, connect_timeout_ms: int, heartbeat: tuple[int, int]
    ) -> None:
        self._close_socket(linger=0)
        try:
            self._open(first, several, connect_timeout_ms, heartbeat)
        except zmq.ZMQError as exc:  # EMFILE, say, in a storm of reconnects: a connection to retry, not a dead thread
            self._close_socket(linger=0)
            if not self._open_failed:  # once per episode
                log.warning("publisher on %s: cannot open a ZeroMQ socket (%s): raise the open-files limit "
                            "(ulimit -n) or run fewer Publishers here; retrying", endpoint, exc.strerror)  # fmt: skip
            self._open_failed = True
            self._unusable = Dropped(f"cannot open a socket ({exc.strerror})")
            return
        if self._open_failed:
            log.info("publisher on %s: sockets open again", endpoint)
            self._open_failed = False
        assert self._sock is not None
        try:
            self._sock.connect(endpoint)
        except zmq.ZMQError as exc:  # checked at construction; one learnt from a directory may still be bad
            self._close_socket(linger=0)
            self._unusable = Rejected(f"cannot connect to {endpoint!r}: {exc.strerror}")

    def _open(self, first: bool, several: bool, connect_timeout_ms: int, heartbeat: tuple[int, int]) -> None:
        """A DEALER for the next connection (and the monitor of its handshake or of its drops) as `_sock`; ZMTP
        pings every `heartbeat`[0] ms, and a gateway that answers nothing for `heartbeat`[1] ms after one is gone
        (gateway.client.heartbeat)."""
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # bounded by buffer_bytes instead: a send never blocks or fails
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat[0])
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat[1])
        if several and connect_timeout_ms:
            sock.setsockopt(zmq.CONNECT_TIMEOUT, connect_timeout_ms)
        if self._curve is not None:
            self._curve.apply(sock)
        self._several = several
        if first:  # the first attach explains a silent gateway (CURVE refusals); one monitor per socket at a time
            try:
                self._handshake = Handshake(sock, watch_connects=self._several)
            except zmq.ZMQError:
                sock.close(linger=0)
                raise
        self._sock = sock  # from here on closed with its monitor by _close_socket
        if not first:
            self._watch_drops(sock)

    def _refusal(self) -> str | None:
        """During the first attach: why the gateway refused the handshake, once that is conclusive."""
        shake = self._handshake
        if shake is None or not shake.explain():
            return None
        return shake.failure if shake.certainty > 0 or shake.failed >= Handshake.CONCLUSIVE else None

    def _receive(self) -> None:
        # ZMQ_EVENTS, not Socket.poll(0), which builds a Poller each call: half the cost, once per confirm
        while self._sock is not None and int(self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                cmd = P.decode(self._sock.recv(zmq.NOBLOCK))
            except P.ProtocolError as exc:
                self._feed(Dropped(f"the gateway sent a bad frame ({exc.reason})"))
                return
            if self.session.state is State.OPENING and isinstance(cmd, P.AttachOk | P.ExtendOk):
                self._watch_after_handshake()
            self._feed(Received(cmd))

    def _watch_after_handshake(self) -> None:
        if self._handshake is not None and self._sock is not None:
            self._close_handshake()
            self._watch_drops(self._sock)

    def _watch_drops(self, sock: zmq.Socket) -> None:
        # A fresh address each time: an earlier monitor's may not be released yet (libzmq closes lazily).
        # With other endpoints to try, a connect that fails (nothing listens) counts as a drop.
        events = zmq.EVENT_DISCONNECTED | (zmq.EVENT_CONNECT_RETRIED if self._several else 0)
        self._monitor = sock.get_monitor_socket(events, f"inproc://zeps-pub-{next(_ids)}")

    def _drain_monitor(self) -> None:
        dropped = False
        while self._monitor is not None and self._monitor.poll(0):
            self._monitor.recv_multipart()
            dropped = True
        if dropped:
            self._receive()  # what the gateway answered before the drop still counts
            self._feed(Dropped("the connection dropped (or could not be made)"))

    def _close_handshake(self) -> None:
        if self._handshake is not None:
            self._handshake.close()
            self._handshake = None

    def _close_socket(self, linger: int) -> None:
        self._close_handshake()
        if self._monitor is not None:
            assert self._sock is not None
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
        if self._sock is not None:
            self._sock.close(linger=linger)
        self._sock = self._monitor = None
