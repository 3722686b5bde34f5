"""The Publisher's session with a gateway's ingest, sans-IO: connection states, numbering, the re-send window.

Rules
=====

1. Sans-IO, like `gateway.reconcile`: the IO thread (gateway.client.publisher) feeds every input as an event
   with ``now`` to `handle()` and executes the returned actions in order (`Connect`, `Send`, `Disconnect`,
   `Release`). No sockets, no clocks, no threads, no locks: the IO thread alone calls it; the application
   thread only reads its counters (each an int or a reference, written by the IO thread alone).
2. Every state change is in TRANSITIONS (end of module), in the table form of `gateway.machine`: per
   state the handler of each event (handlers change data, never the state), then the transitions in priority
   order, then the timers. docs/client-sessions.md embeds `describe_transitions()`; a test keeps them equal.
3. Nothing is lost in silence: a batch handed over (`Publish`) is kept until the gateway confirms it (when it
   grants "confirm"), within the buffer the accumulator budgets, and re-sent in order after every new attach.

Theory of operation
===================

DOWN
    No connection. When the backoff deadline passes: `Connect` to the current endpoint (to the ingest the
    directory lists now, when the stream was found by name) and `Send` ATTACH: OPENING.
OPENING
    The shared opening (`gateway.client.opening`) runs ATTACH then EXTEND. OPEN: READY, after checking that a
    gateway which granted confirms before still does (FAILED if not, or if the application asked for confirms
    and none are granted), and re-sending every unconfirmed batch in order. A refusal (INVALID to ATTACH, or a
    CURVE refusal the IO thread's monitor explains) moves to the next endpoint: DOWN; unless this is the first
    attach and every endpoint has refused, which is final: FAILED. "Not the leader" and "retry later" are no
    refusals (that node is up; the group may be electing). No answer by the step's deadline, a drop, or nothing
    listening: DOWN.
READY
    `Publish` numbers the batch's records (FLAG_PRODUCER: this producer's id and the number of its first record),
    sends it as PUBLISH-BATCH (one PUBLISH per record to a gateway that grants no "batch") and keeps it until
    PUBLISH-OK confirms it (confirms may split batches; `Release` frees their bytes). DOWN on a drop, on an
    INVALID that ends the session ("before ATTACH") or sends us elsewhere, on no PUBLISH-OK for
    CONFIRM_STALL_S while batches wait (a new session re-sends them; the gateway drops and confirms those it
    has journaled: exactly once), and when the directory stops listing this endpoint or lists a leader of a
    newer epoch. Any other INVALID is a refusal of what we sent: FAILED.
FAILED
    Final: `error` says why; every event is ignored.
CLOSED
    After `Close` (a DETACH goes out first when READY); every event is ignored.

DOWN waits a backoff that doubles each round of endpoints, with jitter (gateway.client.endpoints).
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass

from gateway import machine
from gateway.client.endpoints import Endpoints
from gateway.client.heartbeat import LONE_IVL_MS, LONE_TIMEOUT_MS, TIMEOUT_MS, Heartbeat
from gateway.client.opening import Opening, Reply, Step, attach_failed, sends_elsewhere, session_lost
from gateway.errors import PublishError
from gateway.transport.connect_retry import ConnectWaits
from gateway.wire import batch as B
from gateway.wire import protocol as P

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
HANDSHAKE_S = 2.0  # longest wait for an ATTACH-OK or EXTEND-OK before trying again
# ... at an endpoint that failed without an answer and has not answered since, the first wait is the group's
# suspicion (the heartbeat's), doubled for each such failure in a row up to HANDSHAKE_S. The publisher leaves a
# paused leader as the followers suspect it, so a follower that has not noticed yet names the paused node as
# the leader; its kernel takes the connection while the process answers nothing, and a 2 s wait there held
# three SIGSTOPs of the leader at 2.3-2.4 s of silence (epgm://, --seed=5202, quiet). The doubling keeps a
# slow but healthy leader (a false suspicion at load) reachable.
SILENT_HANDSHAKE_S = TIMEOUT_MS / 1000
SILENT_HANDSHAKE_WAITS = ConnectWaits(SILENT_HANDSHAKE_S, HANDSHAKE_S)
# A gateway that answers pings but confirms nothing this long while batches wait for it (a reply it dropped, a
# leader holding confirms for a follower that may never come back) gets a new session: the batches are re-sent,
# and it drops and confirms those it has. Far above a group commit or a failover, so it costs a healthy gateway
# nothing; it bounds how long a record can sit unconfirmed on a live connection.
CONFIRM_STALL_S = 5.0
WANTED = (P.FEATURE_BATCH, P.FEATURE_CONFIRM, P.FEATURE_PRODUCER)
HEAD = len(P.head_of(P.PublishBatch, 0))  # a PUBLISH-BATCH frame's bytes before its batch

Record = tuple[int, bytes, bytes, int]  # (ts_ns, key, body, ttl_ms), as the accumulator queues it


class State(enum.Enum):
    DOWN = "down"
    OPENING = "opening"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


# --- events ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tick:
    """Nothing happened but time: deadlines are looked at."""


@dataclass(frozen=True, slots=True)
class Received:
    """A command the gateway sent (decoded)."""

    command: P.Command


@dataclass(frozen=True, slots=True)
class Dropped:
    """The connection ended, could not be made, or carried a frame that does not decode."""

    why: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """During the first attach, the IO thread's monitor explains a silent gateway conclusively (CURVE keys)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Listed:
    """What the directory lists for the stream now: its ingests (a group's nodes, the leader first) and epoch."""

    ingests: tuple[str, ...]
    epoch: int


