"""The gateway: ingest -> sequence -> journal -> multicast, in one event loop.

Publishers reach the gateway in two ways: ZEPS over a ROUTER socket (ATTACH, PUBLISH, PUBLISH-BATCH, PING,
DETACH; publish confirms on request) and plain ZeroMQ PUB sockets (frames: key, body) through an XSUB socket,
to which the gateway sends the subscribe-all itself. Records are gathered per stream into batches bounded by
count and bytes; a batch leaves as soon as the ingest has nothing more queued (smart batching), and the linger
time only bounds it while publishes keep coming. Each batch is sequenced and written to the journal
*before* it is multicast (write-ahead), so every sequence a subscriber ever saw can be replayed after a crash.

Nothing is dropped silently. A malformed command is answered with INVALID and a reason; a plain PUB frame
that does not parse is counted. When multicast output falls behind (a transport at its rate, a slow link), or a
leader's in-sync followers do (it holds `max_out_queue` batches they have not copied), the gateway stops reading
publishers until it drains, and ZeroMQ's high-water marks push the slowdown back to them. A leader's followers
are heard on a link of their own (gateway.replication.peer_server), read on every pass whatever the publishers do;
and one drain of the ingest ends after DRAIN_S, so that no flood of publishes delays the loop's timers.

Threading: everything runs on the loop's thread but the group commit's fdatasync, which runs on the journal's
`Syncer` thread (gateway.journal.syncer): a sync the disk makes slow holds back the confirms waiting for it,
never the records behind it. The loop polls the syncer's pipe and confirms once a sync has finished.

The ingest's rules are a sans-IO core (gateway.sequencer.ingest): `_drain_router` decodes each command, hands it
to `Ingest.handle` and executes the actions that come back (`_execute`), never calling the core while it does.

Size: about 800 lines, kept whole on purpose. What is left is the loop and what it executes: the ingest's
actions, write-ahead with the disk-full gate, confirms, and the timers (multicast pumps, heartbeats, group
commits, announcements). Each is a few methods over the same lanes, outputs, metrics and replication strategy,
all on the loop's one thread; the rules went to their own modules (ingest, replication, output, lane), and a
further cut would only pass those same references to every part.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import random
import time
from collections.abc import Callable, Mapping

import zmq

from gateway.discovery.announcer import gateway_announcer, gateway_streams
from gateway.discovery.registrar import node_registrar
from gateway.errors import ConfigError
from gateway.journal import JournalReader, JournalWriter
from gateway.journal.committed import CommittedMark, remove_mark
from gateway.journal.promotion import Promotion, read_promotion, read_source, write_promotion, write_source
from gateway.journal.syncer import Syncer
from gateway.mcast import McastSender, open_pub
from gateway.replication.follower import ReplayFactory
from gateway.replication.group import GroupConfig, GroupNode, NodeHost
from gateway.replication.strategy import Replication, Solo
from gateway.sequencer import ingest as I
from gateway.sequencer import mirroring as MR
from gateway.sequencer.channels import plan
from gateway.sequencer.config import GatewayConfig
from gateway.sequencer.ingest_ready import ingest_ready
from gateway.sequencer.lane import Confirm, Journaled, Lane
from gateway.sequencer.metrics import GatewayMetrics
from gateway.sequencer.output import McastOutput, fan_out
from gateway.sequencer.producers import ProducerTable
from gateway.sequencer.recovery import after_cut, recover
from gateway.transport.curve import TcpGuard
from gateway.transport.descriptors import make_room
from gateway.transport.pollable import PolledByFd
from gateway.transport.routing import route, take
from gateway.transport.udp import UdpSender, batch_room
from gateway.wire import announce as A
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire.heartbeat import Heartbeat
from gateway.wire.reasons import retry_later
from gateway.wire.streamkey import AUTH, message

log = logging.getLogger(__name__)

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
REPLY_HWM = 20_000  # replies queued per client (~64 bytes each in libzmq) before one is dropped and counted
DRAIN_S = 0.005  # one drain of the ingest ends after this long: the loop's timers (pings, commits, syncs) run
DRAIN_CHECK = 32  # messages between two looks at the clock and the backlog during a drain
SPARE_FDS = 256  # descriptors besides the publishers' connections: journals, multicast, peers, ZeroMQ's own


class Gateway:
    """The broker of ZEPS (ZeroMQ Enterprise Publish-Subscribe), with real-time output over PGM, NORM or UDP."""

    def __init__(
        self, config: GatewayConfig, *, ctx: zmq.Context | None = None, replay: ReplayFactory | None = None
    ) -> None:
        """`replay`: the replay client a node of a group (config.etcd) copies its leader's journal with."""
        self.config = config
        self.ctx = ctx or zmq.Context.instance()
        self.id = random.getrandbits(32)
        self.metrics = GatewayMetrics(config.streams)
        self.marks = self._committed_marks()
        self.syncer = Syncer()  # group commits off the loop: a slow fdatasync holds back confirms, not records
        self.lanes = {name: Lane(name, self._open_writer(name), self._producer_table()) for name in config.streams}
        for lane in self.lanes.values():
            self.metrics.follow_head(lane.stream, lane.writer)
            self.metrics.follow_producers(lane.stream, lane)
            self._recover_producers(lane)
        self.ingest = I.Ingest(config, self, self.lanes)  # the ingest's rules (sans-IO): this loop executes them
        self.mirror_sources: dict[str, str] = {}  # stream -> the source sidecar it is (or was) a mirror of
        self._kept_sources: dict[str, str] = {}  # stream -> the source in its journal's `mirror-source` mark
        self.mirrors = {name: self._mirror_rules(name) for name in config.streams}  # docs/mirroring.md
        if (short := make_room(config.max_clients + SPARE_FDS)) is not None:  # a descriptor per publisher
            log.warning("--max-clients %d: %s; publishers past the limit will not connect", config.max_clients, short)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 1000)
        # Replies (PUBLISH-OK, INVALID) are never dropped in silence: sends fail instead (see _send_to), and a
        # publisher has REPLY_HWM replies of room before that happens, not libzmq's default 1,000.
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.SNDHWM, REPLY_HWM)
        self._warned_unread = False
        self.router.setsockopt(zmq.MAXMSGSIZE, config.max_frame_bytes)
        self.guard = TcpGuard(self.ctx, config.curve, self.metrics.rejected.labels("auth").inc)
        self.guard.secure(self.router, f"ingest {config.ingest}")
        self.router.bind(config.ingest)
        self.xsub: zmq.Socket | None = None
        if config.ingest_pub:
            self.xsub = self.ctx.socket(zmq.XSUB)
            self.xsub.setsockopt(zmq.MAXMSGSIZE, config.max_frame_bytes)
            self.guard.secure(self.xsub, f"ingest-pub {config.ingest_pub}")
            self.xsub.bind(config.ingest_pub)
            self.xsub.send(b"\x01")  # subscribe to everything: nothing flows to an XSUB otherwise
        self.outs: list[McastOutput] = []
        for channel in plan(config.multicast, config.streams):  # an output sends (and heartbeats) its streams only
            heads = {name: self.lanes[name].writer.last_seq for name in channel.streams}
            sock = open_pub(self.ctx, channel.endpoint, config.tuning)
            series = self.metrics.add_output(str(channel.endpoint), heads)
            self.outs.append(
                McastOutput(sock, channel.endpoint, heads, self._rooms(sock), series, config.max_out_queue)
            )
        # Per stream, the channels mapped to it: looked up once, not per batch.
        self.outs_of = {name: [out for out in self.outs if name in out.sent_head] for name in self.lanes}
        self.announcer = gateway_announcer(config.discovery, [o.endpoint for o in self.outs], ingest=config.ingest,
                                           sidecar=config.replay_endpoint, key=config.stream_key,
                                           errors=self.metrics.send_errors)  # fmt: skip
        interfaces = config.discovery.interfaces or tuple(o.endpoint.interface for o in self.outs)
        self.registrar = node_registrar(config.etcd, config.discovery, interfaces, A.GATEWAY, ingest=config.ingest,
                                        sidecar=config.replay_endpoint, key=config.stream_key,
                                        errors=self.metrics.send_errors)  # fmt: skip
        if config.metrics:
            self.metrics.serve(config.metrics)
        self._next_heartbeat = 0.0
        self._standing = (0, False)  # (epoch, leads) as last announced: a group's node's place in it
        self._stopping = False
        self._poller = zmq.Poller()
        self.replication: Replication = Solo()
        if config.node:
            if replay is None:
                raise ConfigError("a node of a group needs a replay client to follow its leader with")
            self.replication = GroupNode(self._group_config(), self._node_host(), replay).start()
        log.info(
            "gateway %08x: streams=%s ingest=%s multicast=%s journal=%s stream_key=%s curve=%s",
            self.id,
            ",".join(config.streams),
            config.ingest,
            ",".join(str(o.endpoint) for o in self.outs) or "none",
            config.journal,
            config.stream_key,
            config.curve,
        )

    def _group_config(self) -> GroupConfig:
        c = self.config
        return GroupConfig(c.node, c.streams, c.etcd, c.ingest, c.replay_endpoint, c.peer_endpoint, c.min_insync,
                           c.ha_lag_s, c.ha_suspect_s, c.max_frame_bytes, c.journal, c.peer_tls,
                           tuple(c.mirror))  # fmt: skip

    def _node_host(self) -> NodeHost:
        copied = {name: series.copied for name, series in self.metrics.streams.items()}
        return NodeHost(self.ctx, self.lanes, self.marks, self.metrics.rejected, copied, self.watch, self.unwatch,
                        self.reopen, self.step_down, self.group_promoted, self.group_sources,
                        self.metrics.send_errors)  # fmt: skip

    def _open_writer(self, stream: str) -> JournalWriter:
        c = self.config
        return JournalWriter.open(
            c.journal,
            stream,
            segment_bytes=c.segment_bytes,
            durability=c.durability,
            retention=c.retention,
            syncer=self.syncer,
        )

    def _committed_marks(self) -> dict[str, CommittedMark]:
        """A node of a group publishes each stream's committed mark to its sidecar (gateway.journal.committed),
        created before anything is journaled; a single gateway removes any left over, so that its sidecar
        serves to the journal's end."""
        marks = {}
        for name in self.config.streams:
            directory = self.config.journal / name
            if self.config.node:
                directory.mkdir(parents=True, exist_ok=True)
                marks[name] = CommittedMark(directory)
            else:
                remove_mark(directory)
        return marks

    def _producer_table(self) -> ProducerTable:
        return ProducerTable(int(self.config.producer_expiry_s * 1e9), self.config.max_producers)

    def reopen(self, stream: str) -> None:
        """Open a stream's journal again after it was cut (a follower dropping what its leader lacks), keeping its
        producer table but for what the cut dropped (gateway.sequencer.recovery.after_cut: milliseconds, not a
        rescan of the journal's tail)."""
        lane = self.lanes[stream]
        lane.writer = self._open_writer(stream)
        self.metrics.follow_head(stream, lane.writer)
        c, reader = self.config, JournalReader(self.config.journal, stream)
        lane.producers = after_cut(
            lane.producers, reader, lane.writer.last_seq, c.producer_expiry_s, c.producer_scan_bytes
        )
        for out in self.outs:
            if stream in out.sent_head:
                out.sent_head[stream] = min(out.sent_head[stream], lane.writer.last_seq)

    def watch(self, sock: zmq.Socket | PolledByFd, events: int = zmq.POLLIN) -> None:
        """Wake the loop on `events` of `sock` (readable: a follower's replication link, the elector's outcomes;
        also writable: a peer link with frames waiting for the kernel). Watching again changes the events."""
        self._poller.register(sock, events)

    def unwatch(self, sock: zmq.Socket | PolledByFd) -> None:
        self._poller.unregister(sock)

    def step_down(self, reason: str) -> None:
        """This node stopped leading: refuse what was not journaled, multicast nothing more that was, owe no
        confirms (publishers re-send to the new leader, which drops what it has by producer id), end sessions."""
        for lane in self.lanes.values():
            lane.forget()  # their sessions end below, with the reason
        self._execute(self.ingest.end_all(reason))

    def _recover_producers(self, lane: Lane) -> None:
        """Rebuild the producer table from the journal's tail (gateway.sequencer.producers.recover)."""
        if lane.writer.last_seq == 0:
            return
        c = self.config
        recover(lane.producers, JournalReader(c.journal, lane.stream), c.producer_expiry_s, c.producer_scan_bytes)

    def _rooms(self, sock: McastSender) -> dict[str, int]:
        """For a datagram output, per stream the largest batch that fits one datagram with the stream's name (and
        the authenticator, when signing); empty for the others (any size)."""
        if not isinstance(sock, UdpSender):
            return {}
        auth = AUTH.size if self.config.stream_key else 0
        return {name: batch_room(self.config.tuning.datagram_bytes, name.encode(), auth) for name in self.lanes}

    # --- the loop -------------------------------------------------------------------------------------

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Serve until `until()` is true or `stop()` is called; then flush, drain and close."""
        poller, synced = self._poller, self.syncer.fileno()
        poller.register(synced, zmq.POLLIN)  # a group commit finished: confirm what it covers
        watched: dict[zmq.Socket, int] = {}  # the ingest sockets' events as registered: changed only when they do
        try:
            while not (self._stopping or until()):
                wait = self._on_timers(time.monotonic())
                waiting = self._publishers_wait()
                self._watch_ingest(watched, self.router, 0 if waiting else zmq.POLLIN)
                if self.xsub is not None:  # plain PUB publishers cannot be refused: they wait for any backlog
                    self._watch_ingest(watched, self.xsub, 0 if waiting or self._uncommitted_full() else zmq.POLLIN)
                events = dict(poller.poll(math.ceil(wait * 1000)))
                if synced in events:
                    self.syncer.drain()
                dry = self.router in events and self._drain_router()
                if self.xsub is not None and self.xsub in events:
                    self._drain_xsub()
                # Smart batching: nothing more is queued, no linger wait (a drain that found the ROUTER empty
                # said so already: asked again, ZMQ_EVENTS would only say it twice).
                if not ingest_ready(None if dry else self.router, self.xsub):
                    for lane in self.lanes.values():
                        self._flush(lane)
        finally:
            self.close()

    def stop(self) -> None:
        self._stopping = True

    def _watch_ingest(self, watched: dict[zmq.Socket, int], sock: zmq.Socket, events: int) -> None:
        """Poll `sock` for `events` (0: not read while publishers wait), registering it only when they change: pyzmq's
        `register` is Python, and they change only when backpressure starts or ends."""
        if watched.get(sock) != events:
            self._poller.register(sock, events)
            watched[sock] = events

    def _on_timers(self, now: float) -> float:
        """Flush lingering batches, pump multicast, heartbeat, sync the journal; return the next deadline."""
        linger = self.config.linger_ms / 1000
        deadline = now + self.replication.poll_s
        self.replication.tick(now)
        self._release()
        for lane in self.lanes.values():
            if lane.pending:
                due = lane.pending_since + linger
                if due <= now:
                    self._flush(lane)
                else:
                    deadline = min(deadline, due)
        for out in self.outs:  # multicast first: a group commit's fdatasync must not delay what is journaled
            wait = out.pump()
            if wait is not None:
                deadline = min(deadline, now + wait)
        self.replication.after_release(now)
        deadline = min(deadline, self.replication.due)
        for lane in self.lanes.values():
            if lane.writer.maybe_sync():
                self.metrics.streams[lane.stream].fsync_seconds.observe(lane.writer.last_sync_latency_s)
            self._send_confirms(lane)
            sync_due = lane.writer.sync_deadline
            if sync_due is not None:
                deadline = min(deadline, sync_due)
        if now >= self._next_heartbeat:
            self._heartbeat(now)
            self._expire_producers()
        deadline = min(deadline, self._next_heartbeat)
        standing = self.replication.standing()
        moved = standing != self._standing  # a group's node took or lost the lead: clients learn it at once
        self._standing = standing
        epoch, leader = standing
        if self.announcer is not None:
            if now >= self.announcer.due or moved:
                self.announcer.announce(now, self._stream_ads(), epoch=epoch, leader=leader)
            deadline = min(deadline, self.announcer.due)
        if self.registrar is not None:
            if now >= self.registrar.due or moved:
                self.registrar.register(now, self._stream_ads(), epoch=epoch, leader=leader)
            deadline = min(deadline, self.registrar.due)
        return max(0.0, deadline - time.monotonic())

    def _stream_ads(self) -> list[A.StreamAd]:
        """The streams as announced: heads, channels, and what copy this gateway holds (docs/mirroring.md)."""
        heads = {name: lane.writer.last_seq for name, lane in self.lanes.items()}
        copies = {name: (rules.role.copy, self.mirror_sources.get(name, "")) for name, rules in self.mirrors.items()}
        return gateway_streams(heads, [(o.endpoint, o.sent_head) for o in self.outs], copies)

    def _publishers_wait(self) -> bool:
        """Backpressure: read no publisher while multicast or the in-sync followers are behind (their HWMs slow
        them down). A leader that cannot commit at all reads them on, to refuse them (`_refusing`)."""
        return self._outs_full() or (self.replication.quorate and self._uncommitted_full())

    def _outs_full(self) -> bool:
        return any(out.full for out in self.outs)

    def _uncommitted_full(self) -> bool:
        """A leader holds `max_out_queue` batches of a stream not multicast yet: its in-sync followers have not
        copied them, or multicast has not taken them."""
        return any(len(lane.uncommitted) >= self.config.max_out_queue for lane in self.lanes.values())

    def _refusing(self) -> bool:
        """A leader with its uncommitted batches full and too few in-sync followers to commit (below --min-insync):
        waiting would not end by itself, so it reads its publishers on, and refuses them naming why."""
        return not self.replication.quorate and self._uncommitted_full()

    def _release(self) -> None:
        """Multicast what is committed now (a node that leads: what its in-sync followers hold), as far as
        multicast takes it (the rest waits, so that one pass of the loop queues a bounded amount, and
        publishers wait once it is full)."""
        for lane in self.lanes.values():
            if not lane.uncommitted:  # a single gateway's always: it multicasts a batch once journaled
                continue
            committed = self.replication.committed(lane)
            while lane.uncommitted and lane.uncommitted[0].last <= committed and not self._outs_full():
                self._fan_out(lane, lane.uncommitted.popleft())

    def _expire_producers(self) -> None:
        now_ns = time.time_ns()
        for lane in self.lanes.values():
            lane.producers.expire(now_ns)

    def _heartbeat(self, now: float) -> None:
        self._next_heartbeat = now + self.config.heartbeat_ms / 1000
        ts = time.time_ns()
        if not self.replication.leading:
            return  # a follower is silent on the multicast
        for out in self.outs:
            for stream, head in out.sent_head.items():
                head = min(head, self.replication.committed(self.lanes[stream]))
                hb = Heartbeat(head, ts, self.config.replay_endpoint, self.id, self.replication.epoch).encode()
                out.beat(stream, message(self.config.stream_key, stream.encode(), hb))

    # --- ZEPS ingest ----------------------------------------------------------------------------------

    def _drain_router(self, limit: int = 4096) -> bool:
        """Take up to `limit` commands, for DRAIN_S at most, until the publishers are to wait (`run`); whether it
        ended because the ROUTER held nothing more."""
        now = time.monotonic()  # a session's last_seen: within DRAIN_S is close enough for --client-timeout
        until = now + DRAIN_S
        for n in range(1, limit + 1):
            if n % DRAIN_CHECK == 0 and ((now := time.monotonic()) > until or self._publishers_wait()):
                return False
            if n == 2 and not ingest_ready(self.router):  # at a low rate a drain holds one command: ZMQ_EVENTS
                return True  # says so for less than the zmq.Again that reading nothing raises (issue #32)
            frames = take(self.router)
            if frames is None:
                return True
            if len(frames) != 2:
                self._reject(frames[0], "expected one command per message", reply=len(frames) > 1)
                continue
            identity, frame = frames
            if not P.is_zeps(frame):
                self.metrics.rejected.labels("no-signature").inc()
                continue
            try:
                cmd = P.decode(frame)
            except P.ProtocolError as exc:
                self._reject(identity, exc.reason)
                continue
            self._execute(self.ingest.handle(identity, cmd, now))
        return False

    # --- the ingest's actions (gateway.sequencer.ingest decides, the loop executes) -------------------------

    def refusal(self) -> str | None:
        """The ingest's Gate: why this node takes no publishes (it does not lead), or None."""
        return self.replication.refusal()

    def uncommitted_refusal(self) -> str | None:
        """The ingest's Gate: a leader with its uncommitted batches full and too few in-sync followers to commit
        (below --min-insync) cannot wait for that to end by itself, so it reads its publishers on, to refuse them."""
        if not self._refusing():
            return None
        return retry_later(
            f"gateway node {self.config.node} has fewer in-sync followers than --min-insync "
            f"{self.config.min_insync} and holds {self.config.max_out_queue} batches they must copy"
        )

    def _execute(self, actions: list[I.Action]) -> None:
        """Do what the ingest's rules decided, in order; nothing here calls them again."""
        for action in actions:
            match action:
                case I.Sequence(identity, stream, batch, confirm):
                    self._sequence(identity, self.lanes[stream], batch, confirm)
                case I.Enqueue(identity, stream, key, body, confirm):
                    self._enqueue(identity, self.lanes[stream], key, body, confirm)
                case I.Reply(identity, command):
                    self._send_to(identity, P.encode(command), owed=action.owed)
                case I.Refuse(identity, reason, kind):
                    if kind is None:
                        self._send_to(identity, P.invalid(reason))
                    else:
                        self._reject(identity, reason, kind=kind)
                case I.Joined(stream):
                    self.metrics.streams[stream].publishers.inc()
                case I.Left(stream):
                    self.metrics.streams[stream].publishers.dec()
                case I.Mirror(identity, stream, command, confirm):
                    self._mirror_command(identity, stream, command, confirm)

    def _enqueue(self, identity: bytes | None, lane: Lane, key: bytes, body: bytes, confirm: bool) -> None:
        """One record (a PUBLISH, or a plain PUB frame: no identity) into the lane's pending batch."""
        if not lane.pending:
            lane.pending_since = time.monotonic()
        lane.pending.append((time.time_ns(), key, body))
        lane.pending_bytes += len(body) + len(key) + B.RECORD_OVERHEAD
        if identity is not None:
            lane.owe(identity, 1, confirm)
        if len(lane.pending) >= self.config.batch_records or lane.pending_bytes >= self.config.batch_bytes:
            self._flush(lane)

    def _sequence(self, identity: bytes, lane: Lane, batch: B.Batch, confirm: bool) -> None:
        """A checked PUBLISH-BATCH: its records a producer re-sent are confirmed, not journaled again (exactly
        once); the rest are sequenced whole, after the lane's pending records."""
        producer = batch.producer
        self._flush(lane)
        series = self.metrics.streams[lane.stream]
        series.published.add(batch.count)
        dups = 0 if producer is None else lane.producers.duplicates(producer[0], producer[1], batch.count)
        if dups:
            series.duplicates.inc(dups)
        if dups == batch.count:  # all journaled before: confirmed, at the producer's last stream sequence
            known = lane.producers.get(producer[0])  # type: ignore[index]
            assert known is not None
            if confirm:
                lane.confirms.append(Confirm(identity, known.last_seq - dups + 1, dups))
            return
        if dups:  # partial overlap: journal the records after the producer's last, confirm them all
            batch = B.Batch.parse(batch.part(dups, batch.count - 1), check_crc=False)
        lane.owe(identity, batch.count, confirm)
        journaled = self._journal(lane, batch, dups)
        if journaled is not None and producer is not None:  # its records up to the batch's last are journaled now
            lane.producers.note(producer[0], producer[1] + dups + batch.count - 1, journaled.last, journaled.ts_ns)

    def _flush(self, lane: Lane) -> None:
        if not lane.pending:
            return
        raw = B.encode(0, lane.pending)
        self.metrics.streams[lane.stream].published.add(len(lane.pending))
        lane.pending = []
        lane.pending_bytes = 0
        self._journal(lane, B.Batch.parse(raw, check_crc=False))

    def _journal(self, lane: Lane, batch: B.Batch, dups: int = 0, *, verbatim: bool = False) -> Journaled | None:
        """Write-ahead: the journal first, then the multicast queues. The batch as journaled, or None if refused.

        `dups`: records re-sent before `batch` (a producer's, journaled already) to confirm along with it.
        `verbatim`: a mirror's batch, journaled with the source's sequences and times (`_append`)."""
        if not self._writable(lane, batch.count):
            return None
        sealed = self._append(lane, batch, verbatim)
        if sealed is None:
            return None
        writer = lane.writer
        journaled = Journaled(batch, sealed, writer.last_seq, writer.last_ts_ns)
        self._owe_confirms(lane, batch.count, dups, journaled.last)
        series = self.metrics.streams[lane.stream]
        series.journaled.add(batch.count)
        series.journaled_bytes.add(len(sealed))
        series.batch_records.observe(batch.count)
        self.replication.journaled(lane.stream, sealed)
        if lane.uncommitted or self.replication.committed(lane) < journaled.last:
            lane.uncommitted.append(journaled)  # a node's waits for its followers (`_release`)
        else:
            self._fan_out(lane, journaled)  # committed once journaled (a single gateway's): out at once
        return journaled

    def _writable(self, lane: Lane, count: int) -> bool:
        """The disk-full gate: while the journal's disk is full, refuse without trying until `retry_at`."""
        if lane.full_since is not None and time.monotonic() < lane.retry_at:
            self._refuse_unjournaled(lane, count, lane.full_reason, "journal-full")
            return False
        return True

    def _append(self, lane: Lane, batch: B.Batch, verbatim: bool = False) -> bytes | None:
        """Sequence and journal the batch (`verbatim`: as it is); the sealed bytes, or None (its publishers were
        refused)."""
        try:
            sealed = lane.writer.append_replica(batch) if verbatim else lane.writer.append(batch)
        except OSError as exc:
            if exc.errno in DISK_FULL:
                self._refuse_unjournaled(lane, batch.count, self._disk_full(lane, exc), "journal-full")
            else:
                reason = f"journal write failed ({os.strerror(exc.errno) if exc.errno else exc}): records refused"
                log.error("stream %s: %s (%d)", lane.stream, reason, batch.count)
                self._refuse_unjournaled(lane, batch.count, reason, "journal")
            return None
        if lane.full_since is not None:
            log.warning(
                "stream %s: the journal takes writes again after %.1f s; accepting publishes",
                lane.stream,
                time.monotonic() - lane.full_since,
            )
            lane.full_since = None
            self.metrics.streams[lane.stream].journal_full.set(0)
        return sealed

    def _owe_confirms(self, lane: Lane, count: int, dups: int, last: int) -> None:
        """The journaled batch (its `last` sequence) is owed to its publishers as PUBLISH-OK once it is synced; a
        producer batch (alone in `unsequenced`) is confirmed with its `dups` re-sent records, ending at `last`."""
        first = last - count + 1
        for owed in lane.unsequenced:
            if owed.confirm:
                lane.confirms.append(Confirm(owed.identity, first - dups, owed.records + dups))
            first += owed.records
        lane.unsequenced.clear()

    def _fan_out(self, lane: Lane, journaled: Journaled) -> None:
        """Queue a committed batch on every multicast output that carries its stream."""
        fan_out(self.outs_of[lane.stream], self.config.stream_key, lane.stream, journaled)

    def _disk_full(self, lane: Lane, exc: OSError) -> str:
        """Enter (or stay in) the disk-full state: no write is tried for `journal_retry_ms`; the reason to give.

        The writer has cut the failed batch back, so the journal holds whole batches only and nothing accepted
        is lost; multicast, heartbeats and replay carry on. The first write tried after the pause ends the state.
        """
        now = time.monotonic()
        retry_s = self.config.journal_retry_ms / 1000
        cause = os.strerror(exc.errno) if exc.errno else str(exc)
        lane.retry_at = now + retry_s
        if lane.full_since is None:
            lane.full_since = now
            lane.full_reason = (
                f"journal of stream {lane.stream!r} is full ({cause}): records refused until "
                f"space is freed there; the gateway tries again every {retry_s:g} s"
            )
            log.error(
                "stream %s: journal disk full (%s) in %s: refusing publishes, trying again every %g s. Fix: free "
                "space on that filesystem (or give the journal a bigger one, or limit it with --retention-bytes)",
                lane.stream,
                cause,
                lane.writer.directory,
                retry_s,
            )
            self.metrics.streams[lane.stream].journal_full.set(1)
        return lane.full_reason

    def _refuse_unjournaled(self, lane: Lane, count: int, reason: str, kind: str) -> None:
        """The journal did not take a batch: every ZEPS publisher of its records is told (plain PUB ones cannot be)."""
        self.metrics.streams[lane.stream].refused[kind].inc(count)
        for identity in dict.fromkeys(owed.identity for owed in lane.unsequenced):
            self._send_to(identity, P.invalid(reason))
        lane.unsequenced.clear()

    def _send_confirms(self, lane: Lane) -> None:
        """PUBLISH-OK once records are as durable as the journal's policy makes them ('never': written), here and
        (a group's leader) on every in-sync follower."""
        durable = self.replication.durable(lane)
        while lane.confirms and lane.confirms[0].last <= durable:
            identity, first, n = lane.confirms.popleft()
            self.reply(identity, P.PublishOk(first, n))

    # --- mirror streams (docs/mirroring.md; the rules are gateway.sequencer.mirroring's) -----------------

    def _mirror_rules(self, stream: str) -> MR.MirrorRules:
        """A stream's rules as it starts, naming the source its marks keep (a promoted one's, its mirror
        sessions' before): announced from the start, not only once a mirror attaches again."""
        if stream not in self.config.mirror:
            return MR.MirrorRules(stream, MR.Role.PRIMARY)
        self._kept_sources[stream] = read_source(self.config.journal / stream)
        self._source_of(stream, self._kept_sources[stream])
        mark = read_promotion(self.config.journal / stream)
        if mark is None:
            return MR.MirrorRules(stream, MR.Role.MIRROR)
        self._source_of(stream, mark.source)
        return MR.MirrorRules(stream, MR.Role.PROMOTED, mark.head)

    def _source_of(self, stream: str, source: str) -> None:
        """`stream` is (or was) a mirror of `source`, as announced (a source not known is not forgotten), and
        as its `mirror-source` mark keeps it (written when it changes: rarely, so on the loop, as a promotion's)."""
        if not (known := A.announceable(source)):
            return
        self.mirror_sources[stream] = known
        if self._kept_sources.get(stream) != known:
            self._kept_sources[stream] = known  # one attempt per change: a broken disk logs once
            try:
                write_source(self.lanes[stream].writer.directory, known)
            except OSError as exc:
                log.error("stream %s: the mirror's source could not be kept beside its journal (%s); a restart "
                          "announces it again once a mirror attaches", stream, exc)  # fmt: skip

    def mirror_refusal(self, stream: str) -> str | None:
        """The ingest's Gate: why an ordinary publisher may not write `stream` (a mirror's), or None."""
        rules = self.mirrors[stream]
        if rules.role is MR.Role.PRIMARY:  # the hot path: the table accepts them there
            return None
        verdict = rules.on(MR.PublisherBatch())
        return verdict.reason if isinstance(verdict, MR.Refuse) else None

    def _mirror_command(self, identity: bytes, stream: str, cmd: P.Command, confirm: bool) -> None:
        """MIRROR, PROMOTE or a mirror's PUBLISH-BATCH, as the stream's rules say."""
        lane, rules = self.lanes[stream], self.mirrors[stream]
        head = lane.writer.last_seq
        batch = None
        if isinstance(cmd, P.PublishBatch):
            try:
                batch = B.Batch.parse(bytes(cmd.batch))
            except B.BatchError as exc:
                self._reject(identity, f"bad mirror PUBLISH-BATCH: {exc.reason}")
                return
            if not batch.dense or batch.count == 0:
                self._reject(
                    identity, "a mirror PUBLISH-BATCH must be a dense, non-empty batch of the source's journal"
                )
                return
            verdict = rules.on(MR.MirrorBatch(batch.first_seq, head))
        else:
            verdict = rules.on(MR.Hello(head) if isinstance(cmd, P.Mirror) else MR.Promote(head))
        if isinstance(verdict, MR.Persist):  # the group's first (a node's), then our journal's; answered then
            at = Promotion(verdict.head, self.mirror_sources.get(stream, ""))
            self.replication.promote(stream, at, lambda failure: self._promoted(identity, stream, at, failure))
            return
        if isinstance(cmd, P.Mirror) and isinstance(verdict, MR.Resume):
            self._source_of(stream, cmd.source)  # announced as this copy's source, by every node of a group
            self.replication.mirror_source(stream, self.mirror_sources.get(stream, ""))
        self._carry_out(identity, stream, verdict, batch, confirm)

    def _carry_out(
        self, identity: bytes, stream: str, verdict: MR.Verdict, batch: B.Batch | None = None, confirm: bool = False
    ) -> None:
        """Answer (or journal) as the stream's mirror rules decided."""
        lane = self.lanes[stream]
        match verdict:
            case MR.Refuse(reason=reason):
                self._reject(identity, reason, kind="mirror")
            case MR.Resume(head=at):
                self.reply(identity, P.MirrorOk(at, lane.writer.last_ts_ns))
            case MR.PromotedAt(head=at):
                self.reply(identity, P.PromoteOk(at))
            case MR.Accept() if batch is not None:
                self._flush(lane)
                lane.owe(identity, batch.count, confirm)
                self.metrics.streams[stream].published.add(batch.count)
                if self._journal(lane, batch, verbatim=True) is not None:
                    lane.producers.journaled(batch)  # a promoted site dedups the source's producers too

    def _promoted(self, identity: bytes, stream: str, promotion: Promotion, failure: str | None) -> None:
        """The promotion asked for is the group's (or a single gateway's) unless `failure`: mark it in the
        stream's journal directory and answer. A single gateway's mark is its only record, so one not written
        is no promotion; a node's is a copy of the group's (which a new leader reads from etcd)."""
        head = promotion.head
        if failure is None:
            try:
                write_promotion(self.lanes[stream].writer.directory, promotion)
            except OSError as exc:
                if not self.config.node:
                    failure = str(exc)
                log.error("stream %s: the promotion mark could not be written (%s)", stream, exc)
        rules = self.mirrors[stream]
        if failure is not None:
            self._carry_out(identity, stream, rules.on(MR.NotPromoted(failure)))
            return
        log.warning("stream %s: promoted at sequence %d; mirror batches refused from now on", stream, head)
        self._carry_out(identity, stream, rules.on(MR.Promoted(head)))

    def group_promoted(self, promotions: Mapping[str, Promotion]) -> None:
        """The group's promotions, as a node learns them (starting to lead: before any mirror batch can reach it
        as leader; following: every second), become this node's too, in its journal directory."""
        for stream, promotion in promotions.items():
            rules = self.mirrors.get(stream)
            if rules is not None and rules.role is MR.Role.PROMOTED and stream not in self.mirror_sources:
                self._source_of(stream, promotion.source)  # its own mark named none (an earlier version's)
            if rules is None or rules.role not in (MR.Role.MIRROR, MR.Role.PROMOTING):
                continue
            with contextlib.suppress(OSError):  # etcd holds it: a mark not written here is read again next time
                if read_promotion(self.lanes[stream].writer.directory) is None:
                    write_promotion(self.lanes[stream].writer.directory, promotion)
            self._source_of(stream, promotion.source)
            rules.on(MR.Promoted(promotion.head))
            log.warning("stream %s: the group was promoted at sequence %d; mirror batches refused", stream,
                        promotion.head)  # fmt: skip

    def group_sources(self, sources: Mapping[str, str]) -> None:
        """The sources of the group's mirror streams, as a follower learns them: announced as its leader does."""
        for stream, source in sources.items():
            rules = self.mirrors.get(stream)
            if rules is not None and rules.role in (MR.Role.MIRROR, MR.Role.PROMOTING):
                self._source_of(stream, source)

    # --- plain PUB ingest -----------------------------------------------------------------------------

    def _drain_xsub(self, limit: int = 4096) -> None:
        assert self.xsub is not None
        for _ in range(limit):
            try:
                frames = self.xsub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2 or len(frames[0]) > P.MAX_STRING:
                self.metrics.rejected.labels("pub-frame").inc()
                continue
            key, body = frames
            try:
                key.decode()
            except UnicodeDecodeError:
                self.metrics.rejected.labels("pub-frame").inc()
                continue
            if len(body) > self.config.max_message_bytes:
                self.metrics.rejected.labels("oversize").inc()
                continue
            if not self.replication.leading:
                self.metrics.rejected.labels("not-leader").inc()
                continue
            if self.mirror_refusal(next(iter(self.lanes))) is not None:
                self.metrics.rejected.labels("mirror").inc()
                continue
            self._enqueue(None, next(iter(self.lanes.values())), key, body, False)

    # --- replies --------------------------------------------------------------------------------------

    def reply(self, identity: bytes, cmd: P.Command) -> None:
        self._send_to(identity, P.encode(cmd))

    def _send_to(self, identity: bytes, frame: bytes, *, owed: bool = True) -> None:
        """A reply to one client. Never blocks the gateway; a reply that cannot go is counted, not lost in silence:
        the client is gone, or has left REPLY_HWM replies unread (a publisher that never reads its confirms). One
        not `owed` (`ingest.Reply.owed`: PING-OK, DETACH-OK) to a client that is gone is normal: not counted."""
        outcome = route(self.router, identity, frame)
        if outcome == "sent" or (outcome == "gone" and not owed):
            return
        self.metrics.replies_dropped.labels(outcome).inc()
        if outcome == "unread":
            level = logging.DEBUG if self._warned_unread else logging.WARNING  # said once, then counted
            self._warned_unread = True
            log.log(level, "a reply to client %s was dropped: it leaves %d replies unread", identity.hex(), REPLY_HWM)

    def _reject(self, identity: bytes | None, reason: str, *, reply: bool = True, kind: str = "invalid") -> None:
        self.metrics.rejected.labels(kind).inc()
        log.debug("INVALID to %s: %s", identity.hex() if identity else "-", reason)
        if identity is not None and reply:
            self._send_to(identity, P.invalid(reason))

    def close(self) -> None:
        """Journal what is pending, send what is queued (bounded by LINGER), close everything."""
        self.replication.close()  # a node resigns first, and steps down: it refuses, holds and confirms nothing
        for lane in self.lanes.values():
            self._flush(lane)
        deadline = time.monotonic() + 2.0
        while any(o.queue for o in self.outs) and time.monotonic() < deadline:
            time.sleep(max(o.pump() or 0.0 for o in self.outs))
        for lane in self.lanes.values():
            lane.writer.close()
            self._send_confirms(lane)
        self.syncer.close()
        for mark in self.marks.values():
            mark.close()
        self.guard.close()
        self.router.close()
        if self.xsub is not None:
            self.xsub.close()
        for out in self.outs:
            out.sock.close()
        if self.announcer is not None:
            self.announcer.close()
        if self.registrar is not None:
            self.registrar.close()
        self.metrics.close()
