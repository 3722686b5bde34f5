"""`zeps mirror`: one site's stream copied into another site's gateway, sequence for sequence (docs/mirroring.md).

The mirror reads stream S from the source site's replay sidecar(s) over TCP (catch-up, then the live tail: one
SUBSCRIBE) and writes the journal's batches, as they are, into the mirror site's gateway (a stream served with
--mirror), which journals them verbatim and multicasts them on its own LAN. Nothing is kept here: where to
resume is the mirror site's journal head, which the gateway tells every new session (MIRROR-OK), and the gateway
accepts only the batch that continues it. So a restart of anything (this process, either gateway, a sidecar)
resumes exactly, and a second mirror started by mistake has its batches refused instead of duplicated.

Rounds: a round opens a session with one target endpoint (gateway.client.mirror_target), learns the head H,
reads one source sidecar after H over `paths` sessions (gateway.client.source_paths: with one, a SUBSCRIBE; with
more, the catch-up striped by sequence range and the live tail on two sessions, put back in order by
gateway.client.mirror_paths), and forwards each batch once it starts at the next sequence; at most `window`
batches wait for their PUBLISH-OK. A failure worth retrying (no answer, a closed connection, a batch
refused) ends the round; the next one, after a backoff, takes the next source and target endpoint in turn
(several sidecars of the source, the nodes of a replicated mirror site). With several sidecars, the others'
heads are asked as well (gateway.client.source_heads): a sidecar that sends nothing for `timeout_s` while
another holds more (its journal stopped growing: a source group's former leader whose sidecar lives on) ends
the round, and the next one starts at the sidecar holding the most. A final failure ends the mirror with
MirrorError: records gone at the source (TRIMMED, or a first batch beyond H + 1: exactly which are named, nothing
is skipped in silence), a target that was promoted or is no mirror, a source that refuses the stream.

Lag: the source's head is asked (a FETCH beyond any sequence, answered with the head) every `probe_s`, and
between rounds in a session of its own (so the lag grows while the mirror site is down);
`status` holds the heads, the lag and each path's tally, read by the metrics (gateway.client.mirror_metrics) and a log
line every `log_s`.
Threading: one thread runs `run()`; the metrics' HTTP thread only reads `status` (ints and floats, each whole).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from gateway.client.datagram_tail import DatagramTail
from gateway.client.mirror_paths import PathTally
from gateway.client.mirror_target import MirrorTarget
from gateway.client.replay_client import ReplayClient, ask_head, probe
from gateway.client.source_heads import SourceHeads
from gateway.client.source_paths import SourcePaths
from gateway.errors import MirrorError, PublishError, ReplayError, ReplayRefused
from gateway.transport.curve import CurveClientKeys
from gateway.wire import batch as B
from gateway.wire import protocol as P
from gateway.wire import tail as T

log = logging.getLogger(__name__)

SOURCE_FEATURES = (P.FEATURE_BATCH, P.FEATURE_RANGE)
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 2.0


@dataclass(frozen=True)
class MirrorConfig:
    stream: str
    sources: tuple[str, ...]  # the source site's replay sidecars
    targets: tuple[str, ...]  # the mirror site's gateway ingest(s)
    source_curve: CurveClientKeys | None = None
    target_curve: CurveClientKeys | None = None
    window: int = 64  # batches sent and not confirmed yet, at most
    timeout_s: float = 5.0  # any answer (an opening, MIRROR-OK, the oldest confirm) waits at most this long
    probe_s: float = 1.0  # the source's head is asked this often
    log_s: float = 10.0  # a status line this often (INFO)
    paths: int = 1  # TCP sessions with the source sidecar (gateway.client.mirror_paths): more for a lossy WAN
    # The live tail as datagrams too, with this redundancy (gateway.wire.tail; `--datagram-tail`); None: TCP only
    datagram_tail: T.Redundancy | None = None
    tail_bind: tuple[str, int] = ("0.0.0.0", 0)  # where the tail's datagrams are received (port 0: any)


@dataclass
class MirrorStatus:
    """What the mirror knows, for metrics and logs; written by the mirror's thread only."""

    head: int = 0  # the mirror site's head, as confirmed
    source_head: int = 0
    lag_seconds: float = 0.0  # age of the oldest source record not confirmed at the mirror site (see lag())
    mirrored_records: int = 0
    mirrored_batches: int = 0
    resumes: int = 0  # rounds started after a failure
    tail_records: int = 0  # records forwarded from the datagram tail's copy (it came first)
    last_ts_ns: int = 0  # journal time of the last batch confirmed
    in_flight: deque[tuple[int, int]] = field(default_factory=deque)  # (last_seq, ts_ns) sent, not confirmed
    paths: list[PathTally] = field(default_factory=list)  # per path to the source, across rounds

    @property
    def lag_records(self) -> int:
        return max(0, self.source_head - self.head)

    def lag(self, now_ns: int) -> None:
        """Seconds behind: 0 when level; else the age of the oldest batch in flight or, while catching up with
        none in flight, of the last one confirmed (an upper bound). Journal times are the source's clock."""
        if self.lag_records == 0:
            self.lag_seconds = 0.0
        else:
            oldest = self.in_flight[0][1] if self.in_flight else self.last_ts_ns
            self.lag_seconds = max(0.0, (now_ns - oldest) / 1e9) if oldest else 0.0


