"""`Publisher`: the ZEPS publishing client. Batches records, survives gateway restarts, publishes exactly once.

A façade over three parts, after aiokafka's producer (accumulator, sender, connection):

- the accumulator (`gateway.client.accumulator`): `publish()` and `publish_many()` check records there (raising
  `BadRecord` at once: a `TypeError` for a wrong type, a `ValueError` for a wrong value, nothing queued harmed) and
  queue them with no lock per record and no network I/O; it cuts the queue into batches with smart batching (a
  lone record leaves at once, what arrives while a batch is being sent leaves as the next; `linger_ms` > 0 adds
  an upper bound to wait for fuller batches) and keeps the buffer budget (`buffer_bytes`);
- the ingest session (`gateway.client.ingest_session`, sans-IO, its transitions in one table): attaching (the
  ATTACH -> EXTEND opening every client shares), numbering records per producer (exactly once: the gateway
  keeps the highest number journaled per producer and drops what it already has), keeping every batch until
  PUBLISH-OK and re-sending it after a reconnect, and moving through several ingest endpoints (the nodes of a
  replicated gateway, or what a directory lists) with capped backoff;
- the IO thread (`gateway.client.publisher_thread`): it owns the ZeroMQ socket and the directory, feeds the
  session what happens and executes what the session says. It decides nothing.

Nothing is lost in silence: a Publisher still open when the interpreter exits is flushed then (within its
`timeout`, like `logging.shutdown`), and what could not be confirmed is counted on stderr; one that is
garbage-collected open warns (`ResourceWarning`) and delivers what it holds in the background.

Threading contract: publish(), publish_many(), flush(), close() and abort() may be called from any one
application thread at a time (the Publisher is not for concurrent callers). They touch only the accumulator and
read the session's counters, waiting on the shared condition that the IO thread notifies. publish() blocks only
while the buffer is full, and never past its deadline (`timeout`), raising BufferFull; flush() never waits past
its deadline. Against a gateway that does not grant "producer" the Publisher still reconnects and re-sends (at
least once); without "confirm" it cannot know what arrived and re-sends nothing (at most once).
"""

from __future__ import annotations

import atexit
import os
import secrets
import sys
import threading
import warnings
from collections.abc import Sequence
from types import TracebackType

import zmq

from gateway.client.accumulator import Accumulator, Body
from gateway.client.directory import Directory, resolve_ingest
from gateway.client.endpoints import Endpoints
from gateway.client.ingest_session import BACKOFF_MAX_S, BACKOFF_MIN_S, HANDSHAKE_S, IngestSession, State
from gateway.client.opening import attach_failed
from gateway.client.publisher_thread import PublisherThread
from gateway.errors import BufferFull, ConfigError, PublishError
from gateway.transport.curve import CurveClientKeys
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire.streamkey import StreamKey

_open: set[PublisherThread] = set()  # IO threads of Publishers not closed: flushed at exit
os.register_at_fork(after_in_child=_open.clear)  # a forked child has none of its parent's IO threads


