"""`Publisher`: the ZEPS publishing client, batching records so the gateway's work is per batch.

It attaches to a stream, asks for the "batch" extension (and "confirm" when the caller wants to know that
records are journaled), and sends records as PUBLISH-BATCH frames in the record-batch format. Against a
server that grants no extension it falls back to one PUBLISH per record: plain ZEPS still works.

Errors are never swallowed: an INVALID from the gateway is raised as PublishError when the next batch is
sent (or on flush), and a gateway that stops accepting (backpressure beyond `timeout`, or gone) raises
instead of blocking forever.
"""

from __future__ import annotations

import time
from types import TracebackType

import zmq

from gateway import batch as B
from gateway import protocol as P


class PublishError(RuntimeError):
    """The gateway refused something, or did not answer in time; `reason` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Publisher:
    def __init__(
        self,
        endpoint: str,
        stream: str,
        *,
        confirm: bool = False,
        batch_records: int = 1024,
        batch_bytes: int = 60_000,
        linger_ms: float = 5.0,
        timeout: float = 10.0,
        ctx: zmq.Context | None = None,
    ) -> None:
        P.validate_stream_name(stream)
        self.stream = stream
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.linger = linger_ms / 1000
        self.timeout = timeout
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, int(timeout * 1000))
        self.sock.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
        self.sock.connect(endpoint)
        self.pending: list[tuple[int, bytes, bytes]] = []
        self.pending_bytes = 0
        self.pending_since = 0.0
        self.sent = 0  # records handed to the gateway
        self.confirmed = 0  # records the gateway confirmed as journaled
        self.last_seq: int | None = None  # sequence of the last confirmed record
        self._send(P.Attach(P.PROTOCOL, P.VERSION, stream))
        self._expect(P.AttachOk, f"ATTACH to stream {stream!r} at {endpoint}")
        wanted = (P.FEATURE_BATCH, P.FEATURE_CONFIRM) if confirm else (P.FEATURE_BATCH,)
        self._send(P.Extend(wanted))
        granted = self._expect(P.ExtendOk, "EXTEND", invalid_ok=True)
        self.features = frozenset(granted.features) if granted else frozenset()
        if confirm and P.FEATURE_CONFIRM not in self.features:
            raise PublishError(f"the gateway at {endpoint} does not grant publish confirms")

    def publish(self, key: str, body: bytes) -> None:
        """Queue one record; it leaves when the batch fills, the linger time passes, or on flush()."""
        kb = key.encode()
        if len(kb) > P.MAX_STRING:
            raise PublishError(f"key is {len(kb)} bytes, the limit is {P.MAX_STRING}")
        now = time.monotonic()
        if not self.pending:
            self.pending_since = now
        self.pending.append((time.time_ns(), kb, body))
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
        try:
            self.flush()
        finally:
            self.sock.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.close()
        else:
            self.sock.close(linger=0)

    # --- internals ------------------------------------------------------------------------------------

    def _send_pending(self) -> None:
        if not self.pending:
            return
        records, self.pending, self.pending_bytes = self.pending, [], 0
        if P.FEATURE_BATCH in self.features:
            self._send(P.PublishBatch(B.encode(0, records)))
        else:
            for _, key, body in records:
                self._send(P.Publish(key.decode(), body))
        self.sent += len(records)

    def _send(self, cmd: P.Command) -> None:
        try:
            self.sock.send(P.encode(cmd))
        except zmq.Again:
            raise PublishError(
                f"the gateway accepted nothing for {self.timeout} s (backpressure, or it is gone)"
            ) from None

    def _poll(self, *, block: bool, until: float = 0.0) -> None:
        while True:
            wait = max(0, int((until - time.monotonic()) * 1000)) if block else 0
            if not self.sock.poll(wait):
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

    def _expect(self, kind: type[P.Command], what: str, *, invalid_ok: bool = False) -> P.Command | None:
        if not self.sock.poll(int(self.timeout * 1000)):
            raise PublishError(f"{what}: no answer within {self.timeout} s; is the gateway running there?")
        cmd = P.decode(self.sock.recv())
        if isinstance(cmd, kind):
            return cmd
        if isinstance(cmd, P.Invalid):
            if invalid_ok:
                return None
            raise PublishError(f"{what}: {cmd.reason}")
        raise PublishError(f"{what}: unexpected {cmd.NAME}")
