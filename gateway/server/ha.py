"""A gateway node of a replicated group (docs/ha.md): leader or follower, decided by the elector.

The leader sequences and journals as a single gateway does, but multicasts a batch only once it is committed
(gateway.server.replicas: every in-sync follower wrote it, and there are `min_insync` of them) and confirms it
only once it is durable there too, and only while the authority clock lets it act. A follower refuses
publishers (naming the leader), copies the leader's journal into its own verbatim (gateway.server.follower),
acknowledges what it wrote and what it made durable, and suspects a leader that stops answering: the elector
then revokes that leader's lease and campaigns.

On following a new leader, a node first drops what its journal holds beyond the leader's (records a former
leader journaled but never got committed): it compares batches of its own with the leader's, byte for byte,
from its last one back, finds where they part (`_reconcile`: galloping, then halving) and cuts there once.

Followers reach the leader on its peer link, a TCP port of its own (`--peer-endpoint`, by default the ingest's
address on a free port, named in the leader key) with length-prefixed ZEPS commands (gateway.transport.link):
PING and REPLICA-ACK in; PING-OK, REPLICA-COMMIT and, to followers level with the leader, each batch it
journals (REPLICA-BATCH, `push`) out. Plain TCP, not ZeroMQ, because the link is on the path of every batch
the group multicasts, and ZeroMQ's I/O threads add two thread hand-offs each way. Not the ingest, so that the
followers are heard ahead of any publisher: `tick` drains the link first, on every pass of the loop, also
while the gateway reads no publisher (multicast or its followers behind), and a flood of publishes never makes
a leader look silent to the followers that would depose it.

Every node publishes to its sidecar how far each stream is committed (gateway.journal.committed), and its
sidecar serves no further: the leader from its in-sync set, a follower from the leader's REPLICA-COMMITs
(sent on each advance and every `COMMIT_EVERY_S`). A follower acknowledges a batch as written at once, and as
durable once its group commit (on the journal's timer, as the leader's, run by the gateway's syncer thread) has
made it as durable as `--fsync` says.

Each node also says how it is doing under `<group>/nodes/<node>` (role, epoch, heads; `zeps ha status`),
every `REPORT_EVERY_S`.

Threading contract: every method runs on the gateway's loop and none waits on etcd. Every etcd request of the
node runs on the elector's thread (gateway.server.elector): the loop posts what etcd should say as a job (the
in-sync set it wants under its epoch, the node's status), the job carries copies of what it needs and touches
nothing the loop uses, and its outcome comes back through `Elector.outcomes()`, which `tick` empties (the
elector's eventfd is in the loop's poller, so an outcome wakes it). One write of the in-sync set is in flight
at a time, so outcomes apply in the order the writes were made. Each job is one request, so that it delays
a renewal of the lease by one request at most: a take-over inherits the in-sync set that `_eligible` read
for the campaign that won (`_campaigned_on`, the one state of the node's on the elector's thread; the
campaign's transaction proved it unchanged when the epoch began). The in-memory set is never smaller than what
etcd lists: a joiner is added in memory before it is written, a laggard removed only once the write that
dropped it came back written (fenced by the epoch, as ever).
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gateway.errors import ConfigError, CoordinatorError, JournalError, ReplayError, ReplayRefused
from gateway.journal import JournalReader
from gateway.journal.epochs import start_epoch
from gateway.journal.tools import cut_after
from gateway.server.elector import Elector
from gateway.server.follower import Follower, LeaderInfo, ReplayFactory, ack_valid
from gateway.server.replicas import InSync, eligible, insync_record, parse_record
from gateway.transport.etcd import Etcd
from gateway.transport.link import Link, LinkSet, Listener
from gateway.wire import batch as B
from gateway.wire import protocol as P

if TYPE_CHECKING:
    from gateway.server.gateway import Gateway, _Lane

log = logging.getLogger(__name__)

RETRY_FOLLOW_S = 0.2  # a leader whose sidecar did not answer is tried again this soon
RETRY_WRITE_S = 0.25  # a failed write of the in-sync set is tried again this soon (etcd is not to be hammered)
REPORT_EVERY_S = 1.0  # each report is an etcd request, whose Python work holds the GIL about 0.5 ms
PUSH_HWM = 256  # frames queued to one follower on the peer link beyond the kernel's buffer; past it pushes are
# dropped (it copies them from our sidecar), so a stalled follower costs at most this many batches of memory
PEER_FRAME_MAX = 4096  # the largest frame a follower sends (PING, REPLICA-ACK)
MAX_LINKS = 64  # connections to the peer link; past it the oldest that never carried a good ack is closed
COMMIT_EVERY_S = 0.05  # the leader repeats its commit points to its followers this often (one may be dropped)
COMMIT_LINGER_S = 0.005  # ... and tells a moved one at most this often (pushes carry it meanwhile)


def peer_default(ingest: str) -> str:
    """Where a node's peer link listens unless told: the ingest's address (tcp://HOST:P), a free port."""
    host = urlsplit(ingest).hostname
    if not ingest.startswith("tcp://") or not host:
        raise ConfigError(f"cannot derive the peer link from --ingest {ingest}: give --peer-endpoint tcp://HOST:PORT")
    return f"tcp://{f'[{host}]' if ':' in host else host}:*"


def group_key(streams: list[str]) -> str:
    """The etcd prefix of the group serving `streams`: /zeps/ha/<streams joined by +>."""
    return "/zeps/ha/" + "+".join(sorted(streams))


@dataclass(frozen=True, slots=True)
class Written:
    """The outcome of a write of the in-sync set fenced by `epoch`: `members`, or not written (a successor leads)."""

    epoch: int
    members: frozenset[str]
    written: bool


def write_insync(isr_key: str, leader_key: str, node: str, epoch: int, members: frozenset[str], etcd: Etcd) -> Written:
    """(elector thread) Make the in-sync set `members`, only while this node leads `epoch`."""
    written = etcd.put_if_held(isr_key, insync_record(epoch, node, set(members)), leader_key, epoch)
    return Written(epoch, members, written)


def put_status(key: str, status: str, etcd: Etcd) -> None:
    """(elector thread) The node's status for `zeps ha status`."""
    etcd.put(key, status)


class HaNode:
    """This node's part in the group; the gateway asks it who may do what."""

    def __init__(self, gw: Gateway, replay: ReplayFactory) -> None:
        cfg = gw.config
        self.gw, self.node, self._replay = gw, cfg.node, replay
        prefix = group_key(cfg.streams)
        self.leader_key, self.isr_key = f"{prefix}/leader", f"{prefix}/insync"
        # A secret of this process, published in the leader key (readable only by etcd's clients: the group):
        # followers key their acks' macs with it, so that no one who reaches our peer link can forge an ack.
        self._ack_key = secrets.token_bytes(32)
        self.peer = Listener(cfg.peer_endpoint or peer_default(cfg.ingest))
        self._links = LinkSet(gw.watch, gw.unwatch)  # the followers' (and anyone's) connections to it
        self.info = LeaderInfo(cfg.node, cfg.ingest, cfg.replay_endpoint, self.peer.endpoint, self._ack_key.hex())
        self._value = self.info.encode()  # the leader key's value while we hold it
        self._forged_logged = False
        self._unframed_logged = False
        self._untrusted_logged = False
        self._unreadable = 0  # the epoch whose leader key this version could not read, once said
        self._refused_by = 0  # the epoch whose leader's sidecar refused us for good, once said
        self._campaigned_on: str | None = None  # (elector thread) the in-sync record of the last campaign
        try:
            self.elector = Elector(cfg.etcd, self.leader_key, self._value, poll_s=0.05, eligible=self._eligible)
        except BaseException:
            self.peer.close()
            raise
        self.insync: InSync | None = None
        self.follower: Follower | None = None
        self._peers: dict[str, Link] = {}  # leading: follower node -> the link its last good ack came on
        self._next_commit = 0.0  # when the commit points are told to the followers again, moved or not
        self._commit_at = 0.0  # the earliest they are told again when they moved
        self._commit_owed = False  # they moved since last told
        self._retry_at = 0.0
        self._recorded: set[str] = set()  # the in-sync set as last written to etcd
        # the write of the in-sync set in flight: (epoch, members; None for a take-over), and whom it drops
        self._writing: tuple[int, frozenset[str] | None] | None = None
        self._dropping: set[str] = set()
        self._write_retry_at = 0.0
        self.status_key = f"{prefix}/nodes/{cfg.node}"
        self._report_at = 0.0

    def _eligible(self, etcd: Etcd) -> tuple[str, int] | None:
        """(elector thread) May this node campaign: it led or was in sync last (the set's revision), or None."""
        record = etcd.holder(self.isr_key)
        self._campaigned_on = None if record is None else record.value
        if record is None:
            return (self.isr_key, 0)  # a new group: anyone, unless a set is written meanwhile
        return (self.isr_key, record.mod_revision) if eligible(self.node, record.value) else None

    def start(self) -> HaNode:
        self.gw.watch(self.elector)  # an outcome of etcd wakes the loop
        self.gw.watch(self.peer)  # so does a follower's ping or ack
        self.elector.start()
        return self

    def _report(self, now: float) -> None:
        """Post this node's status (built here, on the loop) for the elector's thread to write."""
        self._report_at = now + REPORT_EVERY_S
        insync, follower = self.insync, self.follower
        status = {
            "role": "leader" if insync is not None else "follower",
            "epoch": insync.epoch if insync is not None else (follower.epoch if follower is not None else 0),
            "heads": {s: lane.writer.last_seq for s, lane in self.gw.lanes.items()},
            "time": time.time(),
        }
        if insync is not None:
            status["committed"] = dict(insync.committed)
        self.elector.post("status", partial(put_status, self.status_key, json.dumps(status)))

    # --- what the gateway asks ---------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self.insync is not None

    @property
    def epoch(self) -> int:
        return self.insync.epoch if self.insync is not None else 0

    def standing(self) -> tuple[int, bool]:
        """(epoch, leads) for announcements: the epoch this node leads, or the one whose leader it follows."""
        if self.insync is not None:
            return self.insync.epoch, True
        return (self.follower.epoch if self.follower is not None else 0), False

    @property
    def quorate(self) -> bool:
        """Whether this node leads with enough in-sync followers to commit."""
        return self.insync is not None and self.insync.quorate

    def committed(self, stream: str) -> int:
        """How far `stream` may be multicast and served: every in-sync follower wrote it."""
        return self.insync.committed[stream] if self.insync is not None else 0

    def durable(self, stream: str) -> int:
        """How far `stream` may be confirmed, as far as the followers go: every in-sync follower made it durable."""
        return self.insync.durable[stream] if self.insync is not None else 0

    def refusal(self) -> str:
        """Why this node takes no publishes, naming the leader to publish to."""
        holder = self.elector.holder()
        if holder is None or holder.value == self._value:
            where = "none is elected yet"
        else:
            try:
                info = LeaderInfo.decode(holder.value)
                where = f"the leader is {info.node} at {info.reachable(info.ingest)} (epoch {holder.create_revision})"
            except CoordinatorError:
                where = f"the leader of epoch {holder.create_revision} is not of this version"
        return f"gateway node {self.node} is a follower ({where}): publish to the leader; retry later"

    # --- the peer link ---------------------------------------------------------------------------------

    def _serve_peers(self, now: float, limit: int = 1024) -> None:
        """Take new connections, answer the followers' pings and count their acks (never waits)."""
        tls = self.gw.config.peer_tls
        for link in self.peer.accept(max_frame=PEER_FRAME_MAX, max_queued=PUSH_HWM, tls=tls.server if tls else None):
            self._links.add(link)
            if len(self._links) > MAX_LINKS:  # someone opens connections and sends nothing: the oldest idle goes
                idle = next((k for k in self._links if k not in self._peers.values()), link)
                self._links.drop(idle)
        for link in self._links:
            for frame in link.frames(limit):
                try:
                    cmd = P.decode(frame)
                except P.ProtocolError:
                    self.gw.metrics.rejected.labels("invalid").inc()  # not a node of ours: nothing to answer
                    continue
                if isinstance(cmd, P.Ping):
                    self._tell(link, P.PingOk())
                elif isinstance(cmd, P.ReplicaAck):
                    self._ack(link, cmd, now)
                else:
                    self.gw.metrics.rejected.labels("invalid").inc()
            link.flush()
            if link.closed:
                if link.unframed:  # not a peer of this version (a ZeroMQ one), or a hostile one
                    self.gw.metrics.rejected.labels("invalid").inc()
                    if not self._unframed_logged:  # once: anyone who reaches the port can send junk
                        log.warning("ha: closed a connection to the peer link that is not in this version's framing "
                                    "(%s): run one version of zeps on every node of a group; further ones are only "
                                    "counted (zeps_gateway_rejected_messages)", link.error)  # fmt: skip
                        self._unframed_logged = True
                elif link.untrusted:  # TLS refused it: not a node of the group (or one without its certificate)
                    self.gw.metrics.rejected.labels("auth").inc()
                    if not self._untrusted_logged:  # once: anyone who reaches the port can try
                        log.warning("ha: refused a connection to the peer link (%s): every node needs a certificate "
                                    "of the group's CA (--peer-tls-cert, --peer-tls-key, --peer-tls-ca); further ones "
                                    "are only counted (zeps_gateway_rejected_messages)", link.error)  # fmt: skip
                        self._untrusted_logged = True
                self._drop_link(link)
        self._links.refresh()

    def _drop_link(self, link: Link) -> None:
        self._links.drop(link)
        for node in [n for n, k in self._peers.items() if k is link]:
            del self._peers[node]

    def _ack(self, link: Link, ack: P.ReplicaAck, now: float) -> None:
        """Count a follower's ack if its mac proves a node of the group made it; drop and count a forged one.
        `link`: where the follower is (pushes and REPLICA-COMMITs go there)."""
        if self.insync is None:
            return  # a follower takes no acks; nothing to tell
        if not ack_valid(self._ack_key, ack):
            self.gw.metrics.rejected.labels("forged-ack").inc()
            if not self._forged_logged:  # once: a forger can send many
                log.warning(
                    "ha: dropped a REPLICA-ACK for node %r with a wrong mac (not from a node of the group); "
                    "further ones are only counted (zeps_gateway_rejected_messages)",
                    ack.node,
                )
                self._forged_logged = True
            return
        self.insync.ack(ack.node, ack.epoch, ack.stream, ack.sequence, ack.durable, now)
        if ack.epoch == self.insync.epoch:
            self._peers[ack.node] = link

    def push(self, stream: str, sealed: bytes) -> None:
        """Send a batch just journaled to the followers level with us (they acknowledged what is committed), so
        their copy skips our sidecar. A follower that misses one (behind, its link full) learns it from the
        head in our next REPLICA-COMMIT and copies from our sidecar again (gateway.server.follower)."""
        insync = self.insync
        if insync is None or not self._peers:
            return
        frame = b""
        for node, link in self._peers.items():
            follower = insync.followers.get(node)
            if follower is not None and follower.acked.get(stream, 0) >= insync.committed[stream]:
                frame = frame or P.encode(P.ReplicaBatch(stream, insync.epoch, insync.committed[stream], sealed))
                link.send(frame)
        self._links.refresh()  # a push the kernel did not take whole: poll for room

    def _tell(self, link: Link, cmd: P.Command) -> None:
        """A reply on the peer link; one that cannot go (the follower gone, or not reading) is said again later:
        its pings come every ACK_EVERY_S, commits every COMMIT_EVERY_S."""
        link.send(P.encode(cmd))

    # --- the loop's hook ---------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Hear the followers and etcd, take or leave the lead, and advance the commit points (the gateway then
        multicasts what they let through, and calls `after_release`)."""
        self._serve_peers(now)
        for name, outcome in self.elector.outcomes():
            if name == "insync":
                self._written(outcome, now)
            # a status not written is not worth a word: the elector says when etcd is unreachable
        epoch, until = self.elector.authority()
        acting = now < until
        if self.insync is not None and (not acting or self.insync.epoch != epoch):
            self._demote()  # a new epoch means this node's authority lapsed in between: it starts afresh
        if acting and self.insync is None:
            self._promote(epoch, now)
        if self.insync is not None:
            self.insync.advance({s: lane.writer.last_seq for s, lane in self.gw.lanes.items()}, now)
        else:
            self._follow(now)

    @property
    def due(self) -> float:
        """When the loop must run again for this node's timers: a moved commit point owed to the followers."""
        if self.insync is None or not self._peers:
            return math.inf
        return self._commit_at if self._commit_owed else self._next_commit

    def after_release(self, now: float) -> None:
        """What waits until the committed batches are on their way: telling the sidecar and the followers how far
        is committed (each wakes another process, which may take our core), the in-sync set, the status."""
        if self.insync is not None:
            self._lead(now)
        if now >= self._report_at:
            self._report(now)

    def _promote(self, epoch: int, now: float) -> None:
        """Ask for the previous epoch's in-sync set to be taken over (`_written` makes this node lead then)."""
        self._unfollow()  # acknowledge nothing more to the old leader before acting as the new one
        if self._writing is not None or now < self._write_retry_at:
            return
        self._writing, self._dropping = (epoch, None), set()
        self.elector.post("insync", partial(self._take_over, epoch))

    def _take_over(self, epoch: int, etcd: Etcd) -> Written:
        """(elector thread) Inherit the in-sync set of the campaign that won `epoch` (if the last one did: else
        the write is fenced out), less the previous leader and this node."""
        old_leader, members = parse_record(self._campaigned_on)
        inherited = frozenset(members - {old_leader, self.node})
        return write_insync(self.isr_key, self.leader_key, self.node, epoch, inherited, etcd)

    def _written(self, outcome: Written | CoordinatorError, now: float) -> None:
        """A write of the in-sync set came back: lead (a take-over), or apply what it changed."""
        writing, self._writing = self._writing, None
        assert writing is not None  # one write in flight at a time, and this was it
        epoch, target = writing
        if isinstance(outcome, CoordinatorError) or not outcome.written:
            why = outcome if isinstance(outcome, CoordinatorError) else "a successor leads"
            log.warning("ha: %s (%s); trying again", "cannot take over yet" if target is None else "in-sync set not "
                        "written", why)  # fmt: skip
            self._write_retry_at = now + RETRY_WRITE_S
            return
        authority, until = self.elector.authority()
        if target is None and now < until and authority == epoch and self.insync is None:
            self._lead_from(epoch, outcome.members, now)
        elif target is not None and self.insync is not None and self.insync.epoch == epoch:
            for gone in self._dropping:
                self.insync.remove(gone)  # only now: commits went on without it only once etcd no longer lists it
                self._peers.pop(gone, None)  # told of commits again once it acks again
            log.info("ha: in sync now: %s (was %s)", sorted(target), sorted(self._recorded))
            self._recorded = set(target)

    def _lead_from(self, epoch: int, members: frozenset[str], now: float) -> None:
        insync = InSync(
            self.node, epoch, self.gw.config.min_insync, self.gw.config.ha_lag_s, dict.fromkeys(self.gw.lanes, 0)
        )
        insync.start(set(members), now)
        heads = {s: lane.writer.last_seq for s, lane in self.gw.lanes.items()}
        for stream, head in heads.items():
            start_epoch(self.gw.lanes[stream].writer.directory, epoch, head + 1)
        self.insync, self._recorded, self._peers = insync, set(insync.members), {}
        log.info("ha: %s leads epoch %d from heads %s, in sync: %s", self.node, epoch, heads, sorted(insync.members))

    def _demote(self) -> None:
        log.warning("ha: %s no longer leads (epoch %d): taking no more publishes", self.node, self.epoch)
        self.insync = None
        self.gw.step_down(self.refusal())

    def _lead(self, now: float) -> None:
        """Tell the commit points; bring etcd's in-sync set to what it should be (joiners in, laggards out)."""
        insync = self.insync
        assert insync is not None
        self._tell_commits(insync, now)
        for name in insync.joinable():
            insync.add(name)  # here first: commits wait for it before etcd says it may be elected
        target = insync.members - set(insync.laggards(now))
        if target == self._recorded or self._writing is not None or now < self._write_retry_at:
            return
        self._writing, self._dropping = (insync.epoch, frozenset(target)), insync.members - target
        self.elector.post("insync", partial(write_insync, self.isr_key, self.leader_key, self.node, insync.epoch,
                                            frozenset(target)))  # fmt: skip

    def _tell_commits(self, insync: InSync, now: float) -> None:
        """Publish the commit points to our sidecar at once, and to our followers when they moved, at most every
        COMMIT_LINGER_S (and again every COMMIT_EVERY_S): while batches flow, each push carries the point too, so
        a follower is not woken by a REPLICA-COMMIT per batch; when they stop, it learns the last one within
        COMMIT_LINGER_S."""
        for stream, seq in insync.committed.items():
            mark = self.gw.marks[stream]
            if seq > mark.value:
                mark.advance(seq)
                self._commit_owed = True
        if not (self._commit_owed and now >= self._commit_at) and now < self._next_commit:
            return
        self._commit_owed = False
        self._commit_at, self._next_commit = now + COMMIT_LINGER_S, now + COMMIT_EVERY_S
        for link in self._peers.values():
            for stream, seq in insync.committed.items():
                head = self.gw.lanes[stream].writer.last_seq  # every batch to it was pushed before this
                self._tell(link, P.ReplicaCommit(stream, insync.epoch, seq, head))
        self._links.refresh()

    # --- following ---------------------------------------------------------------------------------------

    def _follow(self, now: float) -> None:
        holder = self.elector.holder()
        if holder is None or holder.value == self._value:
            if self.follower is not None:
                self._unfollow()
            return
        f = self.follower
        if f is not None and f.epoch != holder.create_revision:
            self._unfollow()
            f = None
        if f is None:
            try:
                leader = LeaderInfo.decode(holder.value)
            except CoordinatorError as exc:
                if self._unreadable != holder.create_revision:  # said once per leader
                    self._unreadable = holder.create_revision
                    log.error("ha: cannot follow the leader of epoch %d: %s", holder.create_revision, exc)
                return
            f = self.follower = Follower(self.gw.ctx, self._replay, self.node, leader, holder.create_revision,
                                         self.gw.config.ha_suspect_s, watch=self.gw.watch, unwatch=self.gw.unwatch,
                                         max_frame=self.gw.config.max_frame_bytes + PEER_FRAME_MAX,
                                         tls=self.gw.config.peer_tls)  # fmt: skip
        suspected = f.tick(now)
        if suspected:
            log.warning("ha: leader %s (epoch %d) %s; campaigning", f.leader.node, f.epoch, suspected)
            self._unfollow()  # acknowledge nothing more to it, then depose it
            self.elector.suspect(holder.create_revision)
            return
        self.elector.leader_heard(f.answering(now))
        for stream, seq in f.committed.items():
            self.gw.marks[stream].advance(seq)
        if not f.copies:
            if f.answering(now) and now >= self._retry_at:
                self._start_copies(f)
            return
        try:
            for stream in f.copies:
                self.copy(stream)
        except (ReplayError, JournalError, OSError) as exc:  # the leader's sidecar went away, or our disk is full
            self._copy_failed(f, "replication from %s stopped (%s); starting again", exc, now)

    def copy(self, stream: str) -> None:
        """Journal what the leader sent for `stream`, verbatim, where it continues our journal: its sidecar's
        tail while we are behind, its pushes once level (gateway.server.follower, which says when each); ack it
        as written at once, and as durable once a group commit covers it (on the journal's own timer, as the
        leader's, run by the syncer thread: the loop copies on meanwhile)."""
        f, lane = self.follower, self.gw.lanes[stream]
        assert f is not None
        writer = lane.writer
        copied = self.gw.metrics.streams[stream].copied
        for batch in f.batches(stream):  # the sidecar's tail, in order; what a push brought first is skipped
            if batch.last_seq > writer.last_seq:
                self._append(lane, batch)
                copied["sidecar"].inc()
        level = gap = False
        for batch in f.pushes(stream):  # the leader's pushes, in its order
            if batch.first_seq == writer.last_seq + 1:
                self._append(lane, batch)
                copied["push"].inc()
                level = True
            elif batch.first_seq > writer.last_seq + 1:
                gap = True
        writer.take_finished_sync()
        f.journaled(stream, writer.last_seq, writer.durable_seq)
        if f.tailing(stream):
            if level and not gap:
                self._untail(f, stream)  # level with the leader: its pushes carry on, its sidecar rests
        elif gap or f.missed(stream, writer.last_seq):
            log.debug("ha: stream %s: a push after %d went missing; copying from the sidecar", stream, writer.last_seq)
            self.gw.watch(f.tail(stream, writer.last_seq, writer.durable_seq).sock)

    @staticmethod
    def _append(lane: _Lane, batch: B.Batch) -> None:
        lane.writer.append_replica(batch)
        lane.producers.journaled(batch)

    def _start_copies(self, f: Follower) -> None:
        """Cut our journal back to the leader's, then copy each stream after its head, from the leader's sidecar
        until level (waits, bounded)."""
        try:
            for stream in self.gw.lanes:
                self._reconcile(f, stream)
            for stream, lane in self.gw.lanes.items():
                self.gw.watch(f.tail(stream, lane.writer.last_seq, lane.writer.durable_seq).sock)
        except (ReplayError, JournalError) as exc:
            self._copy_failed(f, "cannot copy from %s yet (%s); trying again", exc, time.monotonic())
            return
        log.info("ha: %s follows %s (epoch %d)", self.node, f.leader.node, f.epoch)

    def _copy_failed(self, f: Follower, what: str, exc: Exception, now: float) -> None:
        """Stop copying and try again soon. A refusal that retrying cannot fix (a CURVE key the leader's sidecar
        does not take, say) is a warning, once per leader: the node stays out of the in-sync set until fixed."""
        if isinstance(exc, ReplayRefused) and self._refused_by != f.epoch:
            self._refused_by = f.epoch
            log.warning("ha: " + what, f.leader.node, exc)
        else:
            log.info("ha: " + what, f.leader.node, exc)
        self._drop_copies(f)
        self._retry_at = now + RETRY_FOLLOW_S

    def _untail(self, f: Follower, stream: str) -> None:
        client = f.untail(stream)
        if client is not None:
            self.gw.unwatch(client.sock)
            client.close()

    def _drop_copies(self, f: Follower) -> None:
        for stream in f.copies:
            self._untail(f, stream)
        f.drop_copies()

    def _reconcile(self, f: Follower, stream: str) -> None:
        """Cut our journal back to the last batch the leader holds too, in one cut.

        Whether the leader holds a batch of ours is monotone (true up to where the journals part, false after:
        each batch was copied with every batch before it), so the point is found by galloping back from our
        head, then halving: a few FETCHes for a long divergence (a deposed leader that journaled alone for a
        while), one in the usual case (nothing to cut)."""
        head, reader = self.gw.lanes[stream].writer.last_seq, JournalReader(self.gw.config.journal, stream)
        # The leader holds our ..agreed, and not the batch that starts at differs. What retention removed is no
        # longer ours to compare or cut.
        agreed = reader.first_seq - 1 if head else 0
        differs = head + 1
        probe, step = head, 1
        while probe > agreed:  # gallop back from the head: 1, 2, 4... sequences below the last batch that differs
            own = _batch_at(reader, probe)
            if f.matches(stream, own):
                agreed = own.last_seq
                break
            differs, probe, step = own.first_seq, own.first_seq - step, step * 2
        while agreed + 1 < differs:  # then halve what is left between them
            own = _batch_at(reader, (agreed + differs) // 2)
            if own.first_seq >= differs:  # our journal jumps over the rest (a copy that started at a trimmed leader's)
                break
            if f.matches(stream, own):
                agreed = own.last_seq
            else:
                differs = own.first_seq
        if agreed < head:
            self._cut(f, stream, agreed, head)

    def _cut(self, f: Follower, stream: str, keep: int, head: int) -> None:
        lane, mark = self.gw.lanes[stream], self.gw.marks[stream]
        if keep < mark.value:  # committed records are never cut: our journal is not what we thought
            log.error("ha: stream %s: cutting to %d, below the committed mark %d", stream, keep, mark.value)
            mark.lower(keep)
        lane.writer.close()
        cut_after(self.gw.config.journal, stream, keep)
        self.gw.reopen(stream)
        log.warning("ha: stream %s: dropped %d..%d, which leader %s does not have", stream, keep + 1, head,
                    f.leader.node)  # fmt: skip

    def _unfollow(self) -> None:
        f = self.follower
        if f is not None:
            self._drop_copies(f)
            f.close()
            self.elector.leader_heard(False)
        self.follower = None

    def close(self) -> None:
        self._unfollow()
        self.gw.unwatch(self.elector)
        for link in self._links:
            self._links.drop(link)
        self.gw.unwatch(self.peer)
        self.peer.close()
        self.elector.close(resign=True)


def _batch_at(reader: JournalReader, seq: int) -> B.Batch:
    """The batch of `reader`'s journal that holds `seq`."""
    with reader.cursor(seq) as cursor:
        batch = cursor.next_batch()
    if batch is None:
        raise JournalError(f"stream {reader.stream}: no batch holds {seq}, below the journal's head")
    return B.Batch.parse(bytes(batch))
