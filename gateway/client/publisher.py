"""`Publisher`: the ZEPS publishing client, batching records so the gateway's work is per batch.

It attaches to a stream, asks for the "batch" extension (and "confirm" when the caller wants to know that
records are journaled), and sends records as PUBLISH-BATCH frames in the record-batch format. Against a
server that grants no extension it falls back to one PUBLISH per record: plain ZEPS still works.

Errors are never swallowed: an INVALID from the gateway is raised as PublishError on the next call, and a
gateway that stops accepting (backpressure beyond `timeout`, or gone) raises instead of blocking forever.
A lost connection ends the session (the gateway restarted, or closed it for a frame over its size limit):
the Publisher then raises PublishError for good, and records sent but not confirmed must be published again
with a new one. That is at-least-once: a record journaled just before a crash, unconfirmed, comes twice.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TypeVar

import zmq

from gateway.client.directory import Directory, resolve_ingest
from gateway.errors import PublishError
from gateway.transport.curve import CurveClientKeys, Handshake
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire.streamkey import StreamKey

_ids = itertools.count()  # monitor addresses
_Answer = TypeVar("_Answer", bound=P.Command)  # the command a request waits for


class Publisher:
    def __init__(
        self,
        endpoint: str | None,
        stream: str,
        *,
        confirm: bool = False,
        batch_records: int = 1024,
        batch_bytes: int = 60_000,
        linger_ms: float = 5.0,
        timeout: float = 10.0,
        curve: CurveClientKeys | None = None,
        interface: str | None = None,
        directory: Directory | None = None,
        stream_key: StreamKey | Sequence[StreamKey] = (),
        discovery_timeout: float = 3.0,
        ctx: zmq.Context | None = None,
    ) -> None:
        """`endpoint` None: the stream's ingest is found by name (gateway.client.directory), on the announcements
        heard on `interface` (or in `directory`) within `discovery_timeout` s, signed with `stream_key` if given."""
        P.validate_stream_name(stream)
        if endpoint is None:
            keys = [stream_key] if isinstance(stream_key, StreamKey) else list(stream_key)
            endpoint = resolve_ingest(stream, interface, directory, keys, discovery_timeout)
        self.stream = stream
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.linger = linger_ms / 1000
        self.timeout = timeout
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, int(timeout * 1000))
        self.sock.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
        if curve is not None:
            curve.apply(self.sock)
        self.handshake = Handshake(self.sock)  # explains a gateway that stays silent (CURVE refusals)
        self.sock.connect(endpoint)
        self.pending: list[tuple[int, bytes, bytes, int]] = []  # (ts_ns, key, body, ttl_ms)
        self.pending_ttl = False  # some pending record has a TTL: the batch needs FLAG_TTL
        self.pending_bytes = 0
        self.pending_since = 0.0
        self.sent = 0  # records handed to the gateway
        self.confirmed = 0  # records the gateway confirmed as journaled
        self.last_seq: int | None = None  # sequence of the last confirmed record
        try:
            self._send(P.Attach(P.PROTOCOL, P.VERSION, stream))
            self._expect(P.AttachOk, f"ATTACH to stream {stream!r} at {endpoint}")
        except BaseException:
            self.sock.close(linger=0)
            raise
        finally:
            self.handshake.close()  # answered, or given up: make way for the monitor that watches for a drop
        # A fresh address: the handshake monitor's may not be released yet (libzmq closes sockets lazily).
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED, f"inproc://publisher-drop-{next(_ids)}")
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self.lost: str | None = None  # why the session ended, once the connection has dropped
        try:
            wanted = (P.FEATURE_BATCH, P.FEATURE_CONFIRM) if confirm else (P.FEATURE_BATCH,)
            self._send(P.Extend(wanted))
            granted = self._expect(P.ExtendOk, "EXTEND", invalid_ok=True)
            self.features = frozenset(granted.features) if granted else frozenset()
            if confirm and P.FEATURE_CONFIRM not in self.features:
                raise PublishError(f"the gateway at {endpoint} does not grant publish confirms")
        except BaseException:
            self.abort()
            raise

    def publish(self, key: str, body: bytes, ttl: float | None = None) -> None:
        """Queue one record; it leaves when the batch fills, the linger time passes, or on flush().

        An empty body deletes the key from snapshots; `ttl` (seconds) drops the record from snapshots once it
        is that old (docs/snapshots.md). TTLs need the 'batch' extension.
        """
        kb = key.encode()
        if len(kb) > P.MAX_STRING:
            raise PublishError(f"key is {len(kb)} bytes, the limit is {P.MAX_STRING}")
        ttl_ms = _ttl_ms(ttl)
        if ttl_ms and P.FEATURE_BATCH not in self.features:
            raise PublishError("this gateway grants no 'batch' extension, and only batches carry a TTL")
        now = time.monotonic()
        if not self.pending:
            self.pending_since = now
        self.pending.append((time.time_ns(), kb, body, ttl_ms))
        self.pending_ttl |= ttl_ms > 0
        self.pending_bytes += len(kb) + len(body) + B.RECORD_OVERHEAD
        if (
            len(self.pending) >= self.batch_records
            or self.pending_bytes >= self.batch_bytes
            or now - self.pending_since >= self.linger
        ):
            self._send_pending()
            self._poll(block=False)  # answers only follow sends: looking per record cost 60% of publish()

    def flush(self) -> int | None:
        """Send everything queued; with confirms, wait until all of it is journaled and return the last seq."""
        self._send_pending()
        if P.FEATURE_CONFIRM in self.features:
            deadline = time.monotonic() + self.timeout
            while self.confirmed < self.sent:
                if time.monotonic() >= deadline:
                    raise PublishError(f"{self.sent - self.confirmed} records not confirmed within {self.timeout} s")
                self._poll(block=True, until=deadline)
        else:
            self._poll(block=False)
        return self.last_seq

    def close(self) -> None:
        """Flush (waiting for confirms), DETACH so the gateway frees the session at once, and close."""
        try:
            self.flush()
            self._send(P.Detach())
        finally:
            self._release(None)

    def abort(self) -> None:
        """Close at once, dropping what is not sent yet: after a PublishError, before publishing again."""
        self._release(0)

    def _release(self, linger: int | None) -> None:
        self.sock.disable_monitor()
        self._monitor.close(linger=0)
        self.sock.close(linger=linger)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.close()
        else:
            self.abort()

    # --- internals ------------------------------------------------------------------------------------

    def _send_pending(self) -> None:
        self._check_connection()
        if not self.pending:
            return
        records, self.pending, self.pending_bytes = self.pending, [], 0
        ttl, self.pending_ttl = self.pending_ttl, False
        if P.FEATURE_BATCH in self.features:
            self._send(P.PublishBatch(B.encode(0, records, ttl=ttl)))
        else:
            for _, key, body, _ in records:
                self._send(P.Publish(key.decode(), body))
        self.sent += len(records)

    def _send(self, cmd: P.Command) -> None:
        try:
            self.sock.send(P.encode(cmd))
        except zmq.Again:
            raise PublishError(
                f"the gateway accepted nothing for {self.timeout} s (backpressure, or it is gone)"
            ) from None

    def _check_connection(self) -> None:
        """Raise PublishError if the connection dropped: the gateway keeps no session across connections."""
        if self.lost is None and self._monitor.poll(0):
            self._monitor.recv_multipart()
            try:
                self._poll(block=False)  # what the gateway answered before the drop still counts
            finally:
                self.lost = (
                    f"the connection to the gateway was lost (it restarted, or closed the connection for a frame "
                    f"over its size limit): {self.sent - self.confirmed} records sent are not confirmed; publish "
                    "them again with a new Publisher"
                )
        if self.lost is not None:
            raise PublishError(self.lost)

    def _poll(self, *, block: bool, until: float = 0.0) -> None:
        while True:
            wait = max(0, int((until - time.monotonic()) * 1000)) if block else 0
            if block:
                ready = dict(self._poller.poll(wait))
                if self.sock not in ready:
                    self._check_connection()
                    return
            elif not self.sock.poll(0):
                return
            cmd = P.decode(self.sock.recv())
            match cmd:
                case P.PublishOk(sequence=seq, count=n):
                    self.confirmed += n
                    self.last_seq = seq + n - 1
                case P.Invalid(reason=reason):
                    raise PublishError(f"gateway: {reason}")
                case _:
                    pass  # PING-OK and the like carry nothing for a publisher
            block = False

    def _expect(self, kind: type[_Answer], what: str, *, invalid_ok: bool = False) -> _Answer | None:
        if not self.handshake.poll(self.timeout):
            why = self.handshake.explain() or f"no answer within {self.timeout} s; is the gateway running there?"
            raise PublishError(f"{what}: {why}")
        cmd = P.decode(self.sock.recv())
        if isinstance(cmd, kind):
            return cmd
        if isinstance(cmd, P.Invalid):
            if invalid_ok:
                return None
            raise PublishError(f"{what}: {cmd.reason}")
        raise PublishError(f"{what}: unexpected {cmd.NAME}")


def _ttl_ms(ttl: float | None) -> int:
    """A TTL in seconds as the batch format's ttl_ms (0: none)."""
    if ttl is None:
        return 0
    ms = math.ceil(ttl * 1000)
    if not 0 < ms <= B.MAX_TTL_MS:
        raise PublishError(f"ttl {ttl!r} s is outside 0.001..{B.MAX_TTL_MS // 1000} s (None: no TTL)")
    return ms