class Mirror:
    """The mirror of one stream (the module docstring). `run()` until stopped, or MirrorError."""

    def __init__(self, config: MirrorConfig, *, ctx: zmq.Context | None = None) -> None:
        if not config.sources or not config.targets:
            raise ValueError("a mirror needs at least one source sidecar and one target gateway")
        if config.paths < 1:
            raise ValueError("a mirror needs at least one path to its source")
        self.config = config
        self.ctx = ctx or zmq.Context.instance()
        self.status = MirrorStatus(paths=[PathTally() for _ in range(config.paths)])
        self._stopping = False
        self._round = 0
        self._next_log = 0.0
        self._source = ""  # the sidecar of this round
        self._prefer = ""  # the sidecar the next round starts at, if one was found ahead of this round's
        self._behind: set[str] = set()  # sidecars found below the mirror site's head since one was not
        self._sent_at = 0.0  # when the oldest batch in flight was sent, or the last confirm came
        self._tail = DatagramTail(config.datagram_tail, bind=config.tail_bind) if config.datagram_tail else None
        self._tail_base = 0  # tail records of the rounds before this one
        self._features = SOURCE_FEATURES + ((P.FEATURE_TAIL,) if self._tail is not None else ())

    def stop(self) -> None:
        self._stopping = True

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Mirror until `until()` or stop(); MirrorError when it cannot go on without a gap or a fork."""
        try:
            self._run(until)
        finally:
            if self._tail is not None:
                self._tail.close()

    def _run(self, until: Callable[[], bool]) -> None:
        backoff = BACKOFF_MIN_S
        while not (self._stopping or until()):
            c = self.config
            source = self._prefer or c.sources[self._round % len(c.sources)]
            self._prefer = ""
            target = c.targets[self._round % len(c.targets)]
            self._round += 1
            progress = self.status.mirrored_records
            try:
                self._mirror(source, target, until)
                return
            except ReplayRefused as exc:
                raise MirrorError(f"the source refused the mirror: {exc}") from None
            except (ReplayError, PublishError) as exc:
                self.status.resumes += 1
                if self.status.mirrored_records > progress:  # that round did mirror: a new fault, a short wait
                    backoff = BACKOFF_MIN_S
                log.warning("mirror of %s: %s; resuming from the mirror site's head in %.1f s", c.stream, exc, backoff)
            self._sleep(backoff - self._watch_source(source, backoff), until)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _watch_source(self, source: str, within: float) -> float:
        """Between rounds, the head of the sidecar at `source`, asked in a session of its own within `within` s
        (best effort: down or silent says nothing): the lag keeps growing while the mirror site is down (a
        round's own probe runs only while it forwards). The seconds it took."""
        c, st = self.config, self.status
        t0 = time.monotonic()
        try:
            with ReplayClient(source, c.stream, features=SOURCE_FEATURES, timeout=within, curve=c.source_curve,
                              ctx=self.ctx, fail_unreachable=True) as client:  # fmt: skip
                st.source_head = max(st.source_head, ask_head(client))
        except ReplayError:
            pass
        self._report(time.monotonic())
        return time.monotonic() - t0

    def _sleep(self, seconds: float, until: Callable[[], bool]) -> None:
        end = time.monotonic() + seconds
        while not (self._stopping or until()) and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def _mirror(self, source: str, target_ep: str, until: Callable[[], bool]) -> None:
        """One round: returns when stopped; raises at the first failure."""
        c, st = self.config, self.status
        target = MirrorTarget(target_ep, c.stream, timeout_s=c.timeout_s, curve=c.target_curve, ctx=self.ctx)
        client: ReplayClient | None = None
        paths: SourcePaths | None = None
        self._source = source
        others = SourceHeads([s for s in c.sources if s != source], c.stream, features=SOURCE_FEATURES,
                             probe_s=c.probe_s, timeout_s=c.timeout_s, curve=c.source_curve, ctx=self.ctx)  # fmt: skip
        try:
            at = target.mirror(source)
            st.head = at.head
            st.in_flight.clear()
            client = ReplayClient(source, c.stream, features=self._features, timeout=c.timeout_s,
                                  curve=c.source_curve, ctx=self.ctx, fail_unreachable=True)  # fmt: skip
            if at.head:
                self._same_history(client, at)
            self._behind.clear()
            if self._tail is not None:
                self._tail.expect(source)
            paths = SourcePaths(source, c.stream, paths=c.paths, after=st.head, features=self._features,
                                timeout_s=c.timeout_s, curve=c.source_curve, ctx=self.ctx, first=client,
                                tallies=st.paths, tail=self._tail)  # fmt: skip
            client = None  # path 0's now
            log.info("mirror of %s: %s -> %s from sequence %d over %d path(s)", c.stream, source, target_ep,
                     st.head + 1, c.paths)  # fmt: skip
            self._forward(paths, target, others, until)
        finally:
            others.close()
            target.close()
            if paths is not None:
                self._tail_base += paths.core.tail_records
                paths.close()
            if client is not None:
                client.close()

    def _same_history(self, client: ReplayClient, at: P.MirrorOk) -> None:
        """MirrorError unless the source holds the mirror site's head, in a batch of the same journal time: a
        source whose journal was lost and started again (or another stream) would fork the mirror site's. A
        sidecar below the head is only behind while another source sidecar has not been found so too
        (ReplayError: the next round tries the next one)."""
        end, ts = probe(client, at.head)
        fork = f"mirror of stream {self.config.stream}: the source at {client.endpoint} and the mirror site are "
        fix = (
            "stopped rather than mix them. Fix: find which site holds the stream's true history; start the "
            "other one's journal afresh (or promote the mirror site: `zeps mirror promote`)"
        )
        if end.last < at.head:
            self._behind.add(client.endpoint)
            if not self._behind.issuperset(self.config.sources):  # a group's sidecar left behind: try the next
                raise ReplayError(f"the source sidecar at {client.endpoint} holds up to {end.last}, below the mirror "
                                  f"site's {at.head} (a source group's former leader?); trying the next")  # fmt: skip
            raise MirrorError(f"{fork}different histories: the source's head is {end.last}, below the mirror "
                              f"site's {at.head} (its journal was lost or cut); {fix}")  # fmt: skip
        if ts is not None and ts != at.head_ts_ns:
            raise MirrorError(f"{fork}different histories: sequence {at.head} has journal time {ts} at the source, "
                              f"{at.head_ts_ns} at the mirror site; {fix}")  # fmt: skip

    def _forward(
        self, paths: SourcePaths, target: MirrorTarget, others: SourceHeads, until: Callable[[], bool]
    ) -> None:
        c, st = self.config, self.status
        next_probe = 0.0
        heard = time.monotonic()  # when this round's sidecar last sent records (or the round began)
        poller, polled = zmq.Poller(), None  # polled: the sockets and `room` the poller was built for
        while not (self._stopping or until()):
            now = time.monotonic()
            if now >= next_probe:
                paths.ask_head()
                next_probe = now + c.probe_s
            room = len(st.in_flight) < c.window
            if polled != (socks := paths.socks, room):
                polled, poller = (socks, room), zmq.Poller()
                poller.register(target.sock, zmq.POLLIN)
                for sock in socks:
                    poller.register(sock, zmq.POLLIN if room else 0)
            poller.poll(50 if room else 10)
            while (last := target.confirmed(0)) is not None:
                self._confirmed(last)
            if st.in_flight and time.monotonic() - self._sent_at > c.timeout_s:
                raise PublishError(f"the gateway at {target.endpoint} confirmed nothing for {c.timeout_s:g} s")
            paths.poll(time.monotonic(), reading=room)
            if paths.gone is not None:
                raise self._gone(*paths.gone)
            while room and (batch := paths.pop()) is not None:
                self._send(target, batch)
                heard = time.monotonic()
                room = len(st.in_flight) < c.window
            st.tail_records = self._tail_base + paths.core.tail_records
            st.source_head = max(st.source_head, paths.source_head)
            others.poll(now)
            if room and now - heard > c.timeout_s and (ahead := others.ahead(paths.next - 1)) is not None:
                self._prefer = ahead[0]
                raise ReplayError(
                    f"the source sidecar at {paths.endpoint} sent nothing for {now - heard:.1f} s while the one at "
                    f"{ahead[0]} holds up to {ahead[1]} (this one's journal stopped at {paths.next - 1}: a source "
                    "group's former leader?); moving there"
                )
            self._report(time.monotonic())

    def _send(self, target: MirrorTarget, batch: B.Batch) -> None:
        """Forward `batch`, which continues the mirror site's head (SourcePaths hands out nothing else)."""
        st = self.status
        target.send(batch.buf)
        if not st.in_flight:
            self._sent_at = time.monotonic()
        st.in_flight.append((batch.last_seq, batch.ts_ns))
        st.source_head = max(st.source_head, batch.last_seq)

    def _confirmed(self, last: int) -> None:
        st = self.status
        while st.in_flight and st.in_flight[0][0] <= last:
            seq, ts = st.in_flight.popleft()
            st.mirrored_batches += 1
            st.mirrored_records += seq - st.head
            st.head, st.last_ts_ns = seq, ts
        self._sent_at = time.monotonic()

    def _gone(self, lo: int, hi: int, first: int) -> MirrorError:
        return MirrorError(
            f"mirror of stream {self.config.stream}: records {lo}..{hi} are gone from the source's journal at "
            f"{self._source} (its first retained is {first}); nothing was skipped: the mirror site's head stays "
            f"{lo - 1}. "
            "Fix: keep a longer retention at the source (--retention-bytes, --retention-s), or start the mirror "
            "site from a copy of the source's journal"
        )

    def _report(self, now: float) -> None:
        st = self.status
        st.lag(time.time_ns())
        if now < self._next_log:
            return
        self._next_log = now + self.config.log_s
        log.info(
            "mirror stream=%s head=%d source_head=%d lag_records=%d lag_seconds=%.3f mirrored_records=%d resumes=%d "
            "tail_records=%d",
            self.config.stream, st.head, st.source_head, st.lag_records, st.lag_seconds, st.mirrored_records,
            st.resumes, st.tail_records,
        )  # fmt: skip
