"""One replay client's ZEPS session, sans-IO: commands in, frames out, positions in the journal in between.

The socket loop (gateway.replay) owns the ROUTER socket; a Session owns everything else about one client:
its granted extensions, its credit, its subscription and its outstanding FETCHes, each a _Feed holding a
journal cursor and a sequence position, and a snapshot in progress (gateway.sidecar.snapshots.SnapshotFeed).
Frames are produced lazily, one step (at most one journal batch) at a time, only while the client has
credit, so a client that stops granting credit costs a cursor and a position, never a growing buffer: at most
one step's frames wait in `out` for credit or for the socket.

Two queues keep the order the protocol needs without letting flow control hold up liveness:
`replies` (answers to commands: ATTACH-OK, SUBSCRIBE-OK, PING-OK, INVALID...) always go first and cost no
credit; `out` is the delivery stream (DELIVER / DELIVER-BATCH, and TRIMMED / FETCH-END in their place
between them), sent in order, data frames only while credit is positive.

Commands
========

The socket loop answers a client without a session (gateway.wire.handshake.detached) and every ATTACH (it
opens the stream's journal); a Session takes every other command with `handle(cmd, now)`, by the rules:

1. Every command but EXTEND ends the handshake's negotiation (gateway.wire.handshake); EXTEND is answered there.
2. Every rule is a handler in TRANSITIONS (end of module), in the table form of `gateway.machine`, per command
   kind: credit, subscriptions (from a sequence or a time), fetches, snapshots, pings; PUBLISH and
   PUBLISH-BATCH are the gateway's, named in the answer; a command that needs an extension not granted is
   refused naming it; a command servers send, or any other, is refused. DETACH ends the session: DETACHED, and
   the loop drops it after sending DETACH-OK. docs/replay.md embeds `describe_transitions()`; a test keeps
   them equal.
3. Every refusal is an INVALID in `replies`, and `handle` returns False.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from enum import Enum
from typing import NamedTuple, Protocol

from gateway import machine
from gateway.errors import JournalTrimmed
from gateway.sidecar.snapshots import Frozen, SnapshotFeed
from gateway.wire import batch as B
from gateway.wire import handshake as H
from gateway.wire import protocol as P
from gateway.wire import tail as T

GRANTABLE = frozenset({P.FEATURE_BATCH, P.FEATURE_RANGE, P.FEATURE_TIME, P.FEATURE_UNCOMMITTED})
_TRIM_RETRIES = 3  # retention racing a reader can trim it again at once; more than this is a runaway


class Phase(Enum):
    ATTACHED = "attached"
    DETACHED = "detached"  # DETACH came: the loop sends DETACH-OK and drops the session


class Cursor(Protocol):
    def next_batch(self) -> B.Batch | None: ...

    def close(self) -> None: ...


class Journal(Protocol):
    """What a session needs of gateway.journal.JournalReader (a protocol, so tests can fake it)."""

    @property
    def first_seq(self) -> int: ...

    @property
    def last_seq(self) -> int: ...

    def seq_for_time(self, ts_ns: int) -> int: ...

    def cursor(self, from_seq: int) -> Cursor: ...

    def unbounded(self) -> Journal: ...


class Sent(NamedTuple):
    """What popping one frame meant, for the server's metrics."""

    data_bytes: int  # credit charged (0 for a control frame)
    records: int
    credit_stall: bool  # this frame used up the credit while more was waiting to be sent


class Turn:
    """One client's share of one turn of the socket loop: at most `frames` frames, and none begun once `deadline`
    (a time.monotonic() value) has passed, so that one big answer (a long FETCH of large batches) holds the other
    clients and the loop's timers no longer than that. The first frame is always allowed: every ready client
    moves at each turn."""

    __slots__ = ("deadline", "frames", "served")

    def __init__(self, frames: int, deadline: float) -> None:
        self.frames, self.deadline, self.served = frames, deadline, 0

    def allows(self, now: float) -> bool:
        """Whether another frame may be served at `now`; the caller counts it in `served` once it went."""
        return self.served == 0 or (self.served < self.frames and now < self.deadline)


class _Out(NamedTuple):
    frame: bytes
    charge: int
    records: int
    feed: _Feed | SnapshotFeed


