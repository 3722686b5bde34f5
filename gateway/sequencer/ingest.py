"""The gateway's ingest rules, sans-IO: a ZEPS publisher session per ROUTER identity, commands in, actions out.

Rules
=====

1. Sans-IO, like gateway.reconcile: the gateway's loop decodes each command and passes it with ``now`` to
   `Ingest.handle(identity, cmd, now)`, then executes the returned actions in order, without calling the core
   again while it does. No sockets, no clocks. What the core must know of the node it asks its `Gate` (does
   this node take publishes; does it refuse them for want of in-sync followers) and of a stream its lane's
   producer table (exactly-once publishing).
2. Every rule is a handler in TRANSITIONS (end of module), in the table form of `gateway.machine`: per session
   state the handler of each command kind, then the transitions (a session made, a session ended).
   docs/gateway.md embeds `describe_transitions()`; a test keeps them equal.
3. A command meets the refusals in this order:
   a. a node that does not lead refuses ATTACH, PUBLISH and PUBLISH-BATCH (`not-leader`; the reason may name
      the leader);
   b. a client without a session gets the handshake's answer (`gateway.wire.handshake.detached`: PING-OK for
      PING, INVALID naming ATTACH for anything else);
   c. an attached client's command goes through its session's handshake, which answers EXTEND;
   d. a leader that holds all the uncommitted batches it may and has too few in-sync followers to commit them
      refuses PUBLISH and PUBLISH-BATCH (`uncommitted`): waiting would not end by itself;
   e. a stream served as a mirror of another site's (docs/mirroring.md) refuses ordinary PUBLISH and
      PUBLISH-BATCH (`mirror`): its records come from its mirror session only;
   f. a record or a batch over the size limit is refused; a PUBLISH-BATCH (with 'batch' granted) must be a
      dense, non-empty batch numbered from 0, with a producer header only under 'producer', and continue its
      producer where the journal has it (`out-of-order` otherwise: the client re-sends from the gap);
   g. a mirror session's MIRROR, PROMOTE and PUBLISH-BATCH (after a and d for the batch) go to the stream's
      mirror rules (gateway.sequencer.mirroring), which the gateway applies: they need the journal's head and
      its promotion record;
   h. SUBSCRIBE, SUBSCRIBE-TIME, FETCH and CREDIT are the replay sidecar's, named in the answer; anything else
      is not allowed here.
4. Never silent: every refusal is a `Refuse` action, counted by its kind and answered with INVALID.
5. Bounded: an ATTACH beyond `max_clients` first ends the sessions silent for `client_timeout` (ROUTER sockets
   never say a peer left); if none was, it is refused.

Theory of operation
===================

DETACHED
    The identity has no session. An accepted ATTACH (ZEPS version, a stream this gateway serves, room for one
    more client) makes one, answered ATTACH-OK: ATTACHED.
ATTACHED
    A session on one stream with its own handshake. PUBLISH queues a record on the stream's lane (`Enqueue`);
    PUBLISH-BATCH has its batch sequenced whole (`Sequence`); both are owed PUBLISH-OK when 'confirm' was
    granted. PING gets PING-OK. A second ATTACH starts over (perhaps on another stream). DETACH ends the session,
    answered DETACH-OK (not owed: see `Reply.owed`): DETACHED. An EXTEND that is granted 'mirror': MIRRORING.
MIRRORING
    The session of `zeps mirror`, writing another site's stream here sequence for sequence: MIRROR (where to
    resume), PROMOTE and its PUBLISH-BATCHes are the stream's mirror rules' to judge (`Mirror`). A second
    ATTACH starts over as a publisher: ATTACHED; DETACH: DETACHED.

A node that steps down ends every session with its reason (`end_all`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Protocol

from gateway import machine
from gateway.sequencer.config import GatewayConfig
from gateway.sequencer.producers import ProducerTable
from gateway.wire import batch as B
from gateway.wire import handshake as H
from gateway.wire import protocol as P
from gateway.wire.reasons import retry_later

log = logging.getLogger(__name__)

GRANTABLE = frozenset({P.FEATURE_BATCH, P.FEATURE_CONFIRM, P.FEATURE_PRODUCER, P.FEATURE_MIRROR})


class Phase(Enum):
    DETACHED = "detached"
    ATTACHED = "attached"
    MIRRORING = "mirroring"


class Gate(Protocol):
    """What the core asks of the node: why it refuses publishes now, if it does."""

    def refusal(self) -> str | None:
        """Why this node takes no ATTACH or publish (it does not lead), or None."""

    def uncommitted_refusal(self) -> str | None:
        """Why publishes are refused for want of in-sync followers (rule 3d), or None."""

    def mirror_refusal(self, stream: str) -> str | None:
        """Why an ordinary publisher may not write `stream`, a mirror's (rule 3e), or None."""


