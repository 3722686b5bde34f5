"""ReplayClient: the ZEPS client of the replay sidecar, with credit managed for the caller; history() on top.

The client attaches to a stream, asks for the extensions it wants (by default batch, range and time), and
hands the caller what the server streams: journal batches (with their coverage), single DELIVERs from a
plain server, FETCH-END and TRIMMED. It answers the server's PINGs itself, and grants credit as the caller
consumes: `window` bytes up front, topped up whenever half of it has been taken out of recv(). So a caller
that stops calling recv() stops the server after at most one window, and nothing piles up anywhere.

history() is `zeps history`: the records of a sequence or time range, ending at the journal's head;
snapshot() is `zeps snapshot`: the last record of every key (docs/snapshots.md).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import TypeVar

import zmq

from gateway.errors import NotGranted, ReplayError
from gateway.transport.curve import CurveClientKeys, Handshake
from gateway.wire import batch as B
from gateway.wire import protocol as P

log = logging.getLogger(__name__)
_Answer = TypeVar("_Answer", bound=P.Command)  # the command a request waits for

DEFAULT_FEATURES = (P.FEATURE_BATCH, P.FEATURE_RANGE, P.FEATURE_TIME)

# Why a `zeps replay` would not grant an extension, where that has a reason of its own.
_NOT_GRANTED_FIX = {P.FEATURE_SNAPSHOT: "that sidecar runs with --no-snapshots; restart it without that option"}

Event = B.Batch | P.Deliver | P.FetchEnd | P.Trimmed | P.SnapshotEnd


class ReplayClient:
    """One session with a replay server. Not thread-safe; use one per thread."""

    def __init__(
        self,
        endpoint: str,
        stream: str,
        *,
        features: tuple[str, ...] = DEFAULT_FEATURES,
        window: int = 4 << 20,
        timeout: float = 10.0,
        curve: CurveClientKeys | None = None,
        ctx: zmq.Context | None = None,
    ) -> None:
        P.validate_stream_name(stream)
        self.endpoint = endpoint
        self.stream = stream
        self.window = window
        self.timeout = timeout
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(self.sock)
        self.handshake = Handshake(self.sock)  # explains a server that stays silent (CURVE refusals)
        self.sock.connect(endpoint)
        self._early: deque[tuple[P.Command, int]] = deque()  # stream frames that came while awaiting an answer
        self._window_open = False  # the initial window has been granted
        self._consumed = 0  # bytes consumed since the last grant
        self._next_request = 1
        self.features: frozenset[str] = frozenset()  # what the server granted
        try:
            self._send(P.Attach(P.PROTOCOL, P.VERSION, stream))
            self._expect(P.AttachOk, f"ATTACH to stream {stream!r}")
            self.handshake.close()  # answered: the monitor is no longer needed
            if features:
                self._send(P.Extend(features))
                ok = self._expect(P.ExtendOk, "EXTEND", invalid_ok=True)
                self.features = frozenset(ok.features) if ok else frozenset()
        except BaseException:
            self.handshake.close()
            self.sock.close()
            raise

    # --- requests -------------------------------------------------------------------------------------

    def subscribe(self, pattern: str = "", latest: int = 0) -> None:
        """Every record after `latest` (0: from the first retained) whose key starts with `pattern`, then live."""
        self._send(P.Subscribe(pattern, latest))
        self._expect(P.SubscribeOk, "SUBSCRIBE")
        self._open_credit()

    def subscribe_time(self, pattern: str, since_ns: int) -> None:
        """Like subscribe(), from the first batch journaled at or after `since_ns` (needs 'time')."""
        self.require(P.FEATURE_TIME)
        self._send(P.SubscribeTime(pattern, since_ns))
        self._expect(P.SubscribeOk, "SUBSCRIBE-TIME")
        self._open_credit()

    def fetch(self, first: int, last: int = B.MAX_SEQ, pattern: str = "") -> int:
        """Ask for first..last (needs 'range'); returns the request id its FETCH-END will carry."""
        self.require(P.FEATURE_RANGE)
        rid = self._next_request
        self._next_request += 1
        self._send(P.Fetch(rid, pattern, first, last))
        self._open_credit()
        return rid

    def snapshot(self, prefixes: tuple[str, ...] = ()) -> None:
        """The last record of every key under `prefixes` (all keys: none) as of one sequence N, as batches
        covering up to N, then SNAPSHOT-END(N) (needs 'snapshot'); follow with subscribe(latest=N)."""
        self.require(P.FEATURE_SNAPSHOT)
        self._send(P.Snapshot(tuple(prefixes)))
        self._open_credit()

    # --- receiving ------------------------------------------------------------------------------------

    def recv(self, timeout: float | None = None) -> Event | None:
        """The next batch, DELIVER, FETCH-END, TRIMMED or SNAPSHOT-END; None if nothing came within `timeout` s.

        Raises ReplayError for INVALID or a DETACH from the server.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            got = self._early.popleft() if self._early else self._recv_until(deadline)
            if got is None:
                return None
            event = self._handle(*got)
            if event is not None:
                return event

    def events(self, idle_timeout: float | None = None) -> Iterator[Event]:
        """recv() until nothing comes for `idle_timeout` seconds (the client's timeout by default)."""
        while (event := self.recv(idle_timeout)) is not None:
            yield event

    def _handle(self, cmd: P.Command, size: int) -> Event | None:
        """React to one frame of `size` bytes; the event for the caller, if it is one."""
        match cmd:
            case P.DeliverBatch(batch=raw):
                self._consume(size)
                try:
                    return B.Batch.parse(raw)
                except B.BatchError as exc:
                    raise ReplayError(f"server sent a damaged batch: {exc.reason}") from None
            case P.Deliver():
                self._consume(size)
                return cmd
            case P.FetchEnd() | P.Trimmed() | P.SnapshotEnd():
                return cmd
            case P.Ping():
                self._send(P.PingOk())
            case P.Invalid(reason=reason):
                raise ReplayError(f"replay server at {self.endpoint}: {reason}")
            case P.Detach():
                raise ReplayError(
                    f"replay server at {self.endpoint} ended the session (shutting down, or we were silent "
                    "longer than its client timeout): reconnect and resume from the last sequence received"
                )
        return None

    # --- credit ---------------------------------------------------------------------------------------

    def _open_credit(self) -> None:
        """Initial credit is 0: grant the window once the first request is out."""
        if not self._window_open:
            self._window_open = True
            self._grant(self.window)

    def _consume(self, nbytes: int) -> None:
        self._consumed += nbytes
        if self._consumed >= self.window // 2:
            self._grant(self._consumed)

    def _grant(self, nbytes: int) -> None:
        self._send(P.Credit(nbytes))
        self._consumed = 0

    # --- plumbing -------------------------------------------------------------------------------------

    def require(self, feature: str) -> None:
        """NotGranted (a ReplayError saying what to do) unless the server granted `feature`."""
        if feature not in self.features:
            fix = _NOT_GRANTED_FIX.get(feature, "use a server that speaks it (zeps replay)")
            raise NotGranted(
                f"the replay server at {self.endpoint} did not grant the '{feature}' extension "
                f"(granted: {', '.join(sorted(self.features)) or 'none'}): {fix}"
            )

    def _send(self, cmd: P.Command) -> None:
        self.sock.send(P.encode(cmd))

    def _recv_until(self, deadline: float) -> tuple[P.Command, int] | None:
        """The next command and its frame size, or None at the deadline."""
        try:
            frame = self.sock.recv(zmq.NOBLOCK)  # while frames stream in, skip the poll
        except zmq.Again:
            if not self.handshake.poll(deadline - time.monotonic()):
                return None
            frame = self.sock.recv()
        try:
            return P.decode(frame), len(frame)
        except P.ProtocolError as exc:
            raise ReplayError(f"replay server at {self.endpoint} sent a frame this client cannot read: {exc}") from None

    def _expect(self, kind: type[_Answer], what: str, *, invalid_ok: bool = False) -> _Answer | None:
        """Wait for the answer to a request, keeping stream frames that arrive first for recv()."""
        deadline = time.monotonic() + self.timeout
        while (got := self._recv_until(deadline)) is not None:
            cmd = got[0]
            if isinstance(cmd, kind):
                return cmd
            if isinstance(cmd, P.Invalid):
                if invalid_ok:
                    return None
                raise ReplayError(f"{what} refused by {self.endpoint}: {cmd.reason}")
            if isinstance(cmd, P.Ping):
                self._send(P.PingOk())
            else:
                self._early.append(got)
        why = self.handshake.explain() or f"no answer within {self.timeout} s; is `zeps replay` running there?"
        raise ReplayError(f"{what} at {self.endpoint}: {why}")

    def close(self) -> None:
        """DETACH (waiting briefly for DETACH-OK, so the server frees the session now), then close."""
        try:
            self._send(P.Detach())
            deadline = time.monotonic() + min(self.timeout, 1.0)
            while (got := self._recv_until(deadline)) is not None and not isinstance(got[0], P.DetachOk):
                pass
        except (zmq.ZMQError, ReplayError):
            pass  # closing anyway
        finally:
            self.sock.close()

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def history(
    endpoint: str,
    stream: str,
    *,
    first: int = 0,
    since_ns: int | None = None,
    last: int = B.MAX_SEQ,
    pattern: str = "",
    timeout: float = 10.0,
    curve: CurveClientKeys | None = None,
) -> Iterator[B.Record]:
    """The records of `stream` from `first` (0: the first retained) or from journal time `since_ns`, up to
    `last` or the journal's head when the request is served, whichever comes first.

    How the end is known: by sequence, this is one FETCH first..last, and the server ends a FETCH at the head
    with FETCH-END. By time, a FETCH beyond any sequence answers with the head alone, and a FETCH of the head
    with its journal time (nothing to do if that is before since_ns); the records then come from
    SUBSCRIBE-TIME, up to the batch whose coverage reaches the head.
    """
    with ReplayClient(endpoint, stream, timeout=timeout, curve=curve) as client:
        client.require(P.FEATURE_BATCH)
        if since_ns is None:
            client.fetch(first, last, pattern)
            yield from _records_until(client, lambda event: isinstance(event, P.FetchEnd))
            return
        client.require(P.FEATURE_TIME)
        head = probe(client, B.MAX_SEQ)[0].last
        stop = min(last, head)
        if stop < 1 or (probe(client, head)[1] or 0) < since_ns:
            return
        client.subscribe_time(pattern, since_ns)
        yield from _records_until(client, lambda event: isinstance(event, B.Batch) and event.last_seq >= stop, stop)