class _Feed:
    """One ordered delivery: the subscription (open-ended, follows the tail) or one FETCH (bounded).

    Invariant: every record below `next_seq` (and within the feed) that matches has been produced.
    """

    __slots__ = (
        "at_end",
        "batch_end",
        "cursor",
        "first",
        "gap",
        "last",
        "next_seq",
        "prefixes",
        "records",
        "request_id",
    )

    def __init__(self, prefixes: tuple[bytes, ...], first: int, last: int, request_id: int | None) -> None:
        self.prefixes = prefixes
        self.first = first  # echoed in FETCH-END
        self.last = last
        self.request_id = request_id  # None for the subscription
        self.cursor: Cursor | None = None
        self.records: Iterator[tuple[int, int, memoryview, memoryview]] | None = None  # rest of a batch (DELIVER)
        self.batch_end = 0  # last sequence `records` covers
        self.gap: tuple[int, int, int] | None = None  # (first, last, ts): coverage holding nothing for the client
        self.at_end = False  # the subscription is at the journal's current end
        self.next_seq = first

    @property
    def done(self) -> bool:
        return self.next_seq > self.last

    def close(self) -> None:
        """Release the cursor's file; the feed keeps its position and reopens one if read again."""
        if self.cursor is not None:
            self.cursor.close()
            self.cursor = None

    def matches(self, key: memoryview) -> bool:
        return not self.prefixes or key.tobytes().startswith(self.prefixes)


def _prefixes(pattern: str) -> tuple[bytes, ...]:
    """ZEPS patterns are key prefixes; the empty pattern matches everything."""
    return (pattern.encode(),) if pattern else ()


def trim(batch: B.Batch, lo: int, hi: int) -> B.Batch:
    """The records lo..hi of a journal batch, as a batch covering exactly lo..hi, journal time and TTLs kept.

    Journal batches are dense (JournalWriter.append sequences them with batch.resequence, which accepts
    dense batches only), so `Batch.part` can cut them by sequence.
    """
    return B.Batch.parse(batch.part(lo, hi), check_crc=False)


