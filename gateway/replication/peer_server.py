"""The leader's end of the peer link: followers' pings and acks in; PING-OK, pushes and commit points out.

Followers reach the leader on its peer link, a TCP port of its own (`--peer-endpoint`, by default the ingest's
address on a free port, named in the leader key) with length-prefixed ZEPS commands (gateway.transport.link):
PING and REPLICA-ACK in; PING-OK, REPLICA-COMMIT and, to followers level with the leader, each batch it
journals (REPLICA-BATCH, `push`) out. Plain TCP, not ZeroMQ, because the link is on the path of every batch
the group multicasts, and ZeroMQ's I/O threads add two thread hand-offs each way. Not the ingest, so that the
followers are heard ahead of any publisher: `serve` drains the link first, on every pass of the loop, also
while the gateway reads no publisher (multicast or its followers behind), and a flood of publishes never makes
a leader look silent to the followers that would depose it.

An ack counts only if its mac was made with the key this process put in its etcd leader key (`ack_key`): only
a node of the group can make one. Every node serves the link (a follower takes no acks), so that a follower
promoted to leader is reachable at once; but only a node with authority (leading, or elected and taking over)
answers pings. Those who ping a node without it still follow it from a leader key it no longer acts on (its
authority lapsed: cut from etcd, paused past its lease, etcd down): unanswered, they suspect it within
`--suspect-ms` and revoke its lease, instead of waiting for etcd to expire it (its TTL, then etcd's lessor).

Threading contract: used by the gateway's loop only; never waits.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import zmq
from prometheus_client import Counter

from gateway.replication.follower import ack_valid
from gateway.replication.replicas import InSync
from gateway.replication.strategy import ReplicaLane
from gateway.transport.link import Link, LinkSet, Listener
from gateway.transport.pollable import Unwatch, Watch
from gateway.transport.send_errors import SendErrors
from gateway.transport.tls import PeerTls
from gateway.wire import protocol as P

log = logging.getLogger(__name__)

PUSH_HWM = 256  # frames queued to one follower on the peer link beyond the kernel's buffer; past it pushes are
# dropped (it copies them from our sidecar), so a stalled follower costs at most this many batches of memory
PEER_FRAME_MAX = 4096  # the largest frame a follower sends (PING, REPLICA-ACK)
MAX_LINKS = 64  # connections to the peer link; past it the oldest that never carried a good ack is closed
COMMIT_EVERY_S = 0.05  # the leader repeats its commit points to its followers this often (one may be dropped)
COMMIT_LINGER_S = 0.005  # ... and tells a moved one at most this often (pushes carry it meanwhile)


class PeerServer:
    """The peer link's listener and its connections; the followers known by their last good ack."""

    def __init__(
        self,
        endpoint: str,
        ack_key: bytes,
        lanes: Mapping[str, ReplicaLane],
        rejected: Counter,
        watch: Watch,
        unwatch: Unwatch,
        *,
        errors: SendErrors | None = None,
        tls: PeerTls | None = None,
    ) -> None:
        """`endpoint`: where to listen (tcp://HOST:PORT, PORT may be *); `ack_key`: what acks' macs are keyed
        with; `lanes`: whose heads commit points carry; `rejected`: counts what is refused, by reason;
        `errors`: where connections and sends the network refuses are reported; `tls`: the group's TLS on the
        peer link (None: plain TCP)."""
        self._tls = tls.server if tls is not None else None
        self.listener = Listener(endpoint, errors=errors)
        self._ack_key, self._lanes, self._rejected = ack_key, lanes, rejected
        self._watch, self._unwatch = watch, unwatch
        self._links = LinkSet(watch, unwatch)  # the followers' (and anyone's) connections to it
        self._peers: dict[str, Link] = {}  # leading: follower node -> the link its last good ack came on
        self._next_commit = 0.0  # when the commit points are told to the followers again, moved or not
        self._commit_at = 0.0  # the earliest they are told again when they moved
        self._commit_owed = False  # they moved since last told
        self._forged_logged = False
        self._unframed_logged = False
        self._untrusted_logged = False
        self._impostor_logged = False

    @property
    def endpoint(self) -> str:
        return self.listener.endpoint

    def start(self) -> None:
        self._watch(self.listener, zmq.POLLIN)  # a follower's ping or ack wakes the loop

    def serve(self, insync: InSync | None, now: float, *, answer: bool, limit: int = 1024) -> None:
        """Take new connections, answer the followers' pings (if `answer`: this node has authority) and count
        their acks into `insync` (None: this node does not lead, and takes none)."""
        for link in self.listener.accept(max_frame=PEER_FRAME_MAX, max_queued=PUSH_HWM, tls=self._tls):
            self._links.add(link)
            if len(self._links) > MAX_LINKS:  # someone opens connections and sends nothing: the oldest idle goes
                idle = next((k for k in self._links if k not in self._peers.values()), link)
                self._links.drop(idle)
        for link in self._links:
            for frame in link.frames(limit):
                try:
                    cmd = P.decode(frame)
                except P.ProtocolError:
                    self._rejected.labels("invalid").inc()  # not a node of ours: nothing to answer
                    continue
                if isinstance(cmd, P.Ping):
                    if answer:
                        link.send(P.encode(P.PingOk()))  # one lost is said again: pings come every ACK_EVERY_S
                elif isinstance(cmd, P.ReplicaAck):
                    self._ack(insync, link, cmd, now)
                else:
                    self._rejected.labels("invalid").inc()
            link.flush()
            if link.closed:
                if link.unframed:  # not a peer of this version (a ZeroMQ one), or a hostile one
                    self._rejected.labels("invalid").inc()
                    if not self._unframed_logged:  # once: anyone who reaches the port can send junk
                        log.warning("ha: closed a connection to the peer link that is not in this version's framing "
                                    "(%s): run one version of zeps on every node of a group; further ones are only "
                                    "counted (zeps_gateway_rejected_messages)", link.error)  # fmt: skip
                        self._unframed_logged = True
                elif link.untrusted:  # TLS refused it: not a node of the group (or one without its certificate)
                    self._rejected.labels("auth").inc()
                    if not self._untrusted_logged:  # once: anyone who reaches the port can try
                        log.warning("ha: refused a connection to the peer link (%s): every node needs a certificate "
                                    "of the group's CA (--peer-tls-cert, --peer-tls-key, --peer-tls-ca); further ones "
                                    "are only counted (zeps_gateway_rejected_messages)", link.error)  # fmt: skip
                        self._untrusted_logged = True
                self._drop_link(link, insync)
        self._links.refresh()

    def _drop_link(self, link: Link, insync: InSync | None = None) -> None:
        """Forget a closed link; a follower whose link it was has hung up (it leaves the in-sync set at once)."""
        self._links.drop(link)
        for node in [n for n, k in self._peers.items() if k is link]:
            del self._peers[node]
            if insync is not None:
                insync.hung_up(node)

    def _ack(self, insync: InSync | None, link: Link, ack: P.ReplicaAck, now: float) -> None:
        """Count a follower's ack if its mac proves a node of the group made it; drop and count a forged one.
        `link`: where the follower is (pushes and REPLICA-COMMITs go there)."""
        if insync is None:
            return  # a follower takes no acks; nothing to tell
        if not ack_valid(self._ack_key, ack):
            self._rejected.labels("forged-ack").inc()
            if not self._forged_logged:  # once: a forger can send many
                log.warning(
                    "ha: dropped a REPLICA-ACK for node %r with a wrong mac (not from a node of the group); "
                    "further ones are only counted (zeps_gateway_rejected_messages)",
                    ack.node,
                )
                self._forged_logged = True
            return
        if link.peer_names is not None and ack.node not in link.peer_names:
            self._rejected.labels("auth").inc()
            if not self._impostor_logged:  # once: the same link sends an ack per batch
                log.warning(
                    "ha: dropped a REPLICA-ACK for node %r from a link whose certificate is %s's: each node needs "
                    "the certificate made for its --node name; further ones are only counted "
                    "(zeps_gateway_rejected_messages)",
                    ack.node,
                    ", ".join(sorted(link.peer_names)),
                )
                self._impostor_logged = True
            return
        insync.ack(ack.node, ack.epoch, ack.stream, ack.sequence, ack.durable, now)
        if ack.epoch == insync.epoch:
            self._peers[ack.node] = link

    def push(self, insync: InSync, stream: str, sealed: bytes) -> None:
        """Send a batch just journaled to the followers level with us (they acknowledged what is committed), so
        their copy skips our sidecar. A follower that misses one (behind, its link full) learns it from the
        head in our next REPLICA-COMMIT and copies from our sidecar again (gateway.replication.follower)."""
        if not self._peers:
            return
        frame = b""
        for node, link in self._peers.items():
            follower = insync.followers.get(node)
            if follower is not None and follower.acked.get(stream, 0) >= insync.committed[stream]:
                frame = frame or P.encode(P.ReplicaBatch(stream, insync.epoch, insync.committed[stream], sealed))
                link.send(frame)
        self._links.refresh()  # a push the kernel did not take whole: poll for room

    def commits_moved(self) -> None:
        """A commit point moved: the followers are told within COMMIT_LINGER_S."""
        self._commit_owed = True

    def tell_commits(self, insync: InSync, now: float) -> None:
        """Tell the followers the commit points when they moved, at most every COMMIT_LINGER_S (and again every
        COMMIT_EVERY_S): while batches flow, each push carries the point too, so a follower is not woken by a
        REPLICA-COMMIT per batch; when they stop, it learns the last one within COMMIT_LINGER_S. One that
        cannot go (the follower gone, or not reading) is said again later."""
        if not (self._commit_owed and now >= self._commit_at) and now < self._next_commit:
            return
        self._commit_owed = False
        self._commit_at, self._next_commit = now + COMMIT_LINGER_S, now + COMMIT_EVERY_S
        for link in self._peers.values():
            for stream, seq in insync.committed.items():
                head = self._lanes[stream].head  # every batch to it was pushed before this
                link.send(P.encode(P.ReplicaCommit(stream, insync.epoch, seq, head)))
        self._links.refresh()

    def due(self, leading: bool) -> float:
        """When the loop must run again: a moved commit point owed to the followers (inf: nothing owed)."""
        if not leading or not self._peers:
            return math.inf
        return self._commit_at if self._commit_owed else self._next_commit

    def forget(self, nodes: set[str] | None = None) -> None:
        """Tell `nodes` (None: every follower) nothing more until they ack again (out of the in-sync set, or a
        new epoch)."""
        for node in list(self._peers) if nodes is None else nodes:
            self._peers.pop(node, None)

    def close(self) -> None:
        for link in self._links:
            self._links.drop(link)
        self._unwatch(self.listener)
        self.listener.close()