@dataclass(frozen=True, slots=True)
class Publish:
    """A batch of records the accumulator took, to number and send (only while READY)."""

    records: list[Record]
    payload: int  # their keys' and bodies' bytes: what the buffer budget charged for them
    ttl: bool  # one of them has a TTL


@dataclass(frozen=True, slots=True)
class Close:
    """The application closes: DETACH if READY (`detach`), then nothing more."""

    detach: bool


Event = Tick | Received | Dropped | Rejected | Listed | Publish | Close
EVENT_KINDS = (Tick, Received, Dropped, Rejected, Listed, Publish, Close)

# --- actions --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connect:
    """A fresh socket to `endpoint` (the old one closed). `first`: no attach has succeeded yet, so the IO thread
    watches the handshake for a conclusive refusal (`Rejected`); else it watches for drops only."""

    endpoint: str
    first: bool
    several: bool  # other endpoints to try: a connect that fails (nothing listens) counts as a drop
    connect_timeout_ms: int = 0  # with several: a connect unanswered this long counts as a drop (0: the kernel's)
    heartbeat_ms: tuple[int, int] = (LONE_IVL_MS, LONE_TIMEOUT_MS)  # ZMTP ping interval, timeout (.heartbeat)


@dataclass(frozen=True, slots=True)
class Send:
    frame: bytes | bytearray


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the socket at once."""


@dataclass(frozen=True, slots=True)
class Release:
    """`nbytes` of the buffer budget are free again (confirmed, or sent to a gateway that confirms nothing)."""

    nbytes: int


Action = Connect | Send | Disconnect | Release


@dataclass(slots=True)
class _Sent:
    """One batch sent: kept until confirmed, re-sent after a reconnect."""

    frame: bytes | bytearray  # never changed once built
    count: int
    nbytes: int  # charged to the buffer budget


class IngestSession:
    """One Publisher's session, across reconnects (the module docstring). Its table is TRANSITIONS."""

    def __init__(
        self,
        stream: str,
        endpoints: Endpoints,
        *,
        producer: tuple[int, int],
        confirm: bool,
        attach_s: float,
    ) -> None:
        self.stream = stream
        self.producer_id, self._next_pseq = producer
        self._confirm_required = confirm
        self._attach_s = attach_s  # the first attach to a lone endpoint may wait this long
        self._endpoints = endpoints
        self._heartbeat = Heartbeat()
        assert endpoints.current is not None
        # --- read by the application thread ---
        self.state = State.DOWN
        self.endpoint: str = endpoints.current  # the one in use (or next to try)
        self.features: frozenset[str] = frozenset()
        self.confirming = False  # "confirm" is in features: a plain attribute, read on every batch
        self.error: PublishError | None = None
        self.sent = 0  # records handed to the gateway at least once
        self.confirmed = 0  # records the gateway confirmed as journaled
        self.last_seq: int | None = None  # sequence of the last confirmed record
        self.reconnects = 0
        self.attached_once = False
        # --- the session's own ---
        self.unconfirmed: deque[_Sent] = deque()
        self._head_confirmed = 0  # records of unconfirmed[0] confirmed already
        self._opening: Opening | None = None
        self._listed: Listed | None = None  # the directory's latest listing
        self._epoch = 0  # the newest epoch listed when we last attached
        self._retry_at = 0.0
        self._progress_at = 0.0  # READY: when a confirm last came, or when batches began to wait for one
        self._now = 0.0
        self._out: list[Action] = []
        self._lost: tuple[str, str, bool] | None = None  # (why, the server's hint, answered): go DOWN
        self._failure: PublishError | None = None  # go FAILED
        self._closing = False

    # --- public surface -----------------------------------------------------------------------------

    @property
    def step(self) -> str:
        """The state as the Publisher shows it: down, attaching, extending, ready, failed or closed."""
        if self.state is State.OPENING and self._opening is not None:
            return self._opening.step.value
        return self.state.value

    def wait(self, now: float) -> float | None:
        """Seconds until the next deadline (None: none; events alone move the session)."""
        if self.state is State.DOWN:
            return max(0.0, self._retry_at - now)
        if self.state is State.OPENING and self._opening is not None:
            return max(0.0, self._opening.deadline - now)
        if self.state is State.READY and self.confirming and self.unconfirmed:
            return max(0.0, self._progress_at + CONFIRM_STALL_S - now)
        return None

    def handle(self, event: Event, now: float) -> list[Action]:
        """Feed one event; the actions to execute, in order."""
        if type(event) is Publish and self.state is not State.READY:
            raise RuntimeError(f"a batch handed to the ingest session while {self.state.name}: a bug in the caller")
        self._now, self._out = now, []
        self._lost = None
        self.state = machine.settle(self, TRANSITIONS, self.state, event)
        return self._out

    # --- handlers: they change data, never the state ----------------------------------------------------

    def _note_listing(self, ev: Listed) -> None:
        self._listed = ev

    def _follow_listing(self, ev: Listed) -> None:
        """Leave an ingest the directory no longer lists (its gateway died or moved) for the one it does; a
        connection to a dead host may never fail by itself."""
        self._listed = ev
        if not ev.ingests:
            return
        if self.endpoint not in ev.ingests:
            self._lose(f"{self.endpoint} is no longer listed; {ev.ingests[0]} is")
        elif ev.epoch > self._epoch and ev.ingests[0] != self.endpoint:
            self._lose(f"a new leader at {ev.ingests[0]} (epoch {ev.epoch})")

    def _open_step(self, ev: Received) -> None:
        assert self._opening is not None
        reply = self._opening.handle(ev.command, self._now)
        if isinstance(reply, Reply):
            self._send(P.encode(reply.command))
        if self._opening.step is Step.REFUSED:
            self._refuse(self._opening.reason)

    def _refuse_rejected(self, ev: Rejected) -> None:
        self._refuse(ev.reason)

    def _note_drop(self, ev: Dropped) -> None:
        self._lose(ev.why)

    def _note_departure(self, ev: Dropped) -> None:
        """READY: an attached connection dropped (its heartbeat, most likely): see whether leaving was futile."""
        self._heartbeat.left(self.endpoint, self._now)
        self._lose(ev.why)

    def _take_reply(self, ev: Received) -> None:
        match ev.command:
            case P.PublishOk(sequence=seq, count=n):
                self._take_confirm(seq + n - 1, n)
            case P.Invalid(reason=reason) if session_lost(reason):
                self._lose(f"the gateway ended the session ({reason})")
            case P.Invalid(reason=reason) if sends_elsewhere(reason):
                self._lose(f"the gateway sent us elsewhere ({reason})", hint=reason, answered=True)
            case P.Invalid(reason=reason):
                self._failure = PublishError(f"gateway: {reason}")
            case _:
                pass  # PING-OK, DETACH-OK and answers of an earlier session carry nothing for a publisher

    def _send_batch(self, ev: Publish) -> None:
        records, n = ev.records, len(ev.records)
        if P.FEATURE_BATCH in self.features:
            producer = (self.producer_id, self._next_pseq) if P.FEATURE_PRODUCER in self.features else None
            frame = B.encode_after(HEAD, 0, records, ttl=ev.ttl, producer=producer)  # records copied once, here
            frame[:HEAD] = P.head_of(P.PublishBatch, len(frame) - HEAD)
            kept = [_Sent(frame, n, ev.payload)]
        else:  # plain ZEPS: one PUBLISH per record
            kept = [_Sent(P.encode(P.Publish(kb.decode(), data)), 1, len(kb) + len(data)) for _, kb, data, _ in records]
        self._next_pseq += n
        for sent in kept:
            self._send(sent.frame)
        self.sent += n
        if self.confirming:
            if not self.unconfirmed:
                self._progress_at = self._now
            self.unconfirmed.extend(kept)
        else:
            self._out.append(Release(ev.payload))

    def _request_close(self, ev: Close) -> None:
        self._closing = True
        if ev.detach and self.state is State.READY:
            self._send(P.encode(P.Detach()))

    # --- timers ---------------------------------------------------------------------------------------

    def _watch_opening(self) -> None:
        if self._opening is not None and self._opening.expired(self._now):
            self._lose(f"no {self._opening.waiting_for()} within {self._opening_s():.3g} s")

    def _watch_confirms(self) -> None:
        if self.confirming and self.unconfirmed:
            stalled = self._now - self._progress_at
            if stalled >= CONFIRM_STALL_S:
                self._lose(f"no PUBLISH-OK for {stalled:.1f} s")

    # --- guards ---------------------------------------------------------------------------------------

    def _close_requested(self) -> bool:
        return self._closing

    def _backoff_over(self) -> bool:
        return self._now >= self._retry_at

    def _failed(self) -> bool:
        return self._failure is not None

    def _dropped(self) -> bool:
        return self._lost is not None

    def _opened(self) -> bool:
        return self._opening is not None and self._opening.step is Step.OPEN

    def _opened_without_confirms(self) -> bool:
        """Open, but without the confirms this Publisher needs (asked for, or granted before a restart)."""
        assert self._opening is not None or not self._opened()
        return (
            self._opened()
            and P.FEATURE_CONFIRM not in self._opening.features  # type: ignore[union-attr]
            and (self._confirm_required or (self.attached_once and self.confirming))
        )

    # --- actions on the way ---------------------------------------------------------------------------

    def _connect(self) -> None:
        """DOWN -> OPENING: a fresh socket (nothing of the old session's pipes survives), ATTACH sent, to the
        ingest the directory lists now when the stream was found by name."""
        listed = self._listed
        if listed is not None and listed.ingests:
            for ingest in listed.ingests:  # a group's nodes, to try in turn
                self._endpoints.add(ingest)
            leader = listed.ingests[0]
            if leader != self.endpoint and (self.endpoint not in listed.ingests or listed.epoch > self._epoch):
                log.info("publisher %016x: %s is at %s now (directory)", self.producer_id, self.stream, leader)
                self._endpoints.move_to(leader)
                self.endpoint = leader
            self._epoch = listed.epoch
        several = self._endpoints.several
        timeout = self._endpoints.connect_timeout_ms if several else 0
        heartbeat = self._heartbeat.ms(several, self.endpoint, self._now)
        self._out.append(Connect(self.endpoint, not self.attached_once, several, timeout, heartbeat))
        self._opening = Opening(self.stream, WANTED, attach_s=self._opening_s(), extend_s=HANDSHAKE_S)
        self._send(P.encode(self._opening.start(self._now)))

    def _resend(self) -> None:
        """Attached: re-send every unconfirmed batch, in order; the gateway drops those it has journaled."""
        assert self._opening is not None
        self.features = self._opening.features
        self.confirming = P.FEATURE_CONFIRM in self.features
        self._opening = None
        self._head_confirmed = 0  # a re-sent batch is confirmed whole
        self._progress_at = self._now
        for kept in self.unconfirmed:
            self._send(kept.frame)
        self._endpoints.succeeded()
        if self._heartbeat.attached(self.endpoint, self._now):
            log.info(
                "publisher %016x: back at %s, which it had left: heartbeat timeout %d ms from now on",
                self.producer_id,
                self.endpoint,
                self._heartbeat.ms(self._endpoints.several, self.endpoint, self._now)[1],
            )
        if self.attached_once:
            log.info(
                "publisher %016x: attached again at %s, %d batches re-sent",
                self.producer_id,
                self.endpoint,
                len(self.unconfirmed),
            )
        self.attached_once = True

    def _retry(self) -> None:
        """-> DOWN: close the socket; try the next endpoint after a backoff that doubles each round of them up to
        BACKOFF_MAX_S, with jitter (gateway.client.endpoints)."""
        assert self._lost is not None
        why, hint, answered = self._lost
        self._lost = None
        self._opening = None
        self._out.append(Disconnect())
        failed = self.endpoint
        delay = self._endpoints.failed(hint, answered=answered)
        self._retry_at = self._now + delay
        self.reconnects += 1
        self.endpoint = self._endpoints.current or failed
        log.info(
            "publisher %016x on %s: %s; attaching at %s in %.2f s (%d batches unconfirmed)",
            self.producer_id,
            failed,
            why,
            self.endpoint,
            delay,
            len(self.unconfirmed),
        )

    def _fail(self) -> None:
        self.error = self._failure
        self._opening = None

    def _fail_without_confirms(self) -> None:
        if self.attached_once and self.confirming:
            self.error = PublishError("the gateway no longer grants publish confirms after its restart")
        else:
            self.error = PublishError(f"the gateway at {self.endpoint} does not grant publish confirms")
        self._opening = None

    def _shut(self) -> None:
        self._opening = None

    # --- helpers --------------------------------------------------------------------------------------

    def _refuse(self, reason: str) -> None:
        """The current endpoint refused ATTACH: the next one is tried, unless this is the first attach and every
        endpoint has refused, which is final."""
        if session_lost(reason):
            self._lose(f"the gateway ended the session ({reason})")
        elif sends_elsewhere(reason):
            self._lose(f"ATTACH sent elsewhere ({reason})", hint=reason, answered=True)
        elif not self._endpoints.refused(reason) or self.attached_once:
            self._lose(f"ATTACH refused ({reason})", hint=reason)
        elif self._endpoints.several:
            refusals = self._endpoints.refused_text()
            self._failure = PublishError(f"ATTACH to stream {self.stream!r}: every endpoint refused: {refusals}")
        else:
            self._failure = PublishError(attach_failed(self.stream, self.endpoint, reason))

    def _lose(self, why: str, *, hint: str = "", answered: bool = False) -> None:
        if self._lost is None:
            self._lost = (why, hint, answered)

    def _take_confirm(self, last_seq: int, n: int) -> None:
        self._progress_at = self._now
        freed = 0
        left = n
        while left and self.unconfirmed:
            head = self.unconfirmed[0]
            take = min(left, head.count - self._head_confirmed)
            self._head_confirmed += take
            left -= take
            if self._head_confirmed == head.count:
                self.unconfirmed.popleft()
                self._head_confirmed = 0
                freed += head.nbytes
        self.confirmed += n - left
        self.last_seq = last_seq
        if freed:
            self._out.append(Release(freed))

    def _opening_s(self) -> float:
        """The first attach to a lone endpoint may wait the whole timeout; with others to try, each gets
        HANDSHAKE_S, and one that failed without an answer in its last tries SILENT_HANDSHAKE_S doubled per try."""
        if not self._endpoints.several:
            return HANDSHAKE_S if self.attached_once else self._attach_s
        misses = self._endpoints.unanswered(self.endpoint)
        return SILENT_HANDSHAKE_WAITS.after(misses - 1) if misses else HANDSHAKE_S

    def _send(self, frame: bytes | bytearray) -> None:
        self._out.append(Send(frame))