class Session:
    """A client attached to one stream. The server calls handle() per command and peek()/pop() to send."""

    def __init__(
        self,
        identity: bytes,
        stream: str,
        journal: Journal,
        *,
        max_fetches: int,
        now: float,
        snapshots: Callable[[], Frozen | None] | None = None,
        tail: bool = False,
    ) -> None:
        """`snapshots` freezes the stream's snapshot index (None: this server grants no 'snapshot'); `tail`: this
        server grants 'datagram-tail' (TAIL-UDP; the loop sends the datagrams, gateway.sidecar.tail)."""
        self.identity = identity
        self.stream = stream
        self.journal = journal
        self.max_fetches = max_fetches
        self.snapshots = snapshots
        self.tail_offered = tail
        self.tail_asked: tuple[int, int, T.Redundancy] | None = None  # TAIL-UDP's (port, token, redundancy)
        self.handshake = H.Handshake(self._grants)  # ATTACH-OK is sent: EXTEND may come (gateway.wire.handshake)
        self.phase = Phase.ATTACHED
        self.credit = 0
        self.last_heard = now
        self.pinged_at = 0.0  # when the server last PINGed this client, 0.0 after the client spoke
        self.sub: _Feed | None = None
        self.fetches: deque[_Feed] = deque()
        self.snap: SnapshotFeed | None = None
        self.replies: deque[bytes] = deque([P.encode(P.AttachOk())])
        self.out: deque[_Out] = deque()
        self._reads_left = 0
        self._accepted = True
        self._detaching = False

    def __repr__(self) -> str:
        where = f"sub@{self.sub.next_seq}" if self.sub else "no sub"
        fetches = len(self.fetches)
        return f"Session({self.identity.hex()}, {self.stream!r}, {where}, {fetches} fetches, credit {self.credit})"

    # --- commands -------------------------------------------------------------------------------------

    def handle(self, cmd: P.Command, now: float) -> bool:
        """Apply one command from the client (the rules above); False if it was answered with INVALID."""
        self.last_heard, self.pinged_at, self._accepted = now, 0.0, True
        kind = KINDS.of(cmd)
        if kind is not P.Extend:
            self.handshake.on(cmd)  # rule 1: the negotiation is over; the handshake passes it on
        self.phase = machine.settle(self, TRANSITIONS, self.phase, cmd, kind)
        return self._accepted

    # --- handlers, in TRANSITIONS: the rules ------------------------------------------------------------

    def _extend(self, cmd: P.Extend) -> None:
        answer = self.handshake.on(cmd)
        assert answer is not None
        if answer.accepted and P.FEATURE_UNCOMMITTED in self.features:  # a follower gateway: past the mark
            self.journal = self.journal.unbounded()
        self.replies.append(P.encode(answer.reply))
        self._accepted = answer.accepted

    def _add_credit(self, cmd: P.Credit) -> None:
        self.credit += cmd.credit

    def _subscribe_from_seq(self, cmd: P.Subscribe) -> None:
        # latest = 0: "I have nothing", start at the first retained record, which is no loss.
        self._subscribe(cmd.pattern, cmd.latest + 1 if cmd.latest else max(1, self.journal.first_seq))

    def _subscribe_from_time(self, cmd: P.SubscribeTime) -> None:
        if self._granted(cmd):
            self._subscribe(cmd.pattern, max(1, self.journal.seq_for_time(cmd.since_ns)))

    def _fetch(self, cmd: P.Fetch) -> None:
        if not self._granted(cmd):
            return
        rid, first, last = cmd.request_id, cmd.first, cmd.last
        if len(self.fetches) >= self.max_fetches:
            self._invalid(f"FETCH {rid}: {self.max_fetches} fetches outstanding already; wait for a FETCH-END")
        elif first > last:
            self._invalid(f"FETCH {rid}: first {first} is after last {last}")
        else:
            self.fetches.append(_Feed(_prefixes(cmd.pattern), first or max(1, self.journal.first_seq), last, rid))

    def _snapshot(self, cmd: P.Snapshot) -> None:
        """Replace any snapshot in progress (its unsent frames are dropped with it), as SUBSCRIBE does."""
        if not self._granted(cmd):
            return
        old = self.snap
        if old is not None:
            self.out = deque(o for o in self.out if o.feed is not old)
        assert self.snapshots is not None  # 'snapshot' is granted only with a source
        self.snap = SnapshotFeed(self.snapshots, tuple(p.encode() for p in cmd.prefixes))

    def _tail_udp(self, cmd: P.TailUdp) -> None:
        """Ask the loop for a datagram tail to this session's own peer (it replaces any earlier one)."""
        if not self._granted(cmd):
            return
        try:
            redundancy = T.Redundancy.parse(cmd.mode)
        except ValueError as exc:
            self._invalid(f"TAIL-UDP: {exc}")
            return
        if cmd.port == 0:
            self._invalid("TAIL-UDP: port 0; give the UDP port the datagrams are to reach at your address")
            return
        self.tail_asked = (cmd.port, cmd.token, redundancy)

    def _pong(self, cmd: P.Ping) -> None:
        self.replies.append(P.encode(P.PingOk()))

    def _detach(self, cmd: P.Detach) -> None:
        self._detaching = True

    def _send_to_gateway(self, cmd: P.Command) -> None:
        self._invalid("this is the replay sidecar: publish to the gateway's ingest endpoint")

    def _refuse_command(self, cmd: P.Command) -> None:
        if cmd.SENDER == "server":
            self._invalid(f"{cmd.NAME} is sent by servers, not clients")
        elif self._granted(cmd):
            self._invalid(f"{cmd.NAME} is not expected here")

    # --- guards, in TRANSITIONS -------------------------------------------------------------------------

    def _detach_asked(self) -> bool:
        return self._detaching

    # --- the handlers' parts ----------------------------------------------------------------------------

    def _granted(self, cmd: P.Command) -> bool:
        """Whether the extension `cmd` needs (if any) was granted; if not, it is refused naming it."""
        if cmd.FEATURE is None or cmd.FEATURE in self.features:
            return True
        self._invalid(
            f"{cmd.NAME} needs the '{cmd.FEATURE}' extension: send EXTEND(['{cmd.FEATURE}']) right after ATTACH-OK"
        )
        return False

    @property
    def features(self) -> frozenset[str]:
        return self.handshake.features

    def _grants(self, wanted: frozenset[str]) -> frozenset[str]:
        """What this sidecar grants: snapshots only with batches (they come in batches) and a snapshot source."""
        granted = GRANTABLE.intersection(wanted)
        if self.snapshots is not None and P.FEATURE_BATCH in granted:
            granted |= {P.FEATURE_SNAPSHOT}.intersection(wanted)
        if self.tail_offered:
            granted |= {P.FEATURE_TAIL}.intersection(wanted)
        return granted

    def _invalid(self, reason: str) -> None:
        self.replies.append(P.invalid(reason))
        self._accepted = False

    def _subscribe(self, pattern: str, start: int) -> None:
        """Replace any subscription; frames of the old one that are not sent yet are dropped with it."""
        old = self.sub
        if old is not None:
            old.close()
            self.out = deque(o for o in self.out if o.feed is not old)
        self.sub = _Feed(_prefixes(pattern), start, B.MAX_SEQ, None)
        self.replies.append(P.encode(P.SubscribeOk()))

    def close(self) -> None:
        """The session is over: release every cursor."""
        for feed in (self.sub, *self.fetches):
            if feed is not None:
                feed.close()

    def ping(self, now: float) -> None:
        self.pinged_at = now
        self.replies.append(P.encode(P.Ping()))

    # --- output ---------------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """Whether reading the journal could produce something (given credit)."""
        return bool(self.fetches) or self.snap is not None or (self.sub is not None and not self.sub.at_end)

    @property
    def ready(self) -> bool:
        """Whether peek() could return a frame now."""
        if self.replies:
            return True
        if self.out:
            return self.out[0].charge == 0 or self.credit > 0
        return self.credit > 0 and self.has_work

    @property
    def at_tail(self) -> bool:
        """The subscription has read everything the journal held when it last looked."""
        return self.sub is not None and self.sub.at_end

    @property
    def tailing(self) -> bool:
        """At the tail with credit to spend: worth another look when the journal may have grown."""
        return self.at_tail and self.credit > 0 and not self.fetches and not self.out

    def wake(self) -> None:
        """The journal may have grown: let the subscription read again."""
        if self.sub is not None:
            self.sub.at_end = False

    def begin_turn(self, reads: int) -> None:
        """Allow this many journal reads before the next turn: bounded work per client per loop turn."""
        self._reads_left = reads

    def peek(self) -> bytes | None:
        """The next frame that may be sent now, producing it from the journal if needed; None if none."""
        if self.replies:
            return self.replies[0]
        while not self.out:
            if self.credit <= 0 or self._reads_left <= 0 or not self.has_work:
                return None
            feed = self.fetches[0] if self.fetches else self.snap or self.sub
            assert feed is not None  # has_work
            self._step(feed)
        head = self.out[0]
        return head.frame if head.charge == 0 or self.credit > 0 else None

    def pop(self) -> Sent:
        """The frame peek() returned was sent: charge credit for it."""
        if self.replies:
            self.replies.popleft()
            return Sent(0, 0, False)
        head = self.out.popleft()
        if not head.charge:
            return Sent(0, 0, False)
        self.credit = max(0, self.credit - head.charge)  # an overshoot is forgiven: one grant, one message at least
        stalled = self.credit == 0 and (bool(self.out) or self.has_work)
        return Sent(head.charge, head.records, stalled)

    # --- producing ------------------------------------------------------------------------------------

    def _emit(self, feed: _Feed | SnapshotFeed, cmd: P.Command, records: int = 0) -> None:
        frame = P.encode(cmd)
        self.out.append(_Out(frame, len(frame) if isinstance(cmd, P.Deliver | P.DeliverBatch) else 0, records, feed))

    def _step(self, feed: _Feed | SnapshotFeed) -> None:
        """Produce the next frames of `feed`: reads at most one journal batch (or one snapshot batch)."""
        if isinstance(feed, SnapshotFeed):
            self._step_snapshot(feed)
        elif P.FEATURE_BATCH in self.features:
            self._step_batch(feed)
        else:
            self._step_plain(feed)

    def _read(self, feed: _Feed) -> B.Batch | None:
        """The next journal batch of `feed`, None at the journal's current end. Handles retention: the
        feed continues at the first retained sequence; a client with 'range' is told so by TRIMMED."""
        self._reads_left -= 1
        for _ in range(_TRIM_RETRIES):
            try:
                if feed.cursor is None:
                    feed.cursor = self.journal.cursor(feed.next_seq)
                batch = feed.cursor.next_batch()
                if batch is None and feed.request_id is not None:
                    # A FETCH ends at the head: take the head, then make sure the cursor is there too.
                    head = self.journal.last_seq
                    batch = feed.cursor.next_batch()
                    if batch is None:
                        feed.last = min(feed.last, feed.next_seq - 1, head)
                return batch
            except JournalTrimmed as exc:
                # Reopen at the first retained sequence rather than trust where the failed cursor stands.
                feed.close()
                self._flush_gap(feed)
                if P.FEATURE_RANGE in self.features:
                    self._emit(feed, P.Trimmed(feed.next_seq, exc.first_retained))
                feed.next_seq, feed.records = max(feed.next_seq, exc.first_retained), None
        raise RuntimeError(f"stream {self.stream!r}: retention trimmed under a reader {_TRIM_RETRIES} times")

    def _at_end(self, feed: _Feed) -> None:
        self._flush_gap(feed)
        if feed.request_id is None:
            feed.at_end = True
        else:
            self._emit(feed, P.FetchEnd(feed.request_id, feed.first, feed.last))
            self.fetches.popleft().close()

    def _step_batch(self, feed: _Feed) -> None:
        batch = None if feed.done else self._read(feed)
        if batch is None:
            if feed.done or feed.request_id is None:
                self._at_end(feed)
            return
        lo, hi = max(feed.next_seq, batch.first_seq), min(batch.last_seq, feed.last)
        if lo <= hi:
            part = batch if (lo, hi) == (batch.first_seq, batch.last_seq) else trim(batch, lo, hi)
            self._deliver_batch(feed, part)
        feed.next_seq = max(feed.next_seq, hi + 1)
        if feed.done and feed.request_id is not None:
            self._at_end(feed)

    def _deliver_batch(self, feed: _Feed, part: B.Batch) -> None:
        if not feed.prefixes:
            self._flush_gap(feed)
            self._emit(feed, P.DeliverBatch(part.buf), part.count)
            return
        data = part.select(feed.prefixes)
        count = B.HEADER.unpack_from(data)[5]
        if count == 0:  # nothing for this client: merge into one empty batch rather than send one per batch
            first = feed.gap[0] if feed.gap else part.first_seq
            feed.gap = (first, part.last_seq, part.ts_ns)
            return
        self._flush_gap(feed)
        self._emit(feed, P.DeliverBatch(data), count)

    def _flush_gap(self, feed: _Feed) -> None:
        if feed.gap is not None:
            self._emit(feed, P.DeliverBatch(B.empty(*feed.gap)))
            feed.gap = None

    def _step_snapshot(self, feed: SnapshotFeed) -> None:
        """The next snapshot batch; SNAPSHOT-END after the last. Nothing while the index is being built."""
        self._reads_left -= 1
        part = feed.step()
        if part is not None:
            self._emit(feed, P.DeliverBatch(part[0]), part[1])
        elif feed.done:
            self._emit(feed, P.SnapshotEnd(feed.last, feed.records))
            self.snap = None

    def _step_plain(self, feed: _Feed) -> None:
        """One DELIVER (or none, after scanning the rest of a batch that holds nothing for the client)."""
        if feed.records is None:
            batch = None if feed.done else self._read(feed)
            if batch is None:
                if feed.done or feed.request_id is None:
                    self._at_end(feed)
                return
            feed.records = batch.raw(feed.next_seq, feed.last)
            feed.batch_end = min(batch.last_seq, feed.last)
        for seq, _, key, body in feed.records:
            feed.next_seq = seq + 1
            if feed.matches(key):
                self._emit(feed, P.Deliver(seq, key.tobytes().decode(errors="replace"), body), 1)
                break
        else:
            feed.records = None
            feed.next_seq = max(feed.next_seq, feed.batch_end + 1)
        if feed.done and feed.request_id is not None:
            self._at_end(feed)