class LaneView(Protocol):
    """What the core reads of a stream's lane."""

    producers: ProducerTable


# --- actions: the gateway executes them in order ----------------------------------------------------------


class Reply(NamedTuple):
    """Send `command` to the client."""

    identity: bytes
    command: P.Command

    @property
    def owed(self) -> bool:
        """False for an answer nothing waits on (PING-OK, DETACH-OK): a client may be gone before it goes (a
        readiness probe that stopped at its first PING-OK, a publisher that closes right after DETACH), and a
        reply to a client that left normally is not a dropped reply."""
        return not isinstance(self.command, (P.PingOk, P.DetachOk))


class Refuse(NamedTuple):
    """Send INVALID(reason); count it under `kind` (None: the node's doing, not the client's: not counted)."""

    identity: bytes
    reason: str
    kind: str | None = "invalid"


class Joined(NamedTuple):
    """A publisher session began on `stream`."""

    stream: str


class Left(NamedTuple):
    """A publisher session on `stream` ended."""

    stream: str


class Enqueue(NamedTuple):
    """Queue one record (a PUBLISH) on the stream's lane; the client is owed a confirm if `confirm`."""

    identity: bytes
    stream: str
    key: bytes
    body: bytes
    confirm: bool


class Sequence(NamedTuple):
    """Sequence and journal `batch` (a PUBLISH-BATCH, checked); the client is owed a confirm if `confirm`."""

    identity: bytes
    stream: str
    batch: B.Batch
    confirm: bool


class Mirror(NamedTuple):
    """A mirror session's MIRROR, PROMOTE or PUBLISH-BATCH on `stream`, for its mirror rules (rule 3g); the
    client is owed a confirm of an accepted batch if `confirm`."""

    identity: bytes
    stream: str
    command: P.Command
    confirm: bool


Action = Reply | Refuse | Joined | Left | Enqueue | Sequence | Mirror


@dataclass(slots=True)
class _Session:
    """One publisher connection, known by its ROUTER identity."""

    stream: str
    last_seen: float
    handshake: H.Handshake = field(default_factory=lambda: H.Handshake(GRANTABLE.intersection))


