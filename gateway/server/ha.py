"""A gateway node of a replicated group (docs/ha.md): leader or follower, decided by the elector.

The leader sequences and journals as a single gateway does, but multicasts and confirms a batch only once it
is committed (gateway.server.replicas: every in-sync follower journaled it, and there are `min_insync` of
them), and only while the authority clock lets it act. A follower refuses publishers (naming the leader),
copies the leader's journal into its own verbatim (gateway.server.follower), acknowledges what it journaled,
and suspects a leader that stops answering: the elector then revokes that leader's lease and campaigns.

On following a new leader, a node first drops what its journal holds beyond the leader's (records a former
leader journaled but never got committed): it compares its last batch with the leader's, byte for byte,
and cuts batches from its end until they agree.

Every node publishes to its sidecar how far each stream is committed (gateway.journal.committed), and its
sidecar serves no further: the leader from its in-sync set, a follower from the leader's REPLICA-COMMITs
(sent on each advance and every `COMMIT_EVERY_S`). A follower acknowledges a batch only once it is as durable
as `--fsync` says (written; or fsynced, one fdatasync per drain of the replication link: a group commit).

Each node also says how it is doing under `<group>/nodes/<node>` (role, epoch, heads; `zeps ha status`),
every `REPORT_EVERY_S`, from a thread of its own.

Threading contract: every method runs on the gateway's loop, except `_report`, which runs on the reporter
thread and only reads (single attribute reads: a head, the role). The elector has a thread of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING

from gateway.errors import CoordinatorError, JournalError, ReplayError
from gateway.journal import JournalReader
from gateway.journal.epochs import start_epoch
from gateway.journal.tools import cut_after
from gateway.server.elector import Elector
from gateway.server.follower import Follower, LeaderInfo, ReplayFactory, ack_valid
from gateway.server.replicas import InSync, eligible, parse_record
from gateway.transport.etcd import Etcd
from gateway.wire import batch as B
from gateway.wire import protocol as P

if TYPE_CHECKING:
    from gateway.server.gateway import Gateway

log = logging.getLogger(__name__)

RETRY_FOLLOW_S = 0.2  # a leader whose sidecar did not answer is tried again this soon
RETRY_WRITE_S = 0.25  # a failed write of the in-sync set is tried again this soon (the loop must not spin on etcd)
REPORT_EVERY_S = 0.5
COMMIT_EVERY_S = 0.05  # the leader repeats its commit points to its followers this often (one may be dropped)


def group_key(streams: list[str]) -> str:
    """The etcd prefix of the group serving `streams`: /zeps/ha/<streams joined by +>."""
    return "/zeps/ha/" + "+".join(sorted(streams))


class HaNode:
    """This node's part in the group; the gateway asks it who may do what."""

    def __init__(self, gw: Gateway, replay: ReplayFactory) -> None:
        cfg = gw.config
        self.gw, self.node, self._replay = gw, cfg.node, replay
        prefix = group_key(cfg.streams)
        self.leader_key, self.isr_key = f"{prefix}/leader", f"{prefix}/insync"
        # A secret of this process, published in the leader key (readable only by etcd's clients: the group):
        # followers key their acks' macs with it, so that no client of our ingest can forge an ack.
        self._ack_key = secrets.token_bytes(32)
        self.info = LeaderInfo(cfg.node, cfg.ingest, cfg.replay_endpoint, self._ack_key.hex())
        self._forged_logged = False
        self._etcd = Etcd(cfg.etcd, timeout_s=0.25)
        self.elector = Elector(
            cfg.etcd,
            self.leader_key,
            self.info.encode(),
            poll_s=0.05,
            eligible=self._eligible,
        )
        self.insync: InSync | None = None
        self.follower: Follower | None = None
        self._peers: dict[str, bytes] = {}  # leading: follower node -> its ack link's identity on our ingest
        self._next_commit = 0.0
        self._retry_at = 0.0
        self._recorded: set[str] = set()  # the in-sync set as last written to etcd
        self._write_retry_at = 0.0
        self.status_key = f"{prefix}/nodes/{cfg.node}"
        self._stop = threading.Event()
        self._reporter = threading.Thread(target=self._report, args=(Etcd(cfg.etcd, timeout_s=0.25),),
                                          name="ha-report", daemon=True)  # fmt: skip

    def _eligible(self, etcd: Etcd) -> tuple[str, int] | None:
        """(elector thread) May this node campaign: it led or was in sync last (the set's revision), or None."""
        record = etcd.holder(self.isr_key)
        if record is None:
            return (self.isr_key, 0)  # a new group: anyone, unless a set is written meanwhile
        return (self.isr_key, record.mod_revision) if eligible(self.node, record.value) else None

    def start(self) -> HaNode:
        self.elector.start()
        self._reporter.start()
        return self

    def _report(self, etcd: Etcd) -> None:
        while not self._stop.wait(REPORT_EVERY_S):
            insync, follower = self.insync, self.follower
            status = {
                "role": "leader" if insync is not None else "follower",
                "epoch": insync.epoch if insync is not None else (follower.epoch if follower is not None else 0),
                "heads": {s: lane.writer.last_seq for s, lane in self.gw.lanes.items()},
                "time": time.time(),
            }
            if insync is not None:
                status["committed"] = dict(insync.committed)
            with contextlib.suppress(CoordinatorError):  # the elector says etcd is gone; the next report may pass
                etcd.put(self.status_key, json.dumps(status))

    # --- what the gateway asks ---------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self.insync is not None

    @property
    def epoch(self) -> int:
        return self.insync.epoch if self.insync is not None else 0

    def committed(self, stream: str) -> int:
        return self.insync.committed[stream] if self.insync is not None else 0

    def refusal(self) -> str:
        """Why this node takes no publishes, naming the leader to publish to."""
        holder = self.elector.holder()
        if holder is None or holder.value == self.info.encode():
            where = "none is elected yet"
        else:
            info = LeaderInfo.decode(holder.value)
            where = f"the leader is {info.node} at {info.reachable_ingest} (epoch {holder.create_revision})"
        return f"gateway node {self.node} is a follower ({where}): publish to the leader; retry later"

    def ack(self, identity: bytes, ack: P.ReplicaAck) -> bool:
        """Count a follower's ack if its mac proves a node of the group made it; False for a forged one.
        `identity`: where the follower's link is on our ingest (REPLICA-COMMITs go there)."""
        if self.insync is None:
            return True  # a follower takes no acks; nothing to tell
        if not ack_valid(self._ack_key, ack):
            if not self._forged_logged:  # once: a forger can send many
                log.warning(
                    "ha: dropped a REPLICA-ACK for node %r with a wrong mac (not from a node of the group); "
                    "further ones are only counted (zeps_gateway_rejected_messages)",
                    ack.node,
                )
                self._forged_logged = True
            return False
        self.insync.ack(ack.node, ack.epoch, ack.stream, ack.sequence, time.monotonic())
        if ack.epoch == self.insync.epoch:
            self._peers[ack.node] = identity
        return True

    # --- the loop's hook ---------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        epoch, until = self.elector.authority()
        acting = now < until
        if acting and (self.insync is None or self.insync.epoch != epoch):
            self._promote(epoch, now)
        elif not acting and self.insync is not None:
            self._demote()
        if self.insync is not None:
            self._lead(now)
        else:
            self._follow(now)

    def _promote(self, epoch: int, now: float) -> None:
        self._unfollow()  # acknowledge nothing more to the old leader before acting as the new one
        try:
            old_leader, members = parse_record(self._etcd.get(self.isr_key))
            insync = InSync(
                self.node, epoch, self.gw.config.min_insync, self.gw.config.ha_lag_s, dict.fromkeys(self.gw.lanes, 0)
            )
            insync.start(members - {old_leader}, now)
            if not self._etcd.put_if_held(self.isr_key, insync.record(), self.leader_key, epoch):
                return  # no longer the leader of `epoch`: the elector finds out
        except CoordinatorError as exc:
            log.warning("ha: cannot take over as leader yet: %s", exc)
            return
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
        """Advance the commit point; bring etcd's in-sync set to what it should be (joiners in, laggards out)."""
        insync = self.insync
        assert insync is not None
        insync.advance({s: lane.writer.last_seq for s, lane in self.gw.lanes.items()}, now)
        self._tell_commits(insync, now)
        for name in insync.joinable():
            insync.add(name)  # here first: commits wait for it before etcd says it may be elected
        target = insync.members - set(insync.laggards(now))
        if target == self._recorded or now < self._write_retry_at:
            return
        try:
            written = self._etcd.put_if_held(self.isr_key, insync.record(target), self.leader_key, insync.epoch)
        except CoordinatorError as exc:
            log.warning("ha: in-sync set not written (%s); trying again", exc)
            self._write_retry_at = now + RETRY_WRITE_S
            return
        if not written:  # a successor leads: our authority ends without our doing anything
            log.warning("ha: the in-sync set is no longer ours to write (a successor leads)")
            self._write_retry_at = now + RETRY_WRITE_S
            return
        for gone in insync.members - target:
            insync.remove(gone)  # only now: commits went on without it only once etcd no longer lists it
            self._peers.pop(gone, None)  # told of commits again once it acks again
        log.info("ha: in sync now: %s (was %s)", sorted(target), sorted(self._recorded))
        self._recorded = target

    def _tell_commits(self, insync: InSync, now: float) -> None:
        """Publish the commit points to our sidecar, and to our followers when they moved (or are due again)."""
        moved = False
        for stream, seq in insync.committed.items():
            mark = self.gw.marks[stream]
            if seq > mark.value:
                mark.advance(seq)
                moved = True
        if not moved and now < self._next_commit:
            return
        self._next_commit = now + COMMIT_EVERY_S
        for identity in self._peers.values():
            for stream, seq in insync.committed.items():
                self.gw.reply(identity, P.ReplicaCommit(stream, insync.epoch, seq))

    # --- following ---------------------------------------------------------------------------------------

    def _follow(self, now: float) -> None:
        holder = self.elector.holder()
        if holder is None or holder.value == self.info.encode():
            if self.follower is not None:
                self._unfollow()
            return
        f = self.follower
        if f is not None and f.epoch != holder.create_revision:
            self._unfollow()
            f = None
        if f is None:
            leader = LeaderInfo.decode(holder.value)
            f = self.follower = Follower(self.gw.ctx, self._replay, self.node, leader, holder.create_revision,
                                         self.gw.config.ha_suspect_s)  # fmt: skip
        if f.tick(now):
            log.warning("ha: leader %s (epoch %d) silent for %.2f s; campaigning", f.leader.node, f.epoch, f.suspect_s)
            self._unfollow()  # acknowledge nothing more to it, then depose it
            self.elector.suspect(holder.create_revision)
            return
        for stream, seq in f.committed.items():
            self.gw.marks[stream].advance(seq)
        if not f.clients:
            if f.answering(now) and now >= self._retry_at:
                self._start_tails(f)
            return
        try:
            for stream in f.clients:
                self.copy(stream)
        except (ReplayError, JournalError, OSError) as exc:  # the leader's sidecar went away, or our disk is full
            log.info("ha: replication from %s stopped (%s); starting again", f.leader.node, exc)
            self._drop_tails(f)
            self._retry_at = now + RETRY_FOLLOW_S

    def copy(self, stream: str) -> None:
        """Journal what the leader sent for `stream`, verbatim, and acknowledge it once durable as configured."""
        f, lane = self.follower, self.gw.lanes[stream]
        assert f is not None
        last = 0
        for batch in f.batches(stream):
            if batch.last_seq <= lane.writer.last_seq:
                continue
            lane.writer.append_replica(batch)
            lane.producers.journaled(batch)
            last = batch.last_seq
        if last:
            if self.gw.config.durability.mode != "never":
                lane.writer.sync()  # one fdatasync for all this drain journaled: the ack promises it is on disk
            f.journaled(stream, last)

    def _start_tails(self, f: Follower) -> None:
        """Cut our journal back to the leader's, then copy each stream after its head (waits, bounded)."""
        try:
            for stream in self.gw.lanes:
                self._reconcile(f, stream)
            for stream, lane in self.gw.lanes.items():
                self.gw.watch(f.tail(stream, lane.writer.last_seq).sock)
        except (ReplayError, JournalError) as exc:
            log.info("ha: cannot copy from %s yet (%s); trying again", f.leader.node, exc)
            self._drop_tails(f)
            self._retry_at = time.monotonic() + RETRY_FOLLOW_S
            return
        log.info("ha: %s follows %s (epoch %d)", self.node, f.leader.node, f.epoch)

    def _drop_tails(self, f: Follower) -> None:
        for client in f.clients.values():
            self.gw.unwatch(client.sock)
        f.drop_tails()

    def _reconcile(self, f: Follower, stream: str) -> None:
        """Cut our journal back to the last batch the leader holds too."""
        while (last := self._last_batch(stream)) is not None and not f.matches(stream, last):
            keep = last.first_seq - 1
            lane, mark = self.gw.lanes[stream], self.gw.marks[stream]
            if keep < mark.value:  # committed records are never cut: our journal is not what we thought
                log.error("ha: stream %s: cutting to %d, below the committed mark %d", stream, keep, mark.value)
                mark.lower(keep)
            lane.writer.close()
            cut_after(self.gw.config.journal, stream, keep)
            self.gw.reopen(stream)
            log.warning(
                "ha: stream %s: dropped %d..%d, which leader %s does not have",
                stream,
                keep + 1,
                last.last_seq,
                f.leader.node,
            )

    def _last_batch(self, stream: str) -> B.Batch | None:
        head = self.gw.lanes[stream].writer.last_seq
        if head == 0:
            return None
        with JournalReader(self.gw.config.journal, stream).cursor(head) as cursor:
            batch = cursor.next_batch()
        return None if batch is None else B.Batch.parse(bytes(batch))

    def _unfollow(self) -> None:
        f = self.follower
        if f is not None:
            self._drop_tails(f)
            f.close()
        self.follower = None

    def close(self) -> None:
        self._stop.set()
        self._reporter.join()
        self._unfollow()
        self.elector.close(resign=True)