# --- the command table -----------------------------------------------------------------------------------

Go = machine.Go[Session, Phase]
Row = machine.Row[Session, Phase]
S = Session
KINDS = H.CommandKinds(
    P.Extend, P.Credit, P.Subscribe, P.SubscribeTime, P.Fetch, P.Snapshot, P.Ping, P.PingOk, P.Publish,
    P.PublishBatch, P.Detach, P.TailUdp,
)  # fmt: skip
EVENT_KINDS = KINDS.events

TRANSITIONS: dict[Phase, Row] = {
    Phase.ATTACHED: Row(
        on={
            P.Extend: S._extend,
            P.Credit: S._add_credit,
            P.Subscribe: S._subscribe_from_seq,
            P.SubscribeTime: S._subscribe_from_time,
            P.Fetch: S._fetch,
            P.Snapshot: S._snapshot,
            P.Ping: S._pong,
            P.PingOk: None,
            P.Publish: S._send_to_gateway,
            P.PublishBatch: S._send_to_gateway,
            P.Detach: S._detach,
            P.TailUdp: S._tail_udp,
            P.Command: S._refuse_command,
        },
        go=(Go(S._detach_asked, Phase.DETACHED),),
    ),
    Phase.DETACHED: Row(on={}),
}
del S


def describe_transitions() -> str:
    """TRANSITIONS as Markdown (docs/replay.md embeds it; a test keeps them equal)."""
    return KINDS.describe(TRANSITIONS)