class Ingest:
    """Every publisher session of one gateway (the module docstring). Its table is TRANSITIONS."""

    def __init__(self, config: GatewayConfig, gate: Gate, lanes: Mapping[str, LaneView]) -> None:
        self.config = config
        self.gate = gate
        self.lanes = lanes
        self.sessions: dict[bytes, _Session] = {}
        self._identity = b""
        self._session: _Session | None = None
        self._now = 0.0
        self._out: list[Action] = []

    def handle(self, identity: bytes, cmd: P.Command, now: float) -> list[Action]:
        """One decoded command from `identity`: the actions to execute, in order. Its phase is whether it has a
        session; the table's transitions say how a handler changes that."""
        session = self.sessions.get(identity)
        if session is not None:
            session.last_seen = now
        self._identity, self._session, self._now, self._out = identity, session, now, []
        machine.settle(self, TRANSITIONS, _phase_of(session), cmd, KINDS.of(cmd))
        return self._out

    def _phase(self) -> Phase:
        """The identity's phase now (a handler may have made or ended its session)."""
        return _phase_of(self.sessions.get(self._identity))

    def end_all(self, reason: str) -> list[Action]:
        """The node stopped leading: every session ends, told `reason`."""
        out: list[Action] = []
        for identity, session in self.sessions.items():
            out += (Refuse(identity, reason, None), Left(session.stream))
        self.sessions.clear()
        return out

    # --- handlers, in TRANSITIONS: the rules ------------------------------------------------------------

    def _attach(self, cmd: P.Attach) -> None:
        """3a, then the version, the stream, the client limit (rule 5); a second ATTACH starts over."""
        if self._refused_by_leadership():
            return
        if (refusal := H.attach_refusal(cmd.version)) is not None:
            self._refuse(refusal)
            return
        if cmd.stream not in self.lanes:
            self._refuse(f"unknown stream {cmd.stream!r}; this gateway serves: {', '.join(sorted(self.lanes))}")
            return
        identity, limit = self._identity, self.config.max_clients
        if self._session is None and len(self.sessions) >= limit and not self._end_idle():
            self._refuse(f"too many clients (max {limit}); try again later", "clients")
            return
        if self._session is not None:
            self._out.append(Left(self._session.stream))
        self.sessions[identity] = _Session(cmd.stream, self._now)
        self._out += (Joined(cmd.stream), Reply(identity, P.AttachOk()))

    def _before_attach(self, cmd: P.Command) -> None:
        """3b: a client without a session."""
        self._answer(H.detached(cmd))

    def _publish_before_attach(self, cmd: P.Command) -> None:
        """3a, then 3b."""
        if not self._refused_by_leadership():
            self._before_attach(cmd)

    def _extend(self, cmd: P.Extend) -> None:
        """3c: the handshake answers."""
        answer = self._attached.handshake.on(cmd)
        assert answer is not None
        self._answer(answer)

    def _pong(self, cmd: P.Ping) -> None:
        self._negotiated(cmd)
        self._out.append(Reply(self._identity, P.PingOk()))

    def _publish(self, cmd: P.Publish) -> None:
        """3a, 3c, 3d, 3e, then the record's size."""
        if self._refused_by_leadership() or not self._negotiated(cmd) or self._refused_uncommitted():
            return
        if self._refused_as_mirror(self._attached):
            return
        key, body = cmd.key.encode(), bytes(cmd.body)
        if len(body) > (limit := self.config.max_message_bytes):
            self._refuse(f"message of {len(body)} bytes is over the limit of {limit}")
            return
        session = self._attached
        confirm = P.FEATURE_CONFIRM in session.handshake.features
        self._out.append(Enqueue(self._identity, session.stream, key, body, confirm))

    def _publish_batch(self, cmd: P.PublishBatch) -> None:
        """3a, 3c, 3d, 3e, then the batch (3f), which must have been granted."""
        if self._refused_by_leadership() or not self._negotiated(cmd) or self._refused_uncommitted():
            return
        session = self._attached
        if self._refused_as_mirror(session):
            return
        features = session.handshake.features
        if P.FEATURE_BATCH not in features:
            self._not_allowed(cmd)
            return
        try:
            batch = B.Batch.parse(cmd.batch)  # a view of the received frame: sequencing copies it once
        except B.BatchError as exc:
            self._refuse(f"bad PUBLISH-BATCH: {exc.reason}")
            return
        if batch.first_seq != 0 or not batch.dense or batch.count == 0:
            self._refuse("PUBLISH-BATCH must be a dense, non-empty batch numbered from 0")
            return
        producer = batch.producer
        if producer is not None and P.FEATURE_PRODUCER not in features:
            self._refuse("a PUBLISH-BATCH with a producer header needs the 'producer' extension")
            return
        payload = batch.payload_bytes
        if payload > (limit := self.config.max_message_bytes):
            self._refuse(f"batch of {payload} bytes of keys and bodies is over the limit of {limit}")
            return
        if producer is not None and (gap := self.lanes[session.stream].producers.missing(*producer)) is not None:
            what = f"producer {producer[0]:016x}: its records {gap} to {producer[1] - 1} were refused, not journaled"
            self._refuse(retry_later(f"{what}: re-send from {gap}"), "out-of-order")
            return
        confirm = P.FEATURE_CONFIRM in features
        self._out.append(Sequence(self._identity, session.stream, batch, confirm))

    def _mirror(self, cmd: P.Command) -> None:
        """3g: MIRROR, PROMOTE, or a PUBLISH-BATCH after 3a, 3c and 3d."""
        batch = isinstance(cmd, P.PublishBatch)
        if batch and self._refused_by_leadership():
            return
        if not self._negotiated(cmd) or (batch and self._refused_uncommitted()):
            return
        session = self._attached
        confirm = P.FEATURE_CONFIRM in session.handshake.features
        self._out.append(Mirror(self._identity, session.stream, cmd, confirm))

    def _detach(self, cmd: P.Detach) -> None:
        self._negotiated(cmd)
        del self.sessions[self._identity]
        self._out += (Left(self._attached.stream), Reply(self._identity, P.DetachOk()))

    def _send_to_sidecar(self, cmd: P.Command) -> None:
        """3f: history is the replay sidecar's."""
        self._negotiated(cmd)
        where = f" at {self.config.replay_endpoint}" if self.config.replay_endpoint else ""
        self._refuse(f"{cmd.NAME} is served by the replay sidecar{where}, not the ingest")

    def _refuse_command(self, cmd: P.Command) -> None:
        """3f: anything else."""
        self._negotiated(cmd)
        self._not_allowed(cmd)

    # --- guards, in TRANSITIONS -------------------------------------------------------------------------

    def _has_session(self) -> bool:
        return self._identity in self.sessions

    def _session_ended(self) -> bool:
        return self._identity not in self.sessions

    def _mirrors(self) -> bool:
        return self._phase() is Phase.MIRRORING

    def _publishes(self) -> bool:
        return self._phase() is Phase.ATTACHED

    # --- the handlers' parts ----------------------------------------------------------------------------

    @property
    def _attached(self) -> _Session:
        assert self._session is not None  # ATTACHED's handlers only
        return self._session

    def _negotiated(self, cmd: P.Command) -> bool:
        """3c for a command other than EXTEND: the handshake takes note (EXTEND may no longer come)."""
        return self._attached.handshake.on(cmd) is H.PASS

    def _refused_by_leadership(self) -> bool:
        refusal = self.gate.refusal()
        if refusal is not None:
            self._refuse(refusal, "not-leader")
        return refusal is not None

    def _refused_as_mirror(self, session: _Session) -> bool:
        refusal = self.gate.mirror_refusal(session.stream)
        if refusal is not None:
            self._refuse(refusal, "mirror")
        return refusal is not None

    def _refused_uncommitted(self) -> bool:
        refusal = self.gate.uncommitted_refusal()
        if refusal is not None:
            self._refuse(refusal, "uncommitted")
        return refusal is not None

    def _not_allowed(self, cmd: P.Command) -> None:
        self._refuse(f"{cmd.NAME} is not allowed here (not sent by clients, or not granted)")

    def _answer(self, answer: H.Answer) -> None:
        if isinstance(answer.reply, P.Invalid):
            self._refuse(answer.reply.reason)
        else:
            self._out.append(Reply(self._identity, answer.reply))

    def _refuse(self, reason: str, kind: str = "invalid") -> None:
        self._out.append(Refuse(self._identity, reason, kind))

    def _end_idle(self) -> bool:
        """Rule 5: end the sessions silent for `client_timeout`; whether that made room."""
        cutoff = self._now - self.config.client_timeout
        idle = [identity for identity, s in self.sessions.items() if s.last_seen < cutoff]
        for identity in idle:
            self._out.append(Left(self.sessions.pop(identity).stream))
        if idle:
            log.info("%d sessions silent for over %g s ended to make room", len(idle), self.config.client_timeout)
        return bool(idle)


