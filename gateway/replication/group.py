"""A gateway node of a replicated group (docs/ha.md): leader or follower, decided by the elector.

The leader sequences and journals as a single gateway does, but multicasts a batch only once it is committed
(gateway.replication.replicas: every in-sync follower wrote it, and there are `min_insync` of them) and confirms it
only once it is durable there too, and only while the authority clock lets it act. A follower refuses
publishers (naming the leader), copies the leader's journal into its own verbatim, acknowledges what it wrote
and what it made durable, and suspects a leader that stops answering: the elector then revokes that leader's
lease and campaigns.

`GroupNode` is the gateway's replication strategy for a node (gateway.replication.strategy); it composes one
part per job, each built from explicit inputs (Aeron Archive's one session per job):

- the peer-link server (gateway.replication.peer_server): followers' pings and acks in, pushes and commit points out;
- the replica copier (gateway.replication.copier): while following, the one cut that makes our journal a prefix of
  the leader's, then the copy;
- the in-sync keeper (gateway.replication.insync_keeper): the in-sync set and the node's status in etcd;
- the elector (gateway.replication.elector): the lease, on a thread of its own; it campaigns only while this node's
  sidecar answers (gateway.replication.sidecar_check) and the node was in sync.

Every node publishes to its sidecar how far each stream is committed (gateway.journal.committed), and its
sidecar serves no further: the leader from its in-sync set, a follower from the leader's REPLICA-COMMITs.

Threading contract: every method runs on the gateway's loop and none waits on etcd (the keeper's jobs and the
elector's campaign run on the elector's thread; their outcomes come back through `Elector.outcomes()`, which
`tick` empties: the elector's eventfd is in the loop's poller, so an outcome wakes it).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import zmq
from prometheus_client import Counter

from gateway.errors import ConfigError, CoordinatorError
from gateway.journal.committed import CommittedMark
from gateway.journal.epochs import start_epoch
from gateway.journal.promotion import Promotion, read_promotion, read_source
from gateway.replication.copier import ReplicaCopier
from gateway.replication.elector import Elector
from gateway.replication.follower import Follower, LeaderInfo, ReplayFactory
from gateway.replication.insync_keeper import GroupKeys, InSyncKeeper, Written
from gateway.replication.peer_server import PEER_FRAME_MAX, PeerServer
from gateway.replication.promotions import LEARN_EVERY_S, Learnt, learn, promote, record_source
from gateway.replication.replicas import InSync
from gateway.replication.sidecar_check import SidecarCheck
from gateway.replication.strategy import ReplicaLane
from gateway.transport.etcd import Etcd
from gateway.transport.pollable import Unwatch, Watch
from gateway.transport.send_errors import SendErrors
from gateway.transport.tls import PeerTls
from gateway.wire.reasons import not_leading, retry_later

log = logging.getLogger(__name__)

PROMOTE_JOB = "promote:"  # the elector job promoting a stream is named this and the stream
SOURCE_JOB = "source:"  # the leader's job recording a mirror stream's source is named this and the stream
LEARN_JOB = "promotions"  # the follower's job reading the group's promotions and mirror sources


def peer_default(ingest: str) -> str:
    """Where a node's peer link listens unless told: the ingest's address (tcp://HOST:P), a free port."""
    host = urlsplit(ingest).hostname
    if not ingest.startswith("tcp://") or not host:
        raise ConfigError(f"cannot derive the peer link from --ingest {ingest}: give --peer-endpoint tcp://HOST:PORT")
    return f"tcp://{f'[{host}]' if ':' in host else host}:*"


def group_key(streams: list[str]) -> str:
    """The etcd prefix of the group serving `streams`: /zeps/ha/<streams joined by +>."""
    return "/zeps/ha/" + "+".join(sorted(streams))


@dataclass(frozen=True)
class GroupConfig:
    """What a node is told (gateway.sequencer.gateway.GatewayConfig's group fields)."""

    node: str
    streams: list[str]
    etcd: tuple[str, ...]
    ingest: str
    sidecar: str  # the node's replay sidecar: its followers copy its journal from there
    peer_endpoint: str  # "": the ingest's address, a free port
    min_insync: int
    lag_s: float
    suspect_s: float
    max_frame: int  # the largest ingest frame: a push carries one batch of it
    journal: Path
    peer_tls: PeerTls | None = None  # the group's TLS on the peer link (gateway.transport.tls); None: plain TCP
    mirrors: tuple[str, ...] = ()  # its mirror streams (docs/mirroring.md): a follower learns their promotions
    # and sources


@dataclass(frozen=True)
class NodeHost:
    """What a node uses of its gateway: its lanes, marks and poller, and what it does when told."""

    ctx: zmq.Context
    lanes: Mapping[str, ReplicaLane]
    marks: Mapping[str, CommittedMark]
    rejected: Counter  # refused messages, by reason
    copied: Mapping[str, Mapping[str, Counter]]  # per stream, per source: batches a follower copied
    watch: Watch
    unwatch: Unwatch
    reopen: Callable[[str], None]  # open a stream's journal again after a cut
    step_down: Callable[[str], None]  # stop leading: refuse what was not journaled, naming why
    promoted: Callable[[Mapping[str, Promotion]], None]  # the group's promotions, by stream, as learnt
    mirrored: Callable[[Mapping[str, str]], None]  # its mirror streams' sources (stream -> sidecar), as learnt
    send_errors: SendErrors | None = None  # where sends the network refuses are reported (peer link, etcd)


class GroupNode:
    """This node's part in the group; the gateway asks it who may do what (gateway.replication.strategy)."""

    poll_s = 0.01  # acks, pings, commits

    def __init__(self, cfg: GroupConfig, host: NodeHost, replay: ReplayFactory) -> None:
        self.cfg, self.host, self.node, self._replay = cfg, host, cfg.node, replay
        prefix = group_key(cfg.streams)
        keys = GroupKeys(f"{prefix}/leader", f"{prefix}/insync", f"{prefix}/nodes/{cfg.node}", f"{prefix}/promoted/",
                         f"{prefix}/sources/")  # fmt: skip
        # A secret of this process, published in the leader key (readable only by etcd's clients: the group):
        # followers key their acks' macs with it, so that no one who reaches our peer link can forge an ack.
        ack_key = secrets.token_bytes(32)
        self.peers = PeerServer(
            cfg.peer_endpoint or peer_default(cfg.ingest),
            ack_key,
            host.lanes,
            host.rejected,
            host.watch,
            host.unwatch,
            errors=host.send_errors,
            tls=cfg.peer_tls,
        )
        self.info = LeaderInfo(cfg.node, cfg.ingest, cfg.sidecar, self.peers.endpoint, ack_key.hex())
        self._value = self.info.encode()  # the leader key's value while we hold it
        self.keys = keys
        self.keeper = InSyncKeeper(cfg.node, keys, self._post)
        own = cfg.sidecar  # asked before each campaign, as our followers will ask it
        self.sidecar_answers = SidecarCheck(own, lambda timeout_s: replay(own, cfg.streams[0], timeout_s, host.ctx))
        try:
            self.elector = Elector(cfg.etcd, keys.leader, self._value, poll_s=0.05, eligible=self._eligible,
                                   errors=host.send_errors)  # fmt: skip
        except BaseException:
            self.peers.listener.close()
            raise
        self.copier = ReplicaCopier(cfg.journal, host.lanes, host.marks, host.reopen, host.copied)
        self.insync: InSync | None = None
        self.follower: Follower | None = None
        self._unreadable = 0  # the epoch whose leader key this version could not read, once said
        self._promoting: dict[str, Callable[[str | None], None]] = {}  # stream -> told how its promotion ended
        self._learn_at = 0.0  # a follower reads the group's promotions and sources again then
        self._led_at: float | None = None  # when this node began to lead, until its first commit there (logged)
        self._sources: dict[str, tuple[int, str]] = {}  # stream -> (epoch, source) recorded (or being recorded)

    def _eligible(self, etcd: Etcd) -> tuple[str, int] | None:
        """(elector thread) Whether this node may campaign: its sidecar answers (gateway.replication.sidecar_check),
        and it was in sync (InSyncKeeper.eligible, asked first: a node that may not lead asks its sidecar nothing)."""
        unchanged = self.keeper.eligible(etcd)
        return unchanged if unchanged is not None and self.sidecar_answers() else None

    def _post(self, name: str, job: Callable[..., object]) -> None:
        self.elector.post(name, job)

    def start(self) -> GroupNode:
        self.host.watch(self.elector, zmq.POLLIN)  # an outcome of etcd wakes the loop
        self.peers.start()
        self.elector.start()
        return self

    def _status(self) -> str:
        """This node's status for `zeps ha status` (built here, on the loop)."""
        insync, follower = self.insync, self.follower
        status = {
            "role": "leader" if insync is not None else "follower",
            "epoch": insync.epoch if insync is not None else (follower.epoch if follower is not None else 0),
            "heads": {s: lane.head for s, lane in self.host.lanes.items()},
            "time": time.time(),
        }
        if insync is not None:
            status["committed"] = dict(insync.committed)
        return json.dumps(status)

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

    def committed(self, lane: ReplicaLane) -> int:
        """How far a stream may be multicast and served: every in-sync follower wrote it."""
        return self.insync.committed[lane.stream] if self.insync is not None else 0

    def durable(self, lane: ReplicaLane) -> int:
        """How far a stream may be confirmed: durable here and on every in-sync follower."""
        return min(lane.writer.durable_seq, self.insync.durable[lane.stream] if self.insync is not None else 0)

    def refusal(self) -> str | None:
        return None if self.leading else self._refusal()

    def _refusal(self) -> str:
        """Why this node takes no publishes, naming the leader to publish to (not one it found silent: until
        its elector reads the key again, that would send publishers back to a leader that is gone)."""
        holder = self.elector.holder()
        if holder is None or holder.value == self._value or holder.create_revision == self.elector.suspected:
            where = "none is elected yet"
        else:
            try:
                info = LeaderInfo.decode(holder.value)
                where = f"the leader is {info.node} at {info.reachable(info.ingest)} (epoch {holder.create_revision})"
            except CoordinatorError:
                where = f"the leader of epoch {holder.create_revision} is not of this version"
        return retry_later(f"gateway node {self.node} is a follower ({where}): publish to the leader")

    def promote(self, stream: str, promotion: Promotion, done: Callable[[str | None], None]) -> None:
        """Make `stream`'s `promotion` the group's, in etcd fenced by our epoch (a job of the elector's
        thread); `done(None)` once written, `done(why)` if not (called from `tick`)."""
        if self.insync is None:
            done(not_leading(self.node))
            return
        self._promoting[stream] = done
        job = partial(promote, self.keys.promoted, stream, promotion, self.keys.leader, self.insync.epoch)
        self.elector.post(f"{PROMOTE_JOB}{stream}", job)

    def mirror_source(self, stream: str, source: str) -> None:
        """A mirror session of `stream` named `source`: the leader records it for its followers, once per
        epoch and source (a job of the elector's thread; one not written is tried again at the next session)."""
        if self.insync is None or not source or self._sources.get(stream) == (self.insync.epoch, source):
            return
        self._sources[stream] = (self.insync.epoch, source)
        job = partial(record_source, self.keys.sources, stream, source, self.keys.leader, self.insync.epoch)
        self.elector.post(f"{SOURCE_JOB}{stream}", job)

    def _promotion(self, stream: str, outcome: bool | CoordinatorError) -> None:
        done = self._promoting.pop(stream, None)
        if done is None:
            return
        if isinstance(outcome, CoordinatorError):
            done(str(outcome))
        else:
            done(None if outcome else not_leading(self.node))

    def _own_promotions(self) -> dict[str, Promotion]:
        """The promotion marks of this node's journal (a node about to lead adds them to the group's)."""
        marks = {stream: read_promotion(lane.writer.directory) for stream, lane in self.host.lanes.items()}
        return {stream: mark for stream, mark in marks.items() if mark is not None}

    def _own_sources(self) -> dict[str, str]:
        """The sources of this node's mirror streams, as their journals' marks keep them (a new leader records
        them for its followers)."""
        sources = {stream: read_source(self.host.lanes[stream].writer.directory) for stream in self.cfg.mirrors}
        return {stream: source for stream, source in sources.items() if source}

    def journaled(self, stream: str, sealed: bytes) -> None:
        """A batch just journaled goes to the followers level with us (gateway.replication.peer_server.push)."""
        if self.insync is not None:
            self.peers.push(self.insync, stream, sealed)

    # --- the loop's hook ---------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Hear the followers and etcd, take or leave the lead, and advance the commit points (the gateway then
        multicasts what they let through, and calls `after_release`)."""
        self.peers.serve(self.insync, now, answer=self.elector.may_act(now))  # else its followers must suspect us
        for name, outcome in self.elector.outcomes():
            if name == "insync":
                self._written(outcome, now)
            elif name.startswith(PROMOTE_JOB):
                self._promotion(name[len(PROMOTE_JOB) :], outcome)
            elif name.startswith(SOURCE_JOB) and outcome is not True:
                self._sources.pop(name[len(SOURCE_JOB) :], None)  # recorded again at the next mirror session
            elif name == LEARN_JOB and isinstance(outcome, Learnt):
                self.host.promoted(outcome.promotions)  # a follower's mark, in its journal too
                if self.insync is None:  # a leader's own sessions name its sources: nothing older replaces them
                    self.host.mirrored(outcome.sources)
            # a status not written is not worth a word: the elector says when etcd is unreachable
        epoch, until = self.elector.authority()
        acting = now < until
        if self.insync is not None and (not acting or self.insync.epoch != epoch):
            self._demote()  # a new epoch means this node's authority lapsed in between: it starts afresh
        if acting and self.insync is None:
            self._unfollow()  # acknowledge nothing more to the old leader before acting as the new one
            self.keeper.take_over(epoch, now, self._own_promotions)  # `_written` makes this node lead once written
        if self.insync is not None:
            self.insync.advance({s: lane.head for s, lane in self.host.lanes.items()}, now)
        else:
            self._follow(now)

    @property
    def due(self) -> float:
        """When the loop must run again for this node's timers: a moved commit point owed to the followers."""
        return self.peers.due(self.leading)

    def after_release(self, now: float) -> None:
        """What waits until the committed batches are on their way: telling the sidecar and the followers how far
        is committed (each wakes another process, which may take our core), the in-sync set, the status."""
        if self.insync is not None:
            self._tell_commits(self.insync, now)
            self.keeper.keep(self.insync, now)
        elif self.cfg.mirrors and now >= self._learn_at:
            self._learn_at = now + LEARN_EVERY_S
            self.elector.post(LEARN_JOB, partial(learn, self.keys.promoted, self.keys.sources))
        self.keeper.report(now, self._status)

    def _written(self, outcome: Written | CoordinatorError, now: float) -> None:
        """A write of the in-sync set came back: lead (a take-over), or forget the followers it dropped."""
        applied = self.keeper.written(outcome, self.insync, now)
        self.peers.forget(set(applied.dropped))  # told of commits again once it acks again
        taken = applied.taken_over
        if taken is None:
            return
        authority, until = self.elector.authority()
        if now < until and authority == taken.epoch and self.insync is None:
            self.host.promoted(taken.promotions)  # before any mirror batch reaches this node as leader
            self._lead_from(taken.epoch, taken.members, now)
            for stream, source in self._own_sources().items():  # at once, not at the next mirror session
                self.mirror_source(stream, source)

    def _lead_from(self, epoch: int, members: frozenset[str], now: float) -> None:
        lanes = self.host.lanes
        heads = {s: lane.head for s, lane in lanes.items()}
        insync = InSync(self.node, epoch, self.cfg.min_insync, self.cfg.lag_s, dict.fromkeys(lanes, 0), heads)
        insync.start(set(members), now)
        for stream, head in heads.items():
            start_epoch(lanes[stream].writer.directory, epoch, head + 1)
        self.insync = insync
        self.keeper.leads(insync)
        self.peers.forget()
        self._led_at = now
        log.info("ha: %s leads epoch %d from heads %s, in sync: %s", self.node, epoch, heads, sorted(insync.members))

    def _demote(self) -> None:
        log.warning("ha: %s no longer leads (epoch %d): taking no more publishes", self.node, self.epoch)
        self.insync = None
        self.host.step_down(self._refusal())

    def _tell_commits(self, insync: InSync, now: float) -> None:
        """Publish the commit points to our sidecar at once, and to our followers (the peer link's pace)."""
        for stream, seq in insync.committed.items():
            mark = self.host.marks[stream]
            if seq > mark.value:
                mark.advance(seq)
                self.peers.commits_moved()
                if self._led_at is not None:  # a failover's hop: from leading to the first commit (docs/hardening.md)
                    log.info("ha: %s's first commit of epoch %d: %s to %d, %.3f s after it led", self.node,
                             insync.epoch, stream, seq, now - self._led_at)  # fmt: skip
                    self._led_at = None
        self.peers.tell_commits(insync, now)

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
            f = self.follower = Follower(self.host.ctx, self._replay, self.node, leader, holder.create_revision,
                                         self.cfg.suspect_s, watch=self.host.watch, unwatch=self.host.unwatch,
                                         max_frame=self.cfg.max_frame + PEER_FRAME_MAX,
                                         errors=self.host.send_errors, tls=self.cfg.peer_tls)  # fmt: skip
        suspected = f.tick(now)
        if suspected:
            log.warning("ha: leader %s (epoch %d) %s; campaigning", f.leader.node, f.epoch, suspected)
            self._unfollow()  # acknowledge nothing more to it, then depose it
            self.elector.suspect(holder.create_revision)
            return
        self.elector.leader_heard(f.answering(now))
        for stream, seq in f.committed.items():
            self.host.marks[stream].advance(seq)
        self.copier.run(f, now)

    def _unfollow(self) -> None:
        f = self.follower
        if f is not None:
            self.copier.stop(f)
            f.close()
            self.elector.leader_heard(False)
        self.follower = None

    def close(self) -> None:
        """Resign, then step down: a node that does not lead refuses, holds and confirms nothing."""
        self._unfollow()
        self.host.unwatch(self.elector)
        self.peers.close()
        self.elector.close(resign=True)
        self.host.step_down(retry_later(f"gateway node {self.node} is shutting down: publish to another node"))
