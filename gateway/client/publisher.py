"""`Publisher`: the ZEPS publishing client. Batches records, survives gateway restarts, publishes exactly once.

Theory of operation. `publish()` checks the record (raising `BadRecord` there, so a bad call never harms what
is queued) and appends it to a deque, whose appends and pops are atomic: no lock per record, and no network
I/O. It wakes the IO thread when the queue was empty and each time a batch's worth of bytes has been queued.
One IO thread, started by the constructor, owns the ZeroMQ socket and does everything else:

- it takes the queue's records as a PUBLISH-BATCH (gateway.wire.record_loops.take cuts them to the batch
  limits) when a batch is full, when `linger_ms` has passed since its oldest record (a real timer: a lone record
  leaves on time though the application never calls again), or on flush();
- it numbers records per producer: each batch carries FLAG_PRODUCER with the Publisher's 64-bit producer id and
  the number of its first record (docs/batch-format.md). It keeps every batch until the gateway confirms it
  (PUBLISH-OK), within `buffer_bytes`: DAFKA's rule, a producer keeps records until acknowledged;
- when the connection drops (the gateway was killed, restarted, or ended the session) it reconnects with capped
  exponential backoff and jitter, attaches again and re-sends every unconfirmed batch, in order. The gateway
  keeps, in its journal, the highest number journaled per producer and drops what it already has (confirming
  it), so a record journaled just before a crash is not journaled twice: exactly once, end to end;
- given several ingest endpoints (the nodes of a replicated gateway), it attaches to the first and, whenever
  the connection is lost, cannot be made (nothing listens) or is refused (a follower: "not the leader"), to
  the next, in the order of `gateway.client.endpoints`; the re-send goes to the new node under the same
  producer id, whose journal (replicated) holds the same per-producer numbers: exactly once across failover;
- a Publisher that found its ingest by name keeps the directory (its fd in the IO thread's poll) and attaches
  where it says at each attach (a gateway restarted elsewhere); when the directory stops listing the endpoint
  it is attached to, it drops that connection (DOWN) for the one listed. Of a replicated group it learns every
  node's ingest (tried in turn, as if given as a list) and goes to the leader the directory names whenever a
  new epoch is listed (docs/ha.md): no list of nodes needs to be given.

Connection states, all in the IO thread, each with its deadline::

    state      on                                   next
    DOWN       backoff deadline passed              ATTACHING (new socket, ATTACH sent)
    ATTACHING  ATTACH-OK                            EXTENDING (EXTEND sent)
    ATTACHING  INVALID / CURVE refusal, before the  FAILED (the constructor raises it)
               first attach, by every endpoint
    ATTACHING  other INVALID / refusal / deadline   DOWN (next endpoint; backoff doubles each round of them)
               / drop / unreachable (several)
    EXTENDING  EXTEND-OK / INVALID (old gateway)    READY (every unconfirmed batch re-sent, in order)
    READY      PUBLISH-OK                           READY (confirmed batches dropped, space freed)
    READY      no PUBLISH-OK for CONFIRM_STALL_S    DOWN (attach again and re-send; the gateway drops
               while batches are unconfirmed        what it has journaled)
    READY      INVALID "before ATTACH", or one      DOWN (the gateway ended the session, or sends us to
               ending "retry later" / on leaders    its leader: attach again, there if it named one)
    READY      other INVALID                        FAILED (publish/flush raise it from now on)
    any        connection dropped                   DOWN (next endpoint)
    any        the directory no longer lists it,    DOWN (attach where it lists now)
               or lists a leader of a newer epoch

Threading contract: publish(), flush(), close() and abort() may be called from any one application thread at a
time (the Publisher is not for concurrent callers). They touch only the queue (publish() alone appends to it, the
IO thread alone takes from it) and counters (each written by one side only, or under the lock); the socket is
created, used and closed by the IO thread alone, so ZeroMQ's one-thread-per-socket rule holds, and so is the
directory once the constructor has resolved the stream (a directory handed in is the Publisher's to use until it
is closed: share it with no other thread meanwhile). The IO thread never calls back into the application.
publish() blocks only while the buffer is full, and never past its deadline (`timeout`), raising BufferFull;
flush() never waits past its deadline. Against a gateway that does not grant "producer" the Publisher still
reconnects and re-sends (at least once); without "confirm" it cannot know what arrived and re-sends nothing (at
most once).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType

import zmq

from gateway.client.directory import Directory, resolve_ingest
from gateway.client.endpoints import Endpoints
from gateway.errors import BadRecord, BufferFull, ConfigError, PublishError
from gateway.transport.curve import CurveClientKeys, Handshake
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire import record_loops as loops
from gateway.wire.streamkey import StreamKey

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
HANDSHAKE_S = 2.0  # longest wait for an ATTACH-OK or EXTEND-OK before trying again
# A gateway whose connection stays up but which answers nothing (paused, or its host cut off) is gone once it
# misses ZMTP pings this long: else a publisher would wait for its confirms for as long as that lasts. libzmq's
# IO thread answers the pings, so a gateway that is only busy (a long fsync, a full loop) still counts as up.
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 100, 500
# A gateway that answers pings but confirms nothing this long while batches wait for it (a reply it dropped, a
# leader holding confirms for a follower that may never come back) gets a new session: the batches are re-sent,
# and it drops and confirms those it has. Far above a group commit or a failover, so it costs a healthy gateway
# nothing; it bounds how long a record can sit unconfirmed on a live connection.
CONFIRM_STALL_S = 5.0
WANTED = (P.FEATURE_BATCH, P.FEATURE_CONFIRM, P.FEATURE_PRODUCER)
_ids = itertools.count()  # monitor addresses
_HEAD = len(P.head_of(P.PublishBatch, 0))  # a PUBLISH-BATCH frame's bytes before its batch
_SESSION_LOST = "before ATTACH"  # the gateway's INVALID for a session it no longer has


def _elsewhere(reason: str) -> bool:
    """An INVALID that sends the publisher to another node rather than failing it: a retryable refusal, or a
    follower's "not the leader" (which may name the leader's endpoint)."""
    return reason.endswith(P.RETRY_LATER) or "leader" in reason


class _State(Enum):
    DOWN = "down"
    ATTACHING = "attaching"
    EXTENDING = "extending"
    READY = "ready"
    FAILED = "failed"


@dataclass(slots=True)
class _Sent:
    """One batch handed to the IO thread: kept until confirmed, re-sent after a reconnect."""

    frame: bytes | bytearray  # never changed once built
    count: int
    nbytes: int  # charged to the buffer budget


class Publisher:
    def __init__(
        self,
        endpoint: str | Sequence[str] | None,
        stream: str,
        *,
        confirm: bool = False,
        batch_records: int = 1024,
        batch_bytes: int = 60_000,
        linger_ms: float = 5.0,
        timeout: float = 10.0,
        buffer_bytes: int = 64 * 1024 * 1024,
        max_message_bytes: int = 1024 * 1024,
        producer: tuple[int, int] | None = None,
        curve: CurveClientKeys | None = None,
        interface: str | None = None,
        directory: Directory | None = None,
        stream_key: StreamKey | Sequence[StreamKey] = (),
        discovery_timeout: float = 3.0,
        ctx: zmq.Context | None = None,
    ) -> None:
        """Attach to `stream` at `endpoint` (waiting up to `timeout` s) and start the IO thread.

        endpoint: one ingest endpoint, or several (the nodes of a replicated gateway), tried in the order given
            and, after each loss or refusal, the next one (the module docstring; docs/client.md).
        endpoint None: the stream's ingest is found by name (gateway.client.directory), on the announcements
            heard on `interface` (or in `directory`) within `discovery_timeout` s, signed with `stream_key` if given.

        confirm: flush() waits until the gateway has journaled everything (else until it is sent).
        linger_ms: a record waits at most this long for others to share its batch.
        timeout: the default deadline of every call (attach, a full buffer, flush).
        buffer_bytes: memory for queued and unconfirmed records; publish() blocks (up to `timeout`) when full.
        max_message_bytes: the gateway's --max-message-bytes: records and batches above it are refused early.
        producer: (producer_id, number of the next record) for an application that numbers its records itself
            and restarts with the same id; default a random 64-bit id numbered from 0.
        """
        P.validate_stream_name(stream)
        for name, value in (("batch_records", batch_records), ("batch_bytes", batch_bytes)):
            if value < 1:
                raise ConfigError(f"{name} {value!r} must be at least 1")
        if max_message_bytes < 1 or buffer_bytes < max_message_bytes:
            raise ConfigError(
                f"buffer_bytes {buffer_bytes} must hold at least one message of max_message_bytes {max_message_bytes}"
            )
        self.stream = stream
        self.confirm = confirm
        self.batch_records = batch_records
        self.batch_bytes = min(batch_bytes, max_message_bytes)  # the gateway's limit is per batch of keys+bodies
        self.linger = linger_ms / 1000
        self.timeout = timeout
        self.buffer_bytes = buffer_bytes
        self.max_message_bytes = max_message_bytes
        pid, next_pseq = producer if producer is not None else (secrets.randbits(64), 0)
        if not (0 <= pid <= B.MAX_PRODUCER and 0 <= next_pseq <= B.MAX_SEQ):
            raise ConfigError(f"producer {producer!r} must be (id, next number), both 0..2**64-1")
        self._directory: Directory | None = None  # the IO thread's once it runs; closed by _stop if its own
        self._epoch = 0  # the newest epoch of the stream's group the directory listed when we last attached
        self._own_directory = directory is None
        if endpoint is None:
            keys = [stream_key] if isinstance(stream_key, StreamKey) else list(stream_key)
            self._directory, endpoint = resolve_ingest(stream, interface, directory, keys, discovery_timeout)
        self._endpoints = Endpoints(endpoint, first=BACKOFF_MIN_S, cap=BACKOFF_MAX_S)  # IO thread only, once started
        if self._endpoints.current is None:
            raise ConfigError("no ingest endpoint given: pass one, or a list of the gateway nodes' endpoints")
        self.endpoints = tuple(self._endpoints.all)
        self.endpoint: str = self._endpoints.current  # the one in use (or next to try)
        self.producer_id = pid
        self._curve = curve
        self._ctx = ctx or zmq.Context.instance()
        # --- the queue: publish() appends (ts_ns, key, body, ttl_ms), the IO thread takes ---
        self._queue: deque[tuple[int, bytes, bytes, int]] = deque()
        self._queued_bytes = 0  # keys and bodies ever queued; written by publish() only
        self._wake_at = self.batch_bytes  # publish() wakes the IO thread when _queued_bytes reaches it
        # --- shared with the IO thread, under _cond ---
        self._cond = threading.Condition(threading.Lock())
        self._taken = 0  # records the IO thread took from the queue
        self._taken_bytes = 0  # their keys and bodies
        self._released_bytes = 0  # of those, confirmed (or sent, without confirms): the budget is queued - released
        self._flush_wanted = False
        self._stopping: bool | None = None  # None: run; False: DETACH then stop; True: stop at once
        self.sent = 0  # records handed to the gateway at least once
        self.confirmed = 0  # records the gateway confirmed as journaled
        self.last_seq: int | None = None  # sequence of the last confirmed record
        self.reconnects = 0
        self._state = _State.DOWN
        self._error: PublishError | None = None
        self.features: frozenset[str] = frozenset()
        # --- IO thread only ---
        self._next_pseq = next_pseq
        self._unconfirmed: deque[_Sent] = deque()
        self._head_confirmed = 0  # records of _unconfirmed[0] confirmed already (confirms may split batches)
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._handshake: Handshake | None = None
        self._attached_once = False
        self._retry_at = 0.0
        self._progress_at = 0.0  # READY: when a confirm last came, or when batches began to wait for one
        self._state_deadline = 0.0
        self._due: float | None = None  # when the queue's oldest record must leave (its linger deadline)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=f"zeps-publisher-{stream}", daemon=True)
        self._thread.start()
        with self._cond:
            ready = self._cond.wait_for(lambda: self._state in (_State.READY, _State.FAILED), timeout)
            if ready and self._state is _State.READY:
                return
            where = " or ".join(self.endpoints)
            error = self._error or PublishError(
                f"ATTACH to stream {stream!r} at {where}: no answer within {timeout} s; is the gateway running there?"
            )
        self.abort()
        raise error

    # --- the application's side ---------------------------------------------------------------------

    def publish(
        self, key: str, body: bytes | bytearray | memoryview, ttl: float | None = None, *, timeout: float | None = None
    ) -> None:
        """Queue one record; it leaves when the batch fills, `linger_ms` after its batch's first record, or on
        flush(). Raises BadRecord (nothing queued is touched) for a record that cannot be sent, BufferFull if
        the buffer stays full for `timeout` s (default the constructor's; 0: do not wait), PublishError once
        the gateway has refused something.

        An empty body deletes the key from snapshots; `ttl` (seconds) drops the record from snapshots once it
        is that old (docs/snapshots.md).
        """
        if (
            type(key) is str
            and type(body) is bytes
            and ttl is None
            and key.isascii()
            and len(key) <= B.MAX_KEY
            and len(key) + len(body) <= self.max_message_bytes
        ):
            kb, data, ttl_ms = key.encode(), body, 0  # the common case, checked at the cost of one expression
        else:
            kb, data, ttl_ms = self._checked(key, body, ttl)
        if self._error is not None:
            raise self._error
        queued = self._queued_bytes + len(kb) + len(data)
        if queued - self._released_bytes > self.buffer_bytes:
            self._wait_for_room(queued, self.timeout if timeout is None else timeout)
        queue = self._queue
        queue.append((time.time_ns(), kb, data, ttl_ms))
        self._queued_bytes = queued
        if queued >= self._wake_at or len(queue) == 1:  # a batch's worth more, or the IO thread may be idle
            self._wake_at = queued + self.batch_bytes
            os.eventfd_write(self._wake_fd, 1)

    def _wait_for_room(self, queued: int, timeout: float) -> None:
        """Wait up to `timeout` until the buffer has room for `queued` bytes (BufferFull, nothing queued, if not)."""
        os.eventfd_write(self._wake_fd, 1)  # what is queued must leave for confirms to free anything
        with self._cond:
            if not self._cond.wait_for(
                lambda: queued - self._released_bytes <= self.buffer_bytes or self._error is not None, timeout
            ):
                raise BufferFull(
                    f"{self._queued_bytes - self._released_bytes} bytes are unconfirmed, the buffer holds "
                    f"{self.buffer_bytes}, and the gateway confirmed too little for {timeout} s (down?): try again, "
                    "or raise buffer_bytes"
                )
            if self._error is not None:
                raise self._error

    @property
    def accepted(self) -> int:
        """Records publish() has taken."""
        with self._cond:
            return self._taken + len(self._queue)

    def flush(self, timeout: float | None = None) -> int | None:
        """Send everything queued and wait (up to `timeout`, default the constructor's) until it is confirmed
        (confirm=True) or sent; return the sequence of the last record confirmed. Raises PublishError."""
        wait = self.timeout if timeout is None else timeout
        with self._cond:
            target = self._taken + len(self._queue)
            self._flush_wanted = True
        os.eventfd_write(self._wake_fd, 1)
        with self._cond:
            done = self._cond.wait_for(lambda: self._error is not None or self._done(target), wait)
            if self._error is not None:
                raise self._error
            if not done:
                what = "confirmed" if self._confirming else "sent"
                state = self._state.value
                raise PublishError(
                    f"{target - (self.confirmed if self._confirming else self.sent)} records not {what} within "
                    f"{wait} s (connection {state}, {self.reconnects} reconnects): the gateway is slow or down; "
                    "they stay buffered, call flush() again"
                )
            return self.last_seq

    def close(self) -> None:
        """Flush (waiting for confirms), DETACH so the gateway frees the session at once, and stop.
        If the flush fails (raised here), stop at once: what is unconfirmed is dropped."""
        flushed = False
        try:
            self.flush()
            flushed = True
        finally:
            self._stop(detach=flushed)

    def abort(self) -> None:
        """Stop at once, dropping what is not confirmed."""
        self._stop(detach=False)

    def _stop(self, *, detach: bool) -> None:
        """Stop the IO thread (after a DETACH if `detach`); idempotent. The wake-up descriptor is closed here,
        once the thread has ended, so no write can reach a descriptor number reused by then."""
        with self._cond:
            if self._stopping is None:
                self._stopping = not detach
            if self._error is None:
                self._error = PublishError("this Publisher is closed: create a new one")
        if self._wake_fd < 0:
            return
        os.eventfd_write(self._wake_fd, 1)
        self._thread.join(HANDSHAKE_S + self.timeout + 1)  # a DETACH's send lingers up to `timeout`
        if not self._thread.is_alive():
            os.close(self._wake_fd)
            self._wake_fd = -1
            self._close_directory()

    def _close_directory(self) -> None:
        if self._directory is not None and self._own_directory:
            self._directory.close()
        self._directory = None

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.close()
        else:
            self.abort()

    @property
    def state(self) -> str:
        """The connection's state: down, attaching, extending, ready or failed (`reconnects` counts drops)."""
        return self._state.value

    @property
    def _confirming(self) -> bool:
        return P.FEATURE_CONFIRM in self.features

    def _done(self, target: int) -> bool:
        return (self.confirmed if self._confirming else self.sent) >= target

    def _checked(self, key: str, body: bytes | bytearray | memoryview, ttl: float | None) -> tuple[bytes, bytes, int]:
        """The record as the batch format takes it, or BadRecord naming the value and the fix."""
        if not isinstance(key, str):
            raise BadRecord(f"key {key!r} is a {type(key).__name__}: pass a str (it is sent as UTF-8)")
        kb = key.encode(errors="strict") if key.isascii() else _utf8(key)
        if len(kb) > B.MAX_KEY:
            raise BadRecord(f"key {key[:40]!r}... is {len(kb)} bytes in UTF-8, the limit is {B.MAX_KEY}: shorten it")
        if isinstance(body, bytes):
            data = body
        elif isinstance(body, bytearray | memoryview):
            data = bytes(body)  # a copy: the caller may change its buffer once publish() returns
        else:
            raise BadRecord(
                f"body {body!r:.40} is a {type(body).__name__}: pass bytes (e.g. text.encode()); nothing was queued"
            )
        if len(kb) + len(data) > self.max_message_bytes:
            raise BadRecord(
                f"key and body of {len(kb) + len(data)} bytes are over the gateway's limit of {self.max_message_bytes} "
                "(max_message_bytes, the gateway's --max-message-bytes): split the body, or raise both"
            )
        return kb, data, _ttl_ms(ttl)

    # --- the IO thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_fd, zmq.POLLIN)
        if self._directory is not None:
            poller.register(self._directory, zmq.POLLIN)
        watched: tuple[zmq.Socket | None, zmq.Socket | None] = (None, None)
        try:
            while not self._finished():
                wait = self._step(time.monotonic())
                sock, monitor = self._sock, self._monitor
                if (sock, monitor) != watched:  # a new connection, or a new monitor on it
                    for old in watched:
                        if old is not None:
                            poller.unregister(old)
                    for new in (sock, monitor):
                        if new is not None:
                            poller.register(new, zmq.POLLIN)
                    watched = (sock, monitor)
                events = dict(poller.poll(max(0, math.ceil(wait * 1000))))
                if self._wake_fd in events:
                    os.eventfd_read(self._wake_fd)
                if self._directory is not None and self._directory in events:
                    self._follow_ingest()
                if sock is not None and sock in events:
                    self._receive()
                if monitor is not None and monitor in events and monitor is self._monitor:
                    self._drain_monitor()
        except BaseException as exc:  # a bug, not the network: make it visible to the application
            self._fail(PublishError(f"publisher IO thread failed: {exc!r}"))
            raise
        finally:
            if self._stopping is False and self._state is _State.READY and self._sock is not None:
                self._send(P.encode(P.Detach()))
            self._close_socket(linger=int(self.timeout * 1000) if self._stopping is False else 0)

    def _finished(self) -> bool:
        """Stopping, and (for a DETACH) nothing left to deliver, or no way to deliver it."""
        with self._cond:
            if self._stopping is None:
                return False
            if self._stopping or self._state is _State.FAILED:
                return True
            return not self._queue and not (self._confirming and self._unconfirmed)

    def _step(self, now: float) -> float:
        """Advance the connection state machine and the linger timer; seconds until the next deadline."""
        state = self._state
        if state is _State.DOWN:
            if now < self._retry_at:
                return self._retry_at - now
            self._open()
            return 0.0  # ATTACHING next: its monitor is looked at every Handshake.SLICE_S
        if state in (_State.ATTACHING, _State.EXTENDING):
            refused = self._refusal()
            if refused:
                self._refused(refused)
                return 0.0
            if self._handshake is not None and self._handshake.unreachable:
                self._lost("nothing listens there")
                return 0.0
            if now >= self._state_deadline:
                self._lost(f"no {'ATTACH-OK' if state is _State.ATTACHING else 'EXTEND-OK'} within {HANDSHAKE_S} s")
                return 0.0
            return min(self._state_deadline - now, Handshake.SLICE_S)
        if state is _State.FAILED:
            return 1.0
        if self._confirming and self._unconfirmed:
            stalled = now - self._progress_at
            if stalled >= CONFIRM_STALL_S:
                self._lost(f"no PUBLISH-OK for {stalled:.1f} s")
                return 0.0
            return min(self._send_due(now), CONFIRM_STALL_S - stalled)
        return self._send_due(now)

    def _send_due(self, now: float) -> float:
        """READY: take and send what is due (full batches at once, the rest `linger_ms` after its oldest record, or
        at once on flush() and close()); seconds until the linger deadline (1 s: the queue is empty)."""
        queue, batches = self._queue, []
        with self._cond:
            hurry = self._flush_wanted or self._stopping is not None
            while queue:
                full = self._queued_bytes - self._taken_bytes >= self.batch_bytes or len(queue) >= self.batch_records
                if not (full or hurry):
                    if self._due is None:
                        self._due = self._deadline(now, queue[0][0])
                    if now < self._due:
                        break
                records, payload, ttl = loops.take(queue, self.batch_records, self.batch_bytes)
                self._taken += len(records)
                self._taken_bytes += payload
                self._due = None
                batches.append((records, payload, ttl))
            if not queue:
                self._flush_wanted = False
        for records, payload, ttl in batches:
            self._send_batch(records, payload, ttl)
        return 1.0 if self._due is None else max(0.0, self._due - now)

    def _deadline(self, now: float, ts_ns: int) -> float:
        """The monotonic time by which a record queued at wall-clock `ts_ns` must leave: `linger_ms` after it,
        never later than `linger_ms` from now (a clock stepped back cannot hold it)."""
        age = (time.time_ns() - ts_ns) / 1e9
        return now + self.linger - min(max(age, 0.0), self.linger)

    def _send_batch(self, records: list[tuple[int, bytes, bytes, int]], payload: int, ttl: bool) -> None:
        n = len(records)
        if P.FEATURE_BATCH in self.features:
            producer = (self.producer_id, self._next_pseq) if P.FEATURE_PRODUCER in self.features else None
            frame = B.encode_after(_HEAD, 0, records, ttl=ttl, producer=producer)  # records copied once, here
            frame[:_HEAD] = P.head_of(P.PublishBatch, len(frame) - _HEAD)
            kept = [_Sent(frame, n, payload)]
        else:  # plain ZEPS: one PUBLISH per record
            kept = [_Sent(P.encode(P.Publish(kb.decode(), data)), 1, len(kb) + len(data)) for _, kb, data, _ in records]
        self._next_pseq += n
        for sent in kept:
            self._send(sent.frame)
        if self._confirming:
            if not self._unconfirmed:
                self._progress_at = time.monotonic()
            self._unconfirmed.extend(kept)
        with self._cond:
            self.sent += n
            if not self._confirming:
                self._released_bytes += payload
            self._cond.notify_all()

    def _refusal(self) -> str | None:
        """During the first attach: why the gateway refused the handshake, once that is conclusive."""
        shake = self._handshake
        if shake is None or not shake.explain():
            return None
        return shake.failure if shake.certainty > 0 or shake.failed >= Handshake.CONCLUSIVE else None

    def _follow_ingest(self) -> None:
        """The directory changed: leave an ingest it no longer lists (its gateway died or moved) for the one it
        does; a connection to a dead host may never fail by itself."""
        assert self._directory is not None
        self._directory.drain()
        info = self._directory.lookup(self.stream)
        attached = self._state in (_State.ATTACHING, _State.EXTENDING, _State.READY)
        if not attached or info is None or not info.ingests:
            return
        if self.endpoint not in info.ingests:
            self._lost(f"{self.endpoint} is no longer listed; {info.ingest} is")
        elif info.epoch > self._epoch and info.ingest != self.endpoint:
            self._lost(f"a new leader at {info.ingest} (epoch {info.epoch})")

    def _open(self) -> None:
        """DOWN -> ATTACHING: a fresh socket (nothing of the old session's pipes survives), ATTACH sent, to the
        ingest the directory lists now when the stream was found by name."""
        self._close_socket(linger=0)
        info = self._directory.lookup(self.stream) if self._directory is not None else None
        if info is not None and info.ingest is not None:
            for ingest in info.ingests:  # a group's nodes, to try in turn
                self._endpoints.add(ingest)
            listed = self.endpoint in info.ingests
            if info.ingest != self.endpoint and (not listed or info.epoch > self._epoch):
                log.info("publisher %016x: %s is at %s now (directory)", self.producer_id, self.stream, info.ingest)
                self._endpoints.move_to(info.ingest)
                self.endpoint = info.ingest
            self._epoch = info.epoch
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # bounded by buffer_bytes instead: a send never blocks or fails
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        if self._curve is not None:
            self._curve.apply(sock)
        if self._attached_once:
            self._watch_drops(sock)
        else:  # the first attach explains a silent gateway (CURVE refusals); one monitor per socket at a time
            self._handshake = Handshake(sock, watch_connects=self._endpoints.several)
        sock.connect(self.endpoint)
        self._sock = sock
        self._send(P.encode(P.Attach(P.PROTOCOL, P.VERSION, self.stream)))
        # The first attach to a lone endpoint may wait the whole timeout; with others to try, each gets HANDSHAKE_S.
        first_and_only = not self._attached_once and not self._endpoints.several
        self._set_state(_State.ATTACHING, self.timeout if first_and_only else HANDSHAKE_S)

    def _receive(self) -> None:
        assert self._sock is not None
        while self._sock is not None and self._sock.poll(0):
            try:
                cmd = P.decode(self._sock.recv(zmq.NOBLOCK))
            except P.ProtocolError as exc:
                self._lost(f"the gateway sent a bad frame ({exc.reason})")
                return
            self._on(cmd)

    def _on(self, cmd: P.Command) -> None:
        state = self._state
        match cmd:
            case P.AttachOk() if state is _State.ATTACHING:
                if self._handshake is not None:
                    self._handshake.close()
                    self._handshake = None
                    assert self._sock is not None
                    self._watch_drops(self._sock)
                self._send(P.encode(P.Extend(WANTED)))
                self._set_state(_State.EXTENDING, HANDSHAKE_S)
            case P.ExtendOk(features=granted) if state is _State.EXTENDING:
                self._ready(frozenset(granted))
            case P.Invalid(reason=reason) if state is _State.EXTENDING and _elsewhere(reason):
                pass  # a refusal of a batch sent before this session (pipelined), not the answer to EXTEND
            case P.Invalid() if state is _State.EXTENDING:
                self._ready(frozenset())  # a gateway that knows no extension: plain ZEPS
            case P.Invalid(reason=reason) if state is _State.ATTACHING:
                self._refused(reason)
            case P.Invalid(reason=reason) if _SESSION_LOST in reason:
                self._lost(f"the gateway ended the session ({reason})")
            case P.Invalid(reason=reason) if _elsewhere(reason):
                self._lost(f"the gateway sent us elsewhere ({reason})", hint=reason, answered=True)
            case P.Invalid(reason=reason):
                self._fail(PublishError(f"gateway: {reason}"))
            case P.PublishOk(sequence=seq, count=n) if state is _State.READY:
                self._confirmed(seq + n - 1, n)
            case _:
                pass  # PING-OK, DETACH-OK and answers of an earlier session carry nothing for a publisher

    def _ready(self, features: frozenset[str]) -> None:
        """Attached: re-send every unconfirmed batch, in order; the gateway drops those it has journaled."""
        if self._attached_once and P.FEATURE_CONFIRM in self.features and P.FEATURE_CONFIRM not in features:
            self._fail(PublishError("the gateway no longer grants publish confirms after its restart"))
            return
        if self.confirm and P.FEATURE_CONFIRM not in features:
            self._fail(PublishError(f"the gateway at {self.endpoint} does not grant publish confirms"))
            return
        self._head_confirmed = 0  # a re-sent batch is confirmed whole
        self._progress_at = time.monotonic()
        for kept in self._unconfirmed:
            self._send(kept.frame)
        self._endpoints.succeeded()
        if self._attached_once:
            log.info(
                "publisher %016x: attached again at %s, %d batches re-sent",
                self.producer_id,
                self.endpoint,
                len(self._unconfirmed),
            )
        with self._cond:
            self.features = features
            self._attached_once = True
            self._state = _State.READY
            self._cond.notify_all()

    def _confirmed(self, last_seq: int, n: int) -> None:
        self._progress_at = time.monotonic()
        freed = 0
        left = n
        while left and self._unconfirmed:
            head = self._unconfirmed[0]
            take = min(left, head.count - self._head_confirmed)
            self._head_confirmed += take
            left -= take
            if self._head_confirmed == head.count:
                self._unconfirmed.popleft()
                self._head_confirmed = 0
                freed += head.nbytes
        with self._cond:
            self.confirmed += n - left
            self.last_seq = last_seq
            self._released_bytes += freed
            self._cond.notify_all()

    def _watch_drops(self, sock: zmq.Socket) -> None:
        # A fresh address each time: an earlier monitor's may not be released yet (libzmq closes lazily).
        # With other endpoints to try, a connect that fails (nothing listens) counts as a drop.
        events = zmq.EVENT_DISCONNECTED | (zmq.EVENT_CONNECT_RETRIED if self._endpoints.several else 0)
        self._monitor = sock.get_monitor_socket(events, f"inproc://zeps-pub-{next(_ids)}")

    def _drain_monitor(self) -> None:
        assert self._monitor is not None
        dropped = False
        while self._monitor is not None and self._monitor.poll(0):
            self._monitor.recv_multipart()
            dropped = True
        if dropped:
            self._receive()  # what the gateway answered before the drop still counts
            if self._state not in (_State.FAILED, _State.DOWN):
                self._lost("the connection dropped (or could not be made)")

    def _refused(self, reason: str) -> None:
        """The current endpoint refused ATTACH (INVALID, or the CURVE handshake): the next one is tried, unless
        this is the first attach and every endpoint has refused, which is final. "Not the leader" is no refusal:
        a node that says so is up, and the group may be electing."""
        if _elsewhere(reason):
            self._lost(f"ATTACH sent elsewhere ({reason})", hint=reason, answered=True)
        elif not self._endpoints.refused(reason) or self._attached_once:
            self._lost(f"ATTACH refused ({reason})", hint=reason)
        elif self._endpoints.several:
            self._fail(
                PublishError(
                    f"ATTACH to stream {self.stream!r}: every endpoint refused: {self._endpoints.refused_text()}"
                )
            )
        else:
            self._fail(PublishError(f"ATTACH to stream {self.stream!r} at {self.endpoint}: {reason}"))

    def _lost(self, why: str, *, hint: str = "", answered: bool = False) -> None:
        """-> DOWN: close the socket; try the next endpoint after a backoff that doubles each round of them up to
        BACKOFF_MAX_S, with jitter (gateway.client.endpoints)."""
        self._close_socket(linger=0)
        failed = self.endpoint
        delay = self._endpoints.failed(hint, answered=answered)
        self._retry_at = time.monotonic() + delay
        with self._cond:
            self.reconnects += 1
            self.endpoint = self._endpoints.current or failed
            self._state = _State.DOWN
            self._cond.notify_all()
        log.info(
            "publisher %016x on %s: %s; attaching at %s in %.2f s (%d batches unconfirmed)",
            self.producer_id,
            failed,
            why,
            self.endpoint,
            delay,
            len(self._unconfirmed),
        )

    def _fail(self, error: PublishError) -> None:
        with self._cond:
            self._error = error
            self._state = _State.FAILED
            self._cond.notify_all()

    def _set_state(self, state: _State, within: float) -> None:
        with self._cond:
            self._state = state
            self._state_deadline = time.monotonic() + within

    def _send(self, frame: bytes | bytearray) -> None:
        assert self._sock is not None
        self._sock.send(frame, zmq.NOBLOCK)  # SNDHWM 0: never Again. Copied: cheaper than zero-copy at 60 KB

    def _close_socket(self, linger: int) -> None:
        if self._handshake is not None:
            self._handshake.close()
            self._handshake = None
        if self._monitor is not None:
            assert self._sock is not None
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
        if self._sock is not None:
            self._sock.close(linger=linger)
            self._sock = self._monitor = None


def _utf8(key: str) -> bytes:
    try:
        return key.encode()
    except UnicodeEncodeError as exc:
        raise BadRecord(f"key {key!r} is not valid UTF-8 ({exc.reason} at {exc.start}): fix the key") from None


def _ttl_ms(ttl: float | None) -> int:
    """A TTL in seconds as the batch format's ttl_ms (0: none)."""
    if ttl is None:
        return 0
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise BadRecord(f"ttl {ttl!r} must be a number of seconds (None: no TTL)")
    ms = math.ceil(ttl * 1000)
    if not 0 < ms <= B.MAX_TTL_MS:
        raise BadRecord(f"ttl {ttl!r} s is outside 0.001..{B.MAX_TTL_MS // 1000} s (None: no TTL)")
    return ms
