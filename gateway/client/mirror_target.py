"""A session with the mirror site's gateway as the stream's mirror (docs/mirroring.md): MIRROR, batches, PROMOTE.

The opening is the shared ATTACH -> EXTEND machine (gateway.client.opening), asking for batch, confirm and
mirror. Then one request and its answer (MIRROR -> MIRROR-OK(head), PROMOTE -> PROMOTE-OK(head)), each within
`timeout_s`; after MIRROR-OK the session sends the source's batches as PUBLISH-BATCH and reads PUBLISH-OKs.

Failures come in two kinds, as for every client: `MirrorError` is final (the gateway is no mirror of this stream,
was promoted, grants no mirroring); `PublishError` is worth a new session after a backoff (no answer, a closed
connection, a node that is not the leader, a batch refused as not contiguous: the new session learns the head).
Not thread-safe: one thread owns it. Nothing waits past `timeout_s`.
"""

from __future__ import annotations

import time
from typing import TypeVar

import zmq

from gateway.client.opening import Opening, Step, attach_failed, sends_elsewhere
from gateway.errors import MirrorError, PublishError
from gateway.transport.curve import CurveClientKeys, Handshake
from gateway.wire import protocol as P

WANTED = (P.FEATURE_BATCH, P.FEATURE_CONFIRM, P.FEATURE_MIRROR)
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 500, 3000  # a gateway silent this long (even to ZMTP pings) is gone
SLICE_S = 0.05

_Answer = TypeVar("_Answer", bound=P.Command)


class MirrorTarget:
    """One session with a gateway's ingest, as the mirror of `stream` (the module docstring)."""

    def __init__(
        self,
        endpoint: str,
        stream: str,
        *,
        timeout_s: float = 5.0,
        curve: CurveClientKeys | None = None,
        ctx: zmq.Context | None = None,
    ) -> None:
        """Connect and send ATTACH; returns at once."""
        self.endpoint, self.stream, self.timeout_s = endpoint, stream, timeout_s
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        if curve is not None:
            curve.apply(self.sock)
        # A killed gateway, nothing listening, a CURVE refusal: known at once, not at the next deadline.
        self.handshake = Handshake(self.sock, watch_drops=True, watch_connects=True)
        self.sock.connect(endpoint)
        self.opening = Opening(stream, WANTED, attach_s=timeout_s, extend_s=None)
        self._send(self.opening.start(time.monotonic()))

    def mirror(self, source: str = "") -> P.MirrorOk:
        """MIRROR: the stream's head there (the next batch must start at head + 1) and its journal time;
        `source`, the sidecar read, is what the gateway announces the stream a mirror of."""
        return self._ask(P.Mirror(source), P.MirrorOk)

    def promote(self) -> int:
        """PROMOTE: the sequence the stream was promoted at (now, or before)."""
        return self._ask(P.Promote(), P.PromoteOk).head

    def send(self, batch: P.Buffer) -> None:
        """One of the source's journal batches, as PUBLISH-BATCH (after mirror())."""
        try:
            frame = b"".join((P.head_of(P.PublishBatch, memoryview(batch).nbytes), batch))
            self.sock.send(frame, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise PublishError(f"the gateway at {self.endpoint} is not reading what this mirror sends") from None

    def confirmed(self, timeout: float) -> int | None:
        """The last sequence of the next PUBLISH-OK, waiting at most `timeout` s; None if none came.
        PublishError for an INVALID (a batch refused: resume from the head a new session is told)."""
        while True:
            cmd = self._recv(timeout)
            match cmd:
                case None:
                    return None
                case P.PublishOk(sequence=first, count=count):
                    return first + count - 1
                case P.Invalid(reason=reason):
                    raise PublishError(f"the gateway at {self.endpoint} refused a mirror batch: {reason}")
                case P.Ping():
                    self._send(P.PingOk())
                case P.Detach():
                    raise PublishError(f"the gateway at {self.endpoint} ended the session")
            timeout = 0.0  # something came: look for more without waiting again

    def close(self) -> None:
        self.handshake.close()
        if not self.sock.closed:
            self.sock.close(linger=0)

    # --- plumbing ---------------------------------------------------------------------------------------

    def _ask(self, request: P.Command, answer: type[_Answer]) -> _Answer:
        """Open the session, send `request`, and wait for `answer` (the whole within `timeout_s`)."""
        deadline = time.monotonic() + self.timeout_s
        while not self.opening.over:
            cmd = self._recv(deadline - time.monotonic())
            if cmd is None:
                why = f"no answer within {self.timeout_s:g} s; is `zeps gateway` running there?"
                raise PublishError(attach_failed(self.stream, self.endpoint, why))
            reply = self.opening.handle(cmd, time.monotonic())
            if reply is not None:
                self._send(reply.command)
        if self.opening.step is Step.REFUSED:
            self._refused(self.opening.reason)
        if P.FEATURE_MIRROR not in self.opening.features:
            raise MirrorError(
                f"the gateway at {self.endpoint} does not grant the 'mirror' extension: it predates site mirroring; "
                "upgrade it"
            )
        self._send(request)
        while (cmd := self._recv(deadline - time.monotonic())) is not None:
            if isinstance(cmd, answer):
                return cmd
            if isinstance(cmd, P.Invalid):
                self._refused(cmd.reason)
        raise PublishError(f"the gateway at {self.endpoint} did not answer {request.NAME} within {self.timeout_s:g} s")

    def _refused(self, reason: str) -> None:
        text = f"the gateway at {self.endpoint} refused the mirror of stream {self.stream!r}: {reason}"
        if sends_elsewhere(reason):
            raise PublishError(text)
        raise MirrorError(text)

    def _check_link(self) -> None:
        why = self.handshake.explain()
        if why and (self.handshake.certainty > 0 or self.handshake.failed >= Handshake.CONCLUSIVE):
            raise MirrorError(f"the gateway at {self.endpoint}: {why}")
        if self.handshake.dropped:
            raise PublishError(f"the connection to the gateway at {self.endpoint} ended (gateway killed or silent)")
        if self.handshake.unreachable:
            raise PublishError(f"nothing listens at {self.endpoint} (connection refused)")

    def _send(self, cmd: P.Command) -> None:
        try:
            self.sock.send(P.encode(cmd), zmq.NOBLOCK)
        except zmq.Again:
            raise PublishError(f"the gateway at {self.endpoint} is not reading what this mirror sends") from None

    def _recv(self, timeout: float) -> P.Command | None:
        deadline = time.monotonic() + timeout
        while not self.sock.poll(max(0, int(min(SLICE_S, deadline - time.monotonic()) * 1000))):
            self._check_link()
            if time.monotonic() >= deadline:
                return None
        try:
            return P.decode(self.sock.recv())
        except P.ProtocolError as exc:
            raise PublishError(f"the gateway at {self.endpoint} sent a frame this mirror cannot read: {exc}") from None