def snapshot(
    endpoint: str,
    stream: str,
    *,
    prefixes: tuple[str, ...] = (),
    timeout: float = 10.0,
    curve: CurveClientKeys | None = None,
) -> Generator[B.Record, None, int]:
    """The last record of every key of `stream` under `prefixes`, in sequence order, as of one sequence N (the
    generator's return value). Deleted keys are absent, and so are records whose TTL had run out."""
    features = (*DEFAULT_FEATURES, P.FEATURE_SNAPSHOT)
    with ReplayClient(endpoint, stream, features=features, timeout=timeout, curve=curve) as client:
        client.snapshot(prefixes)
        end = yield from _records_until(client, lambda event: isinstance(event, P.SnapshotEnd))
        assert isinstance(end, P.SnapshotEnd)  # what is_end accepted
        return end.last


def _records_until(
    client: ReplayClient, is_end: Callable[[Event], bool], stop: int = B.MAX_SEQ
) -> Generator[B.Record, None, Event]:
    """Records of the events up to the one `is_end` accepts, which is the return value."""
    while True:
        event = client.recv()
        if event is None:
            raise ReplayError(f"replay server at {client.endpoint} sent nothing for {client.timeout} s")
        if isinstance(event, P.Trimmed):
            log.warning(
                "sequences %d..%d are no longer in the journal; continuing at %d",
                event.requested,
                event.first_retained - 1,
                event.first_retained,
            )
        elif isinstance(event, B.Batch):
            yield from event.records(hi=stop)
        if is_end(event):
            return event


def probe(client: ReplayClient, seq: int) -> tuple[P.FetchEnd, int | None]:
    """FETCH seq..seq: its FETCH-END (whose last is the head when seq is beyond it, so MAX_SEQ asks for the
    head alone) and the journal time of the batch holding seq (None if there is none)."""
    rid = client.fetch(seq, seq)
    ts = None
    while (event := client.recv()) is not None:
        if isinstance(event, B.Batch):
            ts = event.ts_ns
        elif isinstance(event, P.FetchEnd) and event.request_id == rid:
            return event, ts
    raise ReplayError(f"FETCH {seq}: no FETCH-END from {client.endpoint} within {client.timeout} s")
