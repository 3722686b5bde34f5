"""A follower gateway's link to its leader: the leader's journal copied in, acks sent back.

Two ways in, one journal (docs/ha.md, "How followers copy"). While a follower is behind the leader, it is one
more live-tail subscriber of the leader's sidecar over ZEPS replay: the sidecar serves any sequence and then
the live tail, with credit, so a lagging or rejoining follower reads the leader's journal, never its memory.
Once it is level, the leader pushes each batch it journals over the peer link (REPLICA-BATCH), and the
follower closes its tail: one process hop and the sidecar's work less per batch. Per stream:

    tailing --a push continues our journal, none went missing--> pushed
    pushed  --a push past our head, or a REPLICA-COMMIT whose head is past ours--> tailing (from our head)

Either way a batch is taken only where it continues the journal, so the two never disagree. The leader
pushes every batch before the REPLICA-COMMITs that follow it on the same link, so a `head` past ours there
means a push was lost (the link's queue was full, it reconnected) or never sent (the leader did not count us
as level): the tail fills from our head, within one commit interval.

The ack path is the same peer link (a TCP connection to a port of the leader's own, named in its etcd leader
key, gateway.transport.link; not its ingest, so a flood of publishers never delays the followers' pings, and
a leader that stops reading publishers still reads them): REPLICA-ACK(node, stream, epoch, sequence, durable,
mac) whenever what it wrote (`sequence`) or what is as durable as its --fsync says (`durable`, after a group
commit) moved, again every `ACK_EVERY_S` with a PING. The mac (`ack_mac`) is keyed with the secret the leader
put in its etcd leader key: only a node that reads the group's etcd can make an ack the leader counts, not
anyone who can reach the link (docs/ha.md). A peer link that answers nothing for `suspect_s` after our ping
left (gateway.replication.silence: a ping still queued behind a connect is not counted) is a leader gone
silent (killed, paused, cut off); one that the leader closed, after which its port refuses us, is a leader
whose process exited, suspected at once. A connect to the leader's link still under way after 0.2 s is
made again (gateway.transport.connect_retry): a lost SYN waits for the kernel's 1 s otherwise, and until
the link is up the follower copies nothing and acknowledges nothing. The leader answers with REPLICA-COMMIT,
how far each stream is committed: the follower's sidecar serves that far (gateway.journal.committed), once
the follower's journal is known to be a prefix of the leader's.

The replay client is passed in (gateway.client.replay_client.ReplayClient, by `zeps gateway`): the server layer
does not import the client library.

Threading contract: used by the gateway's loop only; nothing waits. A question to the leader's sidecar
(`ask`) is answered over the loop's turns (`answer`): a follower cutting its journal back to a new leader's
keeps answering its publishers (they learn where the leader is from it) and its own leader's pings.
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
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import zmq

from gateway.errors import CoordinatorError, ReplayError
from gateway.replication.sidecar_race import RacedReplay, ReplaySource
from gateway.replication.silence import Silence
from gateway.transport.connect_retry import ConnectRetry
from gateway.transport.link import Link, LinkSet
from gateway.transport.pollable import Unwatch, Watch
from gateway.transport.send_errors import SendErrors
from gateway.transport.tls import PeerTls
from gateway.wire import batch as B
from gateway.wire import protocol as P

log = logging.getLogger(__name__)

ACK_EVERY_S = 0.05
ACK_QUEUE = 1000  # frames to the leader waiting for the kernel (a connect in progress, a leader not reading)
RECONNECT_S = 0.1  # a peer link that failed is connected again this soon
_COMMIT_ID = P.encode(P.ReplicaCommit("", 0, 0, 0))[2:3]  # command id bytes, to skip decoding PING-OKs
_BATCH_ID = P.encode(P.ReplicaBatch("", 0, 0, b""))[2:3]
READ_MAX = 256  # frames one tick reads from the peer link: a pass of the loop stays bounded under a flood
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


# (endpoint, stream, timeout_s, ctx) -> a connected client
ReplayFactory = Callable[[str, str, float, zmq.Context], ReplaySource]


@dataclass
class Question:
    """Whether the leader's journal holds `own`, a batch of ours: a FETCH of its range on `client`, to the leader's
    sidecar, and what came back so far (`Follower.answer`)."""

    stream: str
    own: B.Batch
    client: RacedReplay
    request_id: int
    deadline: float
    got: bytearray = field(default_factory=bytearray)


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


@dataclass
class _Copy:
    """One stream being copied: from the leader's sidecar (`client`) while behind, from its pushes once level."""

    client: RacedReplay | None
    pushed: deque[B.Batch] = field(default_factory=deque)  # read by tick, taken by the next copy
    leader_head: int = 0  # the leader's journal head, as its last REPLICA-COMMIT said


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
        *,
        watch: Watch,
        unwatch: Unwatch,
        max_frame: int,
        timeout_s: float = 0.5,
        errors: SendErrors | None = None,
        tls: PeerTls | None = None,
    ) -> None:
        """`watch`/`unwatch`: the loop's poller, for the peer link and the connections to the leader's sidecar
        (gateway.replication.sidecar_race); `max_frame`: the largest push we take;
        `errors`: where the peer link's refused sends and connects are reported; `tls`: the group's TLS on it."""
        self._errors = errors
        self.node, self.leader, self.epoch = node, leader, epoch
        self._ack_key = bytes.fromhex(leader.ack_key)
        self._replay = replay
        self.suspect_s, self.timeout_s = suspect_s, timeout_s
        self._ctx = ctx
        self.copies: dict[str, _Copy] = {}  # the streams being copied (their journals rejoined to the leader's first)
        self._asking: dict[str, RacedReplay] = {}  # per stream, the connection a cut asks the leader's sidecar on
        self.acked: dict[str, tuple[int, int]] = {}  # per stream: (written, durable) as last acknowledged
        self.committed: dict[str, int] = {}  # per stream copied, the leader's commit point
        self._links = LinkSet(watch, unwatch)
        self._watch, self._unwatch = watch, unwatch
        self._max_frame = max_frame
        self._tls = tls  # the group's TLS on the peer link, if it has one
        self._untrusted_logged = False
        self._connect_retry = ConnectRetry()
        self.link = self._connect(time.monotonic())
        self._reconnect_at = 0.0
        self._answered_on: Link | None = None  # the link the leader last answered on
        self._hung_up = False  # the leader closed the link it answered on, and has not answered since
        self._exited = False  # ... and then refused a connection: its process is gone
        self.started_at = self.heard_at = time.monotonic()
        self._silence = Silence(suspect_s)
        self._next_ack = 0.0

    def answering(self, now: float) -> bool:
        """Whether the leader's peer link answers us (its last ping): only then is its sidecar worth a wait."""
        return self.heard_at > self.started_at and now - self.heard_at < 2 * ACK_EVERY_S

    def ask(self, stream: str, own: B.Batch, now: float) -> Question:
        """Ask the leader's sidecar whether its journal holds `own` (a batch of ours) byte for byte: journals are
        identical up to the last batch for which this holds (each batch was copied with every batch before it).
        One connection per stream serves every question of a cut; the first answer also waits for its handshake.
        A connection is kept (for `stop_asking`) once it carried a question: one whose first FETCH failed is closed."""
        client = kept = self._asking.get(stream)
        if client is None:
            client = self._sidecar(stream, now)
        try:
            request_id = client.fetch(own.first_seq, own.last_seq)
        except BaseException:
            if kept is None:
                client.close()
            raise
        self._asking[stream] = client
        wait = self.timeout_s if kept is not None else 2 * self.timeout_s
        return Question(stream, own, client, request_id, now + wait)

    def answer(self, q: Question, now: float) -> bool | None:
        """The leader's answer to `q`: whether it holds the batch, or None while its sidecar has not finished
        answering (never waits). Raises ReplayError once `q` is past its deadline, or the connection failed."""
        while (event := q.client.recv(0)) is not None:
            if isinstance(event, B.Batch):
                q.got += bytes(event)
            elif isinstance(event, P.FetchEnd) and event.request_id == q.request_id:
                return bytes(q.got) == bytes(q.own)
            elif isinstance(event, P.Trimmed):
                trimmed = q.own.last_seq
                log.warning("stream %s: the leader no longer has %d; taking our journal as its", q.stream, trimmed)
                return True
        if now > q.deadline:
            raise ReplayError(f"the leader's sidecar at {self.leader.replay} did not answer a FETCH in time")
        return None

    def stop_asking(self) -> list[RacedReplay]:
        """The connections questions were asked on, for the caller to close."""
        clients = list(self._asking.values())
        self._asking.clear()
        return clients

    def tail(self, stream: str, head: int, durable: int) -> None:
        """Copy `stream` from the leader's sidecar after `head` (our journal's, durable through `durable`), until
        `untail`."""
        client = self._sidecar(stream, time.monotonic())
        client.subscribe("", head)
        copy = self.copies.setdefault(stream, _Copy(None))
        copy.client = client
        self.acked[stream] = (head, durable)

    def _sidecar(self, stream: str, now: float) -> RacedReplay:
        """A connection to the leader's sidecar for `stream`, its opening raced (gateway.replication.sidecar_race)."""
        return RacedReplay(lambda: self._replay(self.leader.replay, stream, self.timeout_s, self._ctx), now,
                           self.timeout_s, self._watch, self._unwatch)  # fmt: skip

    def untail(self, stream: str) -> RacedReplay | None:
        """Stop copying `stream` from the sidecar (level with the leader: its pushes carry on); the client, for
        the caller to close."""
        copy = self.copies[stream]
        client, copy.client = copy.client, None
        return client

    def tailing(self, stream: str) -> bool:
        return self.copies[stream].client is not None

    def missed(self, stream: str, head: int) -> bool:
        """Whether the leader said its journal reaches past `head` (ours, every push read so far taken)."""
        return self.copies[stream].leader_head > head

    def batches(self, stream: str) -> Iterator[B.Batch]:
        """What the leader's sidecar sent for `stream` so far (never waits)."""
        client = self.copies[stream].client
        while client is not None and (event := client.recv(0)) is not None:
            if isinstance(event, B.Batch):
                yield event

    def pushes(self, stream: str) -> Iterator[B.Batch]:
        """What the leader pushed for `stream`, in its order, since the last call (read by `tick`)."""
        pushed = self.copies[stream].pushed
        while pushed:
            yield pushed.popleft()

    def journaled(self, stream: str, written: int, durable: int) -> None:
        """Acknowledge at once what we hold of `stream`, if it moved: written through `written`, as durable as
        --fsync says through `durable`."""
        if self.acked.get(stream) != (written, durable):
            self.acked[stream] = (written, durable)
            self._ack(stream, written, durable)

    def tick(self, now: float) -> str:
        """Read the leader's pushes and answers (at most READ_MAX), ack and ping when due; why the leader is
        suspected, or "": a ping of ours has had no answer for `suspect_s` since it left (gateway.replication.silence:
        so neither a pause of this process nor a connect under way makes it suspect), or its process exited: it
        closed the link it answered us on, and its port then refused us (a kill -9 on a live host says so at once;
        a dead host or a partition says nothing, and waits for `suspect_s`)."""
        link = self.link
        for frame in link.frames(READ_MAX):
            self.heard_at = now
            self._silence.answered()
            self._answered_on, self._hung_up = link, False
            kind = frame[2:3]
            if kind == _BATCH_ID:
                self._pushed(frame)
            elif kind == _COMMIT_ID:
                self._committed(frame)
        link.flush()
        if link.closed:  # out of the poller at once (its descriptor would poll readable), connected again soon
            if self._links.drop(link):
                log.debug("ha: peer link to %s: %s", self.leader.node, link.error)
                if link.hung_up and link is self._answered_on:
                    self._hung_up = True
                elif link.refused and self._hung_up:
                    self._exited = True
            if link.untrusted:  # its process answered, if only to refuse our TLS: not a reason to suspect it
                self._silence.answered()
                if not self._untrusted_logged:
                    log.warning("ha: the peer link of leader %s: %s; check this node's --peer-tls-cert, "
                                "--peer-tls-key and --peer-tls-ca", self.leader.node, link.error)  # fmt: skip
                    self._untrusted_logged = True
            self._connect_retry.ended()
            if now >= self._reconnect_at:
                self.link, self._reconnect_at = self._connect(now), now + RECONNECT_S
        elif not link.connecting:
            self._connect_retry.ended()
        elif self._connect_retry.expired(now):  # no SYN-ACK yet: the SYN again now, not at the kernel's 1 s
            log.debug("ha: peer link to %s: the connect had no answer; connecting again", self.leader.node)
            self._links.drop(link)
            self.link = self._connect(now)
        if now >= self._next_ack:
            self._next_ack = now + ACK_EVERY_S
            self._send(P.Ping())
            self._silence.pinged()
            for stream, (written, durable) in self.acked.items():
                self._ack(stream, written, durable)
        if not self.link.wants_write:  # what was queued (our pings) left, or the link is gone
            self._silence.out(now)
        self._links.refresh()
        if self._exited:
            return "exited (it closed our peer link, and its port refuses connections)"
        if self._silence.silent(now):
            return f"silent for {self.suspect_s:.2f} s"
        return ""

    def _connect(self, now: float) -> Link:
        self._connect_retry.started(now)
        peer = self.leader.reachable(self.leader.peer)
        tls = self._tls.client if self._tls is not None else None
        link = Link.connect(peer, max_frame=self._max_frame, max_queued=ACK_QUEUE, errors=self._errors, tls=tls,
                            expect_name=self.leader.node)  # fmt: skip
        return self._links.add(link)

    def _committed(self, frame: bytes) -> None:
        """A REPLICA-COMMIT: taken for a stream being copied only."""
        with contextlib.suppress(P.ProtocolError):
            cmd = P.decode(frame)
            if isinstance(cmd, P.ReplicaCommit) and cmd.epoch == self.epoch and cmd.stream in self.copies:
                self._commit_point(cmd.stream, cmd.sequence)
                copy = self.copies[cmd.stream]
                copy.leader_head = max(copy.leader_head, cmd.head)

    def _commit_point(self, stream: str, seq: int) -> None:
        self.committed[stream] = max(self.committed.get(stream, 0), seq)

    def _pushed(self, frame: bytes) -> None:
        """A REPLICA-BATCH: kept for a stream being copied only; one that does not parse is dropped (the gap it
        leaves sends us to the sidecar)."""
        with contextlib.suppress(P.ProtocolError, B.BatchError):
            cmd = P.decode(frame)
            if isinstance(cmd, P.ReplicaBatch) and cmd.epoch == self.epoch and cmd.stream in self.copies:
                self.copies[cmd.stream].pushed.append(B.Batch.parse(cmd.batch))  # a view of the frame
                self._commit_point(cmd.stream, cmd.committed)

    def _ack(self, stream: str, written: int, durable: int) -> None:
        mac = ack_mac(self._ack_key, self.node, stream, self.epoch, written, durable)
        self._send(P.ReplicaAck(self.node, stream, self.epoch, written, durable, mac))

    def _send(self, cmd: P.Command) -> None:
        self.link.send(P.encode(cmd))  # not sent (the leader reads nothing, or is gone): the next tick says it again

    def drop_copies(self) -> None:
        """Stop copying (the sidecar went away, or we stop following); the caller untailed every stream first.
        The ack link stays."""
        self.copies.clear()

    def close(self) -> None:
        for copy in self.copies.values():
            if copy.client is not None:
                copy.client.close()
        for client in self.stop_asking():
            client.close()
        self.drop_copies()
        for link in self._links:
            self._links.drop(link)
