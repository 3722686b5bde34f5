"""ReplayClient: the ZEPS client of the replay sidecar, with credit managed for the caller; history() on top.

The client attaches to a stream, asks for the extensions it wants (by default batch, range and time), and
hands the caller what the server streams: journal batches (with their coverage), single DELIVERs from a
plain server, FETCH-END and TRIMMED. It answers the server's PINGs itself, and grants credit as the caller
consumes: `window` bytes up front, topped up whenever half of it has been taken out of recv(). So a caller
that stops calling recv() stops the server after at most one window, and nothing piles up anywhere.

Nothing here blocks unless the caller asks to wait. The constructor only connects and sends ATTACH; the
opening (ATTACH, then EXTEND: `gateway.client.opening`, the machine every client shares) is advanced by recv(),
within one deadline (`timeout`). It ends OPEN (`ready`), or recv() raises (a refusal, the deadline, an INVALID
or DETACH later on) and the client is spent.

Requests made before READY (and the features they `require`) wait in order and go out at READY, so a
caller may ask at once and read the answer (or NotGranted) from recv(). recv(0) never waits: a poll loop
calls it whenever `sock` is readable, and at least once per tick while `ready` is False, so that the
deadline and a CURVE refusal are noticed. Failures come in two kinds: `ReplayRefused` (unknown stream,
protocol version, CURVE keys, a corrupt journal at the server, a missing extension) is final; any other
`ReplayError` (no answer, a server restart, "retry later") is worth a new client after a backoff.

history() is `zeps history`: the records of a sequence or time range, ending at the journal's head;
snapshot() is `zeps snapshot`: the last record of every key (docs/snapshots.md). Both wait, for the
command line; the probes they use (`probing`, `heading`, `start_after`) are generators fed with events, so a poll
loop drives the same steps without waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import TypeVar

import zmq

from gateway.client.opening import Opening, Step, attach_failed
from gateway.errors import NotGranted, ReplayError, ReplayRefused
from gateway.transport.curve import CurveClientKeys, Handshake
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire.reasons import retries_later

log = logging.getLogger(__name__)
_Answer = TypeVar("_Answer", bound=P.Command)  # the command a request waits for

DEFAULT_FEATURES = (P.FEATURE_BATCH, P.FEATURE_RANGE, P.FEATURE_TIME)
SLICE_S = 0.05  # a waiting recv() looks at the handshake monitor this often
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000  # a server silent this long (even to ZMTP pings) is gone

# Why a `zeps replay` would not grant an extension, where that has a reason of its own.
_NOT_GRANTED_FIX = {
    P.FEATURE_SNAPSHOT: "that sidecar runs with --no-snapshots; restart it without that option",
    P.FEATURE_TAIL: "that sidecar runs with CURVE or --no-datagram-tail, or is older: the TCP copy carries the tail",
}

Event = B.Batch | P.Deliver | P.FetchEnd | P.Trimmed | P.SnapshotEnd
T = TypeVar("T")


class ReplayClient:
    """One session with a replay server. Not thread-safe; use one per thread.

    What the module's history() does, by hand:

        with ReplayClient("tcp://127.0.0.1:5571", "orders") as client:
            client.fetch(1, 100)
            while not isinstance(event := client.recv(), FetchEnd):
                if event is None:
                    raise TimeoutError("the sidecar went quiet")
                if isinstance(event, Batch):
                    for rec in event.records():
                        print(rec)

    (`FetchEnd` is gateway.wire.protocol's, `Batch` gateway.wire.batch's.)
    """

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
        fail_unreachable: bool = False,
        connect_timeout_ms: int = 0,
    ) -> None:
        """Connect and queue ATTACH; returns at once (the handshake is done by recv(), within `timeout` s).

        endpoint: the sidecar's tcp://HOST:PORT (`zeps replay --bind`). stream: the stream's name (raises
        ProtocolError for one the protocol cannot carry). features: the extensions to ask for, by name
        (`gateway.wire.protocol.FEATURES`; by default batch, range and time); what was granted is `features` once
        `ready`, and a request needing one not granted raises NotGranted. window: bytes of credit granted
        up front and topped up as recv() hands answers out: how much the server may send ahead of the caller.
        curve: CURVE client keys, for a sidecar that requires them. ctx: the ZeroMQ context (default: the
        process's shared one). `fail_unreachable`: raise ReplayError once a TCP connect fails (nothing
        listens), not at the deadline: for a caller with other servers to try, or with nothing to wait for.
        `connect_timeout_ms` (0: the kernel's): a TCP connect unanswered this long fails (with `fail_unreachable`,
        at once): for a caller with other servers to try (gateway.client.endpoints.CONNECT_TIMEOUT_MS)."""
        P.validate_stream_name(stream)
        self.endpoint = endpoint
        self.stream = stream
        self.window = window
        self.timeout = timeout
        self.wanted = features
        self.opening = Opening(stream, features, attach_s=timeout, extend_s=None)
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(self.sock)
        # ZMTP heartbeats end the connection to a server that stops answering (SIGSTOP, a dead host); the
        # monitor explains a silent handshake (CURVE refusals) and tells when a connection ends.
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        if connect_timeout_ms:
            self.sock.setsockopt(zmq.CONNECT_TIMEOUT, connect_timeout_ms)
        self.handshake = Handshake(self.sock, watch_drops=True, watch_connects=fail_unreachable)
        self.sock.connect(endpoint)
        self._queued: list[P.Command | str] = []  # requests (and required features) held until READY
        self._window_open = False  # the initial window has been granted
        self._consumed = 0  # bytes consumed since the last grant
        self._next_request = 1
        self.features: frozenset[str] = frozenset()  # what the server granted (known once ready)
        self._send_now(self.opening.start(time.monotonic()))

    @property
    def ready(self) -> bool:
        return self.opening.step is Step.OPEN

    @property
    def deadline(self) -> float:
        """Of the opening."""
        return self.opening.deadline

    # --- requests -------------------------------------------------------------------------------------

    def subscribe(self, pattern: str = "", latest: int = 0) -> None:
        """Every record after `latest` (0: from the first retained) whose key starts with `pattern`, then live."""
        self._send(P.Subscribe(pattern, latest))
        self._open_credit()

    def subscribe_time(self, pattern: str, since_ns: int) -> None:
        """Like subscribe(), from the first batch journaled at or after `since_ns` (needs 'time')."""
        self.require(P.FEATURE_TIME)
        self._send(P.SubscribeTime(pattern, since_ns))
        self._open_credit()

    def fetch(self, first: int, last: int = B.MAX_SEQ, pattern: str = "") -> int:
        """Ask for first..last (needs 'range'); returns the request id its FETCH-END will carry."""
        self.require(P.FEATURE_RANGE)
        rid = self._next_request
        self._next_request += 1
        self._send(P.Fetch(rid, pattern, first, last))
        self._open_credit()
        return rid

    def fetch_head(self, pattern: str = "") -> int:
        """Ask for the head (needs 'range'): a FETCH beyond any sequence, answered by FETCH-END alone, whose `last`
        is the head; returns its request id. Every caller asks a sidecar's head this way (`heading`, `ask_head`)."""
        return self.fetch(B.MAX_SEQ, B.MAX_SEQ, pattern)

    def snapshot(self, prefixes: tuple[str, ...] = ()) -> None:
        """The last record of every key under `prefixes` (all keys: none) as of one sequence N, as batches
        covering up to N, then SNAPSHOT-END(N) (needs 'snapshot'); follow with subscribe(latest=N)."""
        self.require(P.FEATURE_SNAPSHOT)
        self._send(P.Snapshot(tuple(prefixes)))
        self._open_credit()

    def tail_udp(self, port: int, token: int, mode: str) -> None:
        """Ask for the subscription's live tail as datagrams too, to UDP `port` at this client's address, each
        carrying `token`, with redundancy `mode` (needs 'datagram-tail'; gateway.wire.tail). Not answered."""
        self.require(P.FEATURE_TAIL)
        self._send(P.TailUdp(port, token, mode))

    # --- receiving ------------------------------------------------------------------------------------

    def recv(self, timeout: float | None = None) -> Event | None:
        """The next batch, DELIVER, FETCH-END, TRIMMED or SNAPSHOT-END; None if nothing came within `timeout` s
        (0: only what has arrived; None: the client's timeout).

        Raises ReplayRefused for a final refusal, ReplayError for anything worth retrying with a new client.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            got = self._recv_until(deadline)
            if got is None:
                return None
            event = self._handle(*got)
            if event is not None:
                return event

    def events(self, idle_timeout: float | None = None) -> Iterator[Event]:
        """recv() until nothing comes for `idle_timeout` seconds (the client's timeout by default)."""
        while (event := self.recv(idle_timeout)) is not None:
            yield event

    def wait_ready(self) -> None:
        """Wait for the handshake (until its deadline): for callers that check `features` before asking."""
        while not self.ready:
            if self.recv(SLICE_S) is not None:  # nothing is asked before READY, so nothing streams
                raise ReplayError(f"replay server at {self.endpoint} streamed before the handshake ended")

    def _handle(self, cmd: P.Command, size: int) -> Event | None:
        """React to one frame of `size` bytes; the event for the caller, if it is one."""
        if not self.ready:
            reply = self.opening.handle(cmd, time.monotonic())
            if reply is not None:
                self._send_now(reply.command)
            if self.opening.step is Step.REFUSED:
                self._refused(self.opening.reason, "ATTACH")
            if self.ready:
                self._become_ready()
            if self.opening.consumed:
                return None
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
                self._send_now(P.PingOk())
            case P.Invalid(reason=reason):
                self._refused(reason, "request")
            case P.Detach():
                raise ReplayError(
                    f"replay server at {self.endpoint} ended the session (shutting down, or we were silent "
                    "longer than its client timeout): reconnect and resume from the last sequence received"
                )
        return None  # SUBSCRIBE-OK, DETACH-OK: nothing for the caller

    def _refused(self, reason: str, what: str) -> None:
        text = f"replay server at {self.endpoint} refused {what} (stream {self.stream!r}): {reason}"
        if retries_later(reason):
            raise ReplayError(text)
        raise ReplayRefused(text)

    def _become_ready(self) -> None:
        self.features = self.opening.features
        queued, self._queued = self._queued, []
        for item in queued:
            if isinstance(item, str):
                self.require(item)
            else:
                self._send_now(item)

    def _check_link(self, now: float) -> None:
        """Raise if the connection has ended, or the handshake has failed for good (a CURVE refusal) or not
        ended by its deadline. A ZeroMQ socket would reconnect by itself, but to a server without our session."""
        why = self.handshake.explain()
        if why and (self.handshake.certainty > 0 or self.handshake.failed >= Handshake.CONCLUSIVE):
            raise ReplayRefused(f"replay server at {self.endpoint}: {why}")
        if self.handshake.dropped:
            raise ReplayError(f"the connection to the replay server at {self.endpoint} ended (server killed or silent)")
        if self.handshake.unreachable:
            raise ReplayError(
                f"nothing listens at {self.endpoint} (connection refused): is `zeps replay` running there? Check "
                "the endpoint too"
            )
        if self.opening.expired(now):
            why = why or f"no answer within {self.timeout:.3g} s; is `zeps replay` running there?"
            raise ReplayError(attach_failed(self.stream, self.endpoint, why))

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
        """NotGranted (a ReplayError saying what to do) unless the server granted `feature`; before the
        handshake has ended, the check waits with the requests and raises from recv()."""
        if not self.ready:
            self._queued.append(feature)
        elif feature not in self.features:
            fix = _NOT_GRANTED_FIX.get(feature, "use a server that speaks it (zeps replay)")
            raise NotGranted(
                f"the replay server at {self.endpoint} did not grant the '{feature}' extension "
                f"(granted: {', '.join(sorted(self.features)) or 'none'}): {fix}"
            )

    def _send(self, cmd: P.Command) -> None:
        if self.ready:
            self._send_now(cmd)
        else:
            self._queued.append(cmd)

    def _send_now(self, cmd: P.Command) -> None:
        try:
            self.sock.send(P.encode(cmd), zmq.NOBLOCK)
        except zmq.Again:  # a connected DEALER queues up to its HWM: full means the server is not reading
            raise ReplayError(f"replay server at {self.endpoint} is not reading what this client sends") from None

    def _recv_until(self, deadline: float) -> tuple[P.Command, int] | None:
        """The next command and its frame size, or None at the deadline; raises if the handshake failed."""
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
                break
            except zmq.Again:
                now = time.monotonic()
                self._check_link(now)
                left = deadline - now
                if left <= 0:
                    return None
                wait = left if self.ready else min(left, SLICE_S, max(self.deadline - now, 0.001))
                self.sock.poll(max(1, int(wait * 1000)))
        try:
            return P.decode(frame), len(frame)
        except P.ProtocolError as exc:
            raise ReplayError(f"replay server at {self.endpoint} sent a frame this client cannot read: {exc}") from None

    def close(self) -> None:
        """DETACH (sent after close, within half a second, so the server frees the session now) and close;
        never waits."""
        self.handshake.close()
        if self.sock.closed:
            return
        try:
            if self.ready:
                self.sock.send(P.encode(P.Detach()), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # closing anyway
        self.sock.close(linger=500)

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

    endpoint: the sidecar's tcp://HOST:PORT. pattern: only keys starting with it ("": every key). timeout:
    seconds to wait for the handshake and then for each answer. curve: CURVE client keys, for a sidecar that
    requires them. Yields gateway.wire.batch.Record objects (seq, ts_ns, key, body, ttl_ms), in order.

    Raises ReplayError when nothing listens at `endpoint` (at once: a one-shot read has nothing to wait for)
    or nothing answers within `timeout`; ReplayRefused (a ReplayError) when the server refuses the stream, the
    keys or a feature (NotGranted: not a replay sidecar); a TRIMMED part is logged as a warning and skipped.

        for rec in history("tcp://127.0.0.1:5571", "orders", first=1, last=100):
            print(rec.seq, rec.key, rec.body)

    How the end is known: by sequence, this is one FETCH first..last, and the server ends a FETCH at the head
    with FETCH-END. By time, a FETCH beyond any sequence answers with the head alone, and a FETCH of the head
    with its journal time (nothing to do if that is before since_ns); the records then come from
    SUBSCRIBE-TIME, up to the batch whose coverage reaches the head.
    """
    with ReplayClient(endpoint, stream, timeout=timeout, curve=curve, fail_unreachable=True) as client:
        client.require(P.FEATURE_BATCH)
        if since_ns is None:
            client.fetch(first, last, pattern)
            yield from _records_until(client, lambda event: isinstance(event, P.FetchEnd))
            return
        client.require(P.FEATURE_TIME)
        head = ask_head(client)
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
    generator's return value). Deleted keys are absent, and so are records whose TTL had run out.

    endpoint: the sidecar's tcp://HOST:PORT. prefixes: key prefixes (none: every key). timeout: seconds to wait
    for the handshake and then for each answer. curve: CURVE client keys, for a sidecar that requires them.
    Yields gateway.wire.batch.Record objects; raises as history() does (NotGranted: a sidecar that runs with
    --no-snapshots).

        records = snapshot("tcp://127.0.0.1:5571", "orders")
        last = {rec.key: rec.body for rec in records}
    """
    features = (*DEFAULT_FEATURES, P.FEATURE_SNAPSHOT)
    with ReplayClient(
        endpoint, stream, features=features, timeout=timeout, curve=curve, fail_unreachable=True
    ) as client:
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


def probing(client: ReplayClient, seq: int) -> Generator[None, Event, tuple[P.FetchEnd, int | None]]:
    """FETCH seq..seq, fed with the client's events: its FETCH-END (whose last is the head when seq is beyond
    it) and the journal time of the batch holding seq (None if there is none)."""
    return (yield from _answer(client.fetch(seq, seq)))


def heading(client: ReplayClient) -> Generator[None, Event, int]:
    """The sidecar's head (`ReplayClient.fetch_head`), fed with the client's events."""
    return (yield from _answer(client.fetch_head()))[0].last


def _answer(rid: int) -> Generator[None, Event, tuple[P.FetchEnd, int | None]]:
    """The FETCH-END of request `rid`, fed with the client's events, and the journal time of the last batch
    before it (None if there is none)."""
    ts = None
    while True:
        event = yield
        if isinstance(event, B.Batch):
            ts = event.ts_ns
        elif isinstance(event, P.FetchEnd) and event.request_id == rid:
            return event, ts


def start_after(client: ReplayClient, since_ns: int | None) -> Generator[None, Event, int]:
    """The first sequence to deliver, fed with the client's events: the head + 1 when since_ns is None (a
    subscriber without multicast at "latest"), else the first journaled at or after since_ns (the head + 1
    when there is none yet)."""
    head = yield from heading(client)
    if since_ns is None or head < 1 or ((yield from probing(client, head))[1] or 0) < since_ns:
        return head + 1
    client.subscribe_time("", since_ns)
    while True:
        event = yield
        if isinstance(event, B.Batch):
            return next((seq for seq, *_ in event.raw()), event.last_seq + 1)
        if isinstance(event, P.Deliver):
            return event.sequence


def drive(steps: Generator[None, Event, T], client: ReplayClient) -> T:
    """Run a probe to its end, waiting on `client` (at most its timeout for each event)."""
    try:
        next(steps)
        while True:
            event = client.recv()
            if event is None:
                raise ReplayError(f"replay server at {client.endpoint} sent nothing for {client.timeout} s")
            steps.send(event)
    except StopIteration as stop:
        return stop.value


def probe(client: ReplayClient, seq: int) -> tuple[P.FetchEnd, int | None]:
    """`probing`, waiting for each answer."""
    return drive(probing(client, seq), client)


def ask_head(client: ReplayClient) -> int:
    """`heading`, waiting for the answer: the head of the sidecar `client` is attached to."""
    return drive(heading(client), client)
