"""A follower gateway's link to its leader: the leader's journal copied in over ZEPS replay, acks sent back.

Why the replay protocol (docs/ha.md): the leader's sidecar already serves its journal from any sequence and
then live, batch by batch, with credit; a follower is one more subscriber of it, so a leader needs no second
server and a lagging follower reads the journal, never the leader's memory. The ack path is the leader's peer
link (a socket of its own, named in its etcd leader key; not its ingest, so a flood of publishers never
delays the followers' pings, and a leader that stops reading publishers still reads them):
REPLICA-ACK(node, stream, epoch, sequence, durable, mac) whenever what it wrote (`sequence`) or what is as
durable as its --fsync says (`durable`, after a group commit) moved, again every `ACK_EVERY_S` with a PING.
The mac (`ack_mac`) is keyed with the secret the leader put in its etcd leader key: only a node that reads the
group's etcd can make an ack the leader counts, not anyone who can reach the link (docs/ha.md). A peer link
that answers nothing for `suspect_s` is a leader gone silent (killed, paused, cut off). The leader answers on
the same link with REPLICA-COMMIT, how far each stream is committed: the follower's sidecar serves that far
(gateway.journal.committed), once the follower's journal is known to be a prefix of the leader's.

The replay client is passed in (gateway.client.replay_client.ReplayClient, by `zeps gateway`): the server layer
does not import the client library.

Threading contract: used by the gateway's loop only. `reconcile` waits (bounded by `timeout_s`), at most once
per change of leader; everything else never waits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import zmq

from gateway.errors import CoordinatorError, ReplayError
from gateway.wire import batch as B
from gateway.wire import protocol as P

log = logging.getLogger(__name__)

ACK_EVERY_S = 0.05
_COMMIT_ID = P.encode(P.ReplicaCommit("", 0, 0))[2:3]  # the command id byte, to skip decoding PING-OKs
ACK_MAC_SIZE = 16  # bytes of HMAC-SHA256 kept: 128 bits, past any guessing over a network
_ACK_DOMAIN = b"zeps replica-ack\0"


def ack_mac(key: bytes, node: str, stream: str, epoch: int, seq: int, durable: int) -> bytes:
    """The MAC of a REPLICA-ACK, bound to everything it says (so none can be replayed as another ack)."""
    n, s = node.encode(), stream.encode()
    numbers = struct.pack(">QQQ", epoch, seq, durable)
    msg = b"".join((_ACK_DOMAIN, struct.pack(">H", len(n)), n, struct.pack(">H", len(s)), s, numbers))
    return hmac.digest(key, msg, hashlib.sha256)[:ACK_MAC_SIZE]


def ack_valid(key: bytes, ack: P.ReplicaAck) -> bool:
    """Whether `ack` was made with `key` (constant time)."""
    mac = ack_mac(key, ack.node, ack.stream, ack.epoch, ack.sequence, ack.durable)
    return hmac.compare_digest(mac, bytes(ack.mac))


class ReplaySource(Protocol):
    """What a follower needs of gateway.client.replay_client.ReplayClient."""

    sock: zmq.Socket

    def subscribe(self, pattern: str = "", latest: int = 0) -> None: ...

    def fetch(self, first: int, last: int = ..., pattern: str = "") -> int: ...

    def recv(
        self, timeout: float | None = None
    ) -> B.Batch | P.Deliver | P.FetchEnd | P.Trimmed | P.SnapshotEnd | None: ...

    def close(self) -> None: ...


# (endpoint, stream, timeout_s, ctx) -> a connected client
ReplayFactory = Callable[[str, str, float, zmq.Context], ReplaySource]


@dataclass(frozen=True)
class LeaderInfo:
    """What the leader key's value says of its holder: its endpoints (`peer`: the link its followers ack on) and
    `ack_key` (hex), which keys their REPLICA-ACK macs."""

    node: str
    ingest: str
    replay: str
    peer: str
    ack_key: str

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, text: str) -> LeaderInfo:
        """The leader key's value; CoordinatorError if it is not one this version writes (a node of another
        version leads, or someone else wrote the key)."""
        try:
            data = json.loads(text)
            return cls(**{f.name: str(data[f.name]) for f in dataclasses.fields(cls)})
        except (ValueError, KeyError, TypeError) as exc:
            raise CoordinatorError(
                f"the group's leader key holds {text[:80]!r}, which this version cannot read ({type(exc).__name__}: "
                f"{exc}): run one version of zeps on every node of a group (docs/ha.md)"
            ) from None

    def reachable(self, endpoint: str) -> str:
        """`endpoint` (its ingest or peer link) to connect to: a wildcard bind (tcp://0.0.0.0:P) takes the host of
        the replay endpoint."""
        bound, replay = urlsplit(endpoint), urlsplit(self.replay)
        if bound.hostname in ("0.0.0.0", "*", "::") and replay.hostname:
            return f"tcp://{replay.hostname}:{bound.port}"
        return endpoint


class Follower:
    """Follows the leader of `epoch` for `streams`, from each stream's journal head on."""

    def __init__(
        self,
        ctx: zmq.Context,
        replay: ReplayFactory,
        node: str,
        leader: LeaderInfo,
        epoch: int,
        suspect_s: float,
        timeout_s: float = 0.5,
    ) -> None:
        self.node, self.leader, self.epoch = node, leader, epoch
        self._ack_key = bytes.fromhex(leader.ack_key)
        self._replay = replay
        self.suspect_s, self.timeout_s = suspect_s, timeout_s
        self._ctx = ctx
        self.clients: dict[str, ReplaySource] = {}
        self.acked: dict[str, tuple[int, int]] = {}  # per stream: (written, durable) as last acknowledged
        self.committed: dict[str, int] = {}  # per stream copied (tailing), the leader's commit point
        self.ack_sock = ctx.socket(zmq.DEALER)
        self.ack_sock.setsockopt(zmq.LINGER, 0)
        self.ack_sock.setsockopt(zmq.SNDHWM, 1000)
        self.ack_sock.connect(leader.reachable(leader.peer))
        self.started_at = self.heard_at = time.monotonic()
        self._unanswered_since: float | None = None  # the first ping sent since the leader last answered
        self._next_ack = 0.0

    def answering(self, now: float) -> bool:
        """Whether the leader's peer link answers us (its last ping): only then is its sidecar worth a wait."""
        return self.heard_at > self.started_at and now - self.heard_at < 2 * ACK_EVERY_S

    def matches(self, stream: str, own: B.Batch) -> bool:
        """Whether the leader's journal holds `own` (a batch of ours) byte for byte: journals are identical up to
        the last batch for which this holds (each batch was copied with every batch before it)."""
        client = self._replay(self.leader.replay, stream, self.timeout_s, self._ctx)
        try:
            rid = client.fetch(own.first_seq, own.last_seq)
            got = bytearray()
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                event = client.recv(0.05)
                if isinstance(event, B.Batch):
                    got += bytes(event)
                elif isinstance(event, P.FetchEnd) and event.request_id == rid:
                    return bytes(got) == bytes(own)
                elif isinstance(event, P.Trimmed):
                    log.warning(
                        "stream %s: the leader no longer has %d; taking our journal as its", stream, own.last_seq
                    )
                    return True
            raise ReplayError(f"the leader's sidecar at {self.leader.replay} did not answer a FETCH in time")
        finally:
            client.close()

    def tail(self, stream: str, head: int, durable: int) -> ReplaySource:
        """Start copying `stream` after `head` (our journal's, durable through `durable`); the client's socket is
        the caller's to poll."""
        client = self._replay(self.leader.replay, stream, self.timeout_s, self._ctx)
        client.subscribe("", head)
        self.clients[stream] = client
        self.acked[stream] = (head, durable)
        return client

    def batches(self, stream: str) -> Iterator[B.Batch]:
        """What the leader's sidecar sent for `stream` so far (never waits)."""
        client = self.clients[stream]
        while (event := client.recv(0)) is not None:
            if isinstance(event, B.Batch):
                yield event

    def journaled(self, stream: str, written: int, durable: int) -> None:
        """Acknowledge at once what we hold of `stream`, if it moved: written through `written`, as durable as
        --fsync says through `durable`."""
        if self.acked.get(stream) != (written, durable):
            self.acked[stream] = (written, durable)
            self._ack(stream, written, durable)

    def tick(self, now: float) -> bool:
        """Read the leader's answers, ack and ping when due; whether the leader went silent: a ping of ours
        has had no answer for `suspect_s` (so a pause of this process alone never makes it suspect)."""
        while True:
            try:
                frame = self.ack_sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.heard_at, self._unanswered_since = now, None
            if frame[2:3] == _COMMIT_ID:
                self._committed(frame)
        if now >= self._next_ack:
            self._next_ack = now + ACK_EVERY_S
            self._send(P.Ping())
            if self._unanswered_since is None:
                self._unanswered_since = now
            for stream, (written, durable) in self.acked.items():
                self._ack(stream, written, durable)
        return self._unanswered_since is not None and now - self._unanswered_since > self.suspect_s

    def _committed(self, frame: bytes) -> None:
        """A REPLICA-COMMIT: taken for a stream being copied only (its journal was reconciled first)."""
        with contextlib.suppress(P.ProtocolError):
            cmd = P.decode(frame)
            if isinstance(cmd, P.ReplicaCommit) and cmd.epoch == self.epoch and cmd.stream in self.clients:
                self.committed[cmd.stream] = max(self.committed.get(cmd.stream, 0), cmd.sequence)

    def _ack(self, stream: str, written: int, durable: int) -> None:
        mac = ack_mac(self._ack_key, self.node, stream, self.epoch, written, durable)
        self._send(P.ReplicaAck(self.node, stream, self.epoch, written, durable, mac))

    def _send(self, cmd: P.Command) -> None:
        with contextlib.suppress(zmq.Again):  # the leader reads nothing: the next tick says it again, or suspects it
            self.ack_sock.send(P.encode(cmd), zmq.NOBLOCK)

    def drop_tails(self) -> list[ReplaySource]:
        """End the replication links (the sidecar went away); the ack link stays. The clients closed."""
        dropped = list(self.clients.values())
        for client in dropped:
            client.close()
        self.clients.clear()
        return dropped

    def close(self) -> None:
        self.drop_tails()
        self.ack_sock.close()