class Publisher:
    """Publish records to one stream of a gateway (its ingest endpoint), batched, exactly once; see the module
    docstring for how.

        with Publisher("tcp://127.0.0.1:5570", "orders", confirm=True) as pub:
            pub.publish("eu.bund", b"101.25")
            last_seq = pub.flush()  # journaled up to last_seq

    Leaving the `with` block closes it (flush, then DETACH); an exception inside it aborts it instead.
    """

    def __init__(
        self,
        endpoint: str | Sequence[str] | None,
        stream: str,
        *,
        confirm: bool = False,
        batch_records: int = 1024,
        batch_bytes: int = 60_000,
        linger_ms: float = 0.0,
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

        endpoint: one ingest endpoint (tcp://HOST:PORT), or several (the nodes of a replicated gateway), tried in
            the order given and, after each loss or refusal, the next one (docs/client.md).
        endpoint None: the stream's ingest is found by name (gateway.client.directory), on the announcements
            heard on `interface` (or in `directory`) within `discovery_timeout` s, signed with `stream_key` if given.

        confirm: flush() waits until the gateway has journaled everything (else until it is sent).
        batch_records, batch_bytes: a batch leaves with at most this many records, and at most this many bytes of
            keys and bodies (capped at `max_message_bytes`): larger batches cost fewer messages, more latency.
        linger_ms: 0 (the default): a record leaves as soon as the IO thread is free, with whatever queued behind
            it (best latency when load is light, full batches when it is heavy); above 0, a partial batch waits
            up to this long for others to join it.
        timeout: the default deadline of every call (attach, a full buffer, flush, the flush at exit).
        buffer_bytes: memory for queued and unconfirmed records; publish() blocks (up to `timeout`) when full.
        max_message_bytes: the gateway's --max-message-bytes: records and batches above it are refused early.
        producer: (producer_id, number of the next record) for an application that numbers its records itself
            and restarts with the same id; default a random 64-bit id numbered from 0.
        curve: CURVE client keys (gateway.transport.curve), for a gateway whose ingest requires them.
        ctx: the ZeroMQ context to make the socket in (default: the process's shared one).

        Raises ConfigError (a ValueError) for a bad argument or endpoint, DiscoveryError when the stream is not
        found by name, PublishError when the gateway refuses the stream or does not answer within `timeout`.
        """
        P.validate_stream_name(stream)
        for name, value in (("batch_records", batch_records), ("batch_bytes", batch_bytes)):
            if value < 1:
                raise ConfigError(f"{name} {value!r} must be at least 1")
        if max_message_bytes < 1 or buffer_bytes < max_message_bytes:
            raise ConfigError(
                f"buffer_bytes {buffer_bytes} must hold at least one message of max_message_bytes {max_message_bytes}"
            )
        if linger_ms < 0:
            raise ConfigError(f"linger_ms {linger_ms!r} must be 0 or more")
        self.stream = stream
        self.confirm = confirm
        self.timeout = timeout
        pid, next_pseq = producer if producer is not None else (secrets.randbits(64), 0)
        if not (0 <= pid <= B.MAX_PRODUCER and 0 <= next_pseq <= B.MAX_SEQ):
            raise ConfigError(f"producer {producer!r} must be (id, next number), both 0..2**64-1")
        own_directory = directory is None
        if endpoint is not None:
            endpoints = Endpoints(endpoint, first=BACKOFF_MIN_S, cap=BACKOFF_MAX_S)
        else:
            keys = [stream_key] if isinstance(stream_key, StreamKey) else list(stream_key)
            directory, found = resolve_ingest(stream, interface, directory, keys, discovery_timeout)
            endpoints = Endpoints(found, first=BACKOFF_MIN_S, cap=BACKOFF_MAX_S)
        if endpoints.current is None:
            raise ConfigError("no ingest endpoint given: pass one, or a list of the gateway nodes' endpoints")
        self.endpoints = tuple(endpoints.all)
        self.producer_id = pid
        self._acc = Accumulator(
            threading.Condition(threading.Lock()),
            batch_records=batch_records,
            batch_bytes=min(batch_bytes, max_message_bytes),  # the gateway's limit is per batch of keys+bodies
            buffer_bytes=buffer_bytes,
            linger_s=linger_ms / 1000,
            max_message_bytes=max_message_bytes,
        )
        self._session = IngestSession(stream, endpoints, producer=(pid, next_pseq), confirm=confirm, attach_s=timeout)
        self._io = PublisherThread(
            self._session,
            self._acc,
            directory=directory,
            own_directory=own_directory,
            curve=curve,
            ctx=ctx or zmq.Context.instance(),
            timeout=timeout,
        )
        self._io.start()
        with self._acc.cond:
            ready = self._acc.cond.wait_for(lambda: self._session.state in (State.READY, State.FAILED), timeout)
            error = self._io.error
        if ready and error is None:
            _open.add(self._io)
            return
        where = " or ".join(self.endpoints)
        self.abort()
        raise error or PublishError(
            attach_failed(stream, where, f"no answer within {timeout} s; is the gateway running there?")
        )

    # --- what the parts hold, read-only ---------------------------------------------------------------

    batch_records = property(lambda self: self._acc.batch_records)
    batch_bytes = property(lambda self: self._acc.batch_bytes)
    buffer_bytes = property(lambda self: self._acc.buffer_bytes)
    max_message_bytes = property(lambda self: self._acc.max_message_bytes)
    linger = property(lambda self: self._acc.linger_s, doc="linger_ms in seconds")
    endpoint = property(lambda self: self._session.endpoint, doc="the ingest endpoint in use (or next to try)")
    features = property(lambda self: self._session.features, doc="what the gateway granted")
    sent = property(lambda self: self._session.sent, doc="records handed to the gateway at least once")
    confirmed = property(lambda self: self._session.confirmed, doc="records the gateway confirmed as journaled")
    last_seq = property(lambda self: self._session.last_seq, doc="sequence of the last confirmed record")
    reconnects = property(lambda self: self._session.reconnects)

    @property
    def state(self) -> str:
        """The connection's state: down, attaching, extending, ready, failed or closed (`reconnects` counts drops)."""
        return self._session.step

    @property
    def accepted(self) -> int:
        """Records publish() has taken."""
        return self._acc.accepted

    # --- the application's side ---------------------------------------------------------------------

    def publish(self, key: str, body: Body, ttl: float | None = None, *, timeout: float | None = None) -> None:
        """Queue one record; it leaves as soon as the IO thread is free (with a linger: when its batch fills,
        `linger_ms` after its batch's first record, or on flush()). Raises BadRecord (a TypeError for a key, body
        or ttl of the wrong type, a ValueError for a wrong value; nothing queued is touched) for a record that
        cannot be sent, BufferFull if the buffer stays full for `timeout` s (default the constructor's; 0: do
        not wait), PublishError once the gateway has refused something or the Publisher is closed.

        An empty body deletes the key from snapshots; `ttl` (seconds) drops the record from snapshots once it
        is that old (docs/snapshots.md).
        """
        acc = self._acc
        if (
            type(key) is str
            and type(body) is bytes
            and ttl is None
            and key.isascii()
            and len(key) <= B.MAX_KEY
            and len(key) + len(body) <= acc.max_message_bytes
        ):
            kb, data, ttl_ms = key.encode(), body, 0  # the common case, checked at the cost of one expression
        else:
            kb, data, ttl_ms = acc.record(key, body, ttl)
        if self._session.error is not None or self._io.closed_error is not None:
            raise self._io.error  # type: ignore[misc]
        wake = acc.add(kb, data, ttl_ms)
        if wake is None:  # the buffer is full: wait for room, then it fits (one application thread adds)
            self._wait_for_room(len(kb) + len(data), self.timeout if timeout is None else timeout)
            wake = acc.add(kb, data, ttl_ms)
        if wake and self._io.idle:
            self._io.wake()

    def publish_many(self, keys: Sequence[str], bodies: Sequence[bytes], *, timeout: float | None = None) -> None:
        """Queue len(keys) records, keys[i] with bodies[i], all or none, without Python work per record when the
        keys are str and the bodies bytes (checked, encoded and queued by loops in C); otherwise each is checked
        as publish() would. Raises as publish() does (naming the first bad record), and BufferFull at once if
        they together exceed `buffer_bytes`."""
        kbs, data, payload = self._acc.records(keys, bodies)
        if not kbs:
            return
        if payload > self._acc.buffer_bytes:
            raise BufferFull(
                f"publish_many of {payload} bytes can never fit the buffer of {self._acc.buffer_bytes} bytes: "
                "split the call, or raise buffer_bytes"
            )
        if (error := self._io.error) is not None:
            raise error
        if self._acc.over_budget(payload):
            self._wait_for_room(payload, self.timeout if timeout is None else timeout)
        self._acc.extend(kbs, data, payload)
        if self._io.idle:
            self._io.wake()

    def _wait_for_room(self, nbytes: int, timeout: float) -> None:
        """Wait up to `timeout` until the buffer has room for `nbytes` more (BufferFull, nothing queued, if not)."""
        self._io.wake()  # what is queued must leave for confirms to free anything
        acc = self._acc
        with acc.cond:
            if not acc.cond.wait_for(lambda: not acc.over_budget(nbytes) or self._io.error is not None, timeout):
                raise BufferFull(
                    f"{acc.unreleased} bytes are unconfirmed, the buffer holds {acc.buffer_bytes}, and the gateway "
                    f"confirmed too little for {timeout} s (down?): try again, or raise buffer_bytes"
                )
            if (error := self._io.error) is not None:
                raise error

    def flush(self, timeout: float | None = None) -> int | None:
        """Send everything queued and wait (up to `timeout`, default the constructor's) until it is confirmed
        (confirm=True) or sent; return the sequence of the last record confirmed. Raises PublishError."""
        wait = self.timeout if timeout is None else timeout
        acc, session = self._acc, self._session
        with acc.cond:
            target = acc.taken + len(acc.queue)
            self._io.flush_wanted = True
        self._io.wake()
        with acc.cond:
            done = acc.cond.wait_for(lambda: session.error is not None or self._left(target) <= 0, wait)
            if session.error is not None:
                raise session.error
            if not done:
                raise PublishError(
                    f"{self._left(target)} records not {'confirmed' if session.confirming else 'sent'} within "
                    f"{wait} s (connection {self.state}, {session.reconnects} reconnects): the gateway is slow or "
                    "down; they stay buffered, call flush() again"
                )
            return session.last_seq

    def _left(self, target: int) -> int:
        """Of the first `target` records accepted, how many are not confirmed (or sent, without confirms) yet."""
        session = self._session
        return target - (session.confirmed if session.confirming else session.sent)

    def close(self) -> None:
        """Flush (waiting for confirms), DETACH so the gateway frees the session at once, and stop.
        If the flush fails (raised here), stop at once: what is unconfirmed is dropped."""
        flushed = False
        try:
            if self._io.closed_error is None:
                self.flush()
            flushed = True
        finally:
            self._stop(detach=flushed)

    def abort(self) -> None:
        """Stop at once, dropping what is not confirmed."""
        self._stop(detach=False)

    def _stop(self, *, detach: bool) -> None:
        _open.discard(self._io)
        self._io.stop(detach=detach, join_s=HANDSHAKE_S + self.timeout + 1)  # a DETACH lingers up to `timeout`

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        io = getattr(self, "_io", None)  # absent if the constructor raised early
        if io is None or io not in _open:
            return
        warnings.warn(
            f"Publisher for stream {self.stream!r} was not closed: call close() (or use `with`); "
            "what it holds is delivered in the background and flushed at exit",
            ResourceWarning,
            source=self,
            stacklevel=2,
        )
        io.stop(detach=True, join_s=None)  # still in _open: the exit waits for it


@atexit.register
def _flush_at_exit() -> None:
    """Deliver what Publishers not closed still hold (each within its timeout), and say on stderr what could
    not be: records are never dropped in silence when a script ends without close()."""
    for io in list(_open):
        _open.discard(io)
        session, acc = io.session, io.acc
        io.stop(detach=True, join_s=io.timeout)
        with acc.cond:
            accepted = acc.taken + len(acc.queue)
            done = session.confirmed if session.confirming else session.sent
        if accepted > done:
            what = "confirmed" if session.confirming else "sent"
            print(
                f"zeps: Publisher for stream {session.stream!r} at {session.endpoint}: {accepted - done} records "
                f"could not be {what} before exit (connection {session.step}): call flush() or close() before "
                "exiting, and check the gateway",
                file=sys.stderr,
            )