# --- the transition table -------------------------------------------------------------------------------

Go = machine.Go[IngestSession, State]
Row = machine.Row[IngestSession, State]
S = IngestSession
_CLOSE = Go(S._close_requested, State.CLOSED, S._shut)
_FAIL = Go(S._failed, State.FAILED, S._fail)
_RETRY = Go(S._dropped, State.DOWN, S._retry)

TRANSITIONS: dict[State, Row] = {
    State.DOWN: Row(
        on={Tick: None, Listed: S._note_listing, Close: S._request_close},
        go=(_CLOSE, Go(S._backoff_over, State.OPENING, S._connect)),
    ),
    State.OPENING: Row(
        on={
            Tick: None,
            Received: S._open_step,
            Dropped: S._note_drop,
            Rejected: S._refuse_rejected,
            Listed: S._follow_listing,
            Close: S._request_close,
        },
        go=(
            _CLOSE,
            _FAIL,
            _RETRY,
            Go(S._opened_without_confirms, State.FAILED, S._fail_without_confirms),
            Go(S._opened, State.READY, S._resend),
        ),
        timers=(S._watch_opening,),
    ),
    State.READY: Row(
        on={
            Tick: None,
            Received: S._take_reply,
            Dropped: S._note_departure,
            Listed: S._follow_listing,
            Publish: S._send_batch,
            Close: S._request_close,
        },
        go=(_CLOSE, _FAIL, _RETRY),
        timers=(S._watch_confirms,),
    ),
    State.FAILED: Row(on={}),
    State.CLOSED: Row(on={}),
}
del S


def describe_transitions() -> str:
    """TRANSITIONS as Markdown (docs/client-sessions.md embeds it; a test keeps them equal)."""
    return machine.describe(TRANSITIONS, EVENT_KINDS)