def _phase_of(session: _Session | None) -> Phase:
    """A session's phase: none, a publisher's, or one granted 'mirror'."""
    if session is None:
        return Phase.DETACHED
    return Phase.MIRRORING if P.FEATURE_MIRROR in session.handshake.features else Phase.ATTACHED


# --- the transition table -------------------------------------------------------------------------------

Go = machine.Go[Ingest, Phase]
Row = machine.Row[Ingest, Phase]
I = Ingest  # noqa: E741
_SIDECAR = (P.Subscribe, P.SubscribeTime, P.Fetch, P.Credit)
_MIRROR = (P.Mirror, P.Promote)
KINDS = H.CommandKinds(P.Attach, P.Extend, P.Ping, P.Publish, P.PublishBatch, *_MIRROR, P.Detach, *_SIDECAR)
EVENT_KINDS = KINDS.events

TRANSITIONS: dict[Phase, Row] = {
    Phase.DETACHED: Row(
        on={
            P.Attach: I._attach,
            P.Publish: I._publish_before_attach,
            P.PublishBatch: I._publish_before_attach,
            **dict.fromkeys((P.Extend, P.Ping, *_MIRROR, P.Detach, *_SIDECAR, P.Command), I._before_attach),
        },
        go=(Go(I._has_session, Phase.ATTACHED),),
    ),
    Phase.ATTACHED: Row(
        on={
            P.Attach: I._attach,
            P.Extend: I._extend,
            P.Ping: I._pong,
            P.Publish: I._publish,
            P.PublishBatch: I._publish_batch,
            **dict.fromkeys(_MIRROR, I._refuse_command),  # 'mirror' not granted
            P.Detach: I._detach,
            **dict.fromkeys(_SIDECAR, I._send_to_sidecar),
            P.Command: I._refuse_command,
        },
        go=(Go(I._session_ended, Phase.DETACHED), Go(I._mirrors, Phase.MIRRORING)),
    ),
    Phase.MIRRORING: Row(
        on={
            P.Attach: I._attach,
            P.Extend: I._extend,
            P.Ping: I._pong,
            P.Publish: I._publish,
            **dict.fromkeys((P.PublishBatch, *_MIRROR), I._mirror),
            P.Detach: I._detach,
            **dict.fromkeys(_SIDECAR, I._send_to_sidecar),
            P.Command: I._refuse_command,
        },
        go=(Go(I._session_ended, Phase.DETACHED), Go(I._publishes, Phase.ATTACHED)),
    ),
}
del I


def describe_transitions() -> str:
    """TRANSITIONS as Markdown (docs/gateway.md embeds it; a test keeps them equal)."""
    return KINDS.describe(TRANSITIONS)
