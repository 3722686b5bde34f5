"""`ReplayLink`: a Subscriber's side of the replay sidecars: which one, the connections to it, and its answers.

The reconciler (gateway.reconcile) asks for ranges (`request`, `cancel`); the link carries each to a sidecar
and hands every answer back as a reconciler event, attributed to its request (`emit`). It owns:

- the sidecars (`Endpoints`): given, several serving one stream, learnt from heartbeats (`heard`) or named by a
  directory (followed: a sidecar that is no longer announced is left for the one that is); a heartbeat of a
  newer epoch moves the link to that leader's sidecar (`LeaderSidecar`: a failover's gap is filled where the
  group's commits are, not at the deposed leader's);
- two ZEPS connections so that every answer can be attributed to its request: the *catch-up* connection
  carries the one open-ended request (SUBSCRIBE: history, then the live tail; cancelling it is closing it) and
  the *fill* connection carries bounded gap fills (FETCH), which the sidecar answers in order, each closed by
  FETCH-END (`_fill_ids`, in that order). Small fills go by datagram first when the sidecar has a fill port
  (`DatagramFills`: a lost TCP segment costs >= 200 ms, a lost datagram one short timer);
- the start probe: a start that needs the sidecar's answer first (a time; the last N; "latest" without
  multicast) asks it on a connection of its own, then reports the first sequence (`on_start`);
- the head reports of a subscriber without multicast (`head_every`): no heartbeat tells it where the live tail
  is, so every `head_every` seconds it asks the sidecar (a FETCH beyond every sequence, on the fill connection:
  its FETCH-END names the journal's head) and hands the answer on as `HeadSeen(head, "replay")`, one at a time;
  the reconciler's replay-only mode is MERGED while N is past it (gateway.reconcile);
- failure handling: a connection lost, refused or silent past its handshake deadline is closed, the
  reconciler told (`ReplayLost`), and the next sidecar tried after a capped backoff (`ReplayRestored`); so is
  a sidecar that answers but could not serve a request (`no_progress`, with several); a
  refusal retrying cannot cure is final (`failed`). Where it stands is `state`, a `LinkState` whose every
  change is in gateway.client.link_state's table;
- saying so while it waits: a warning naming the sidecar once it has gone WAIT_NOTICE_S[0] without an
  answer, then again at doubling intervals with the time waited (a typo'd endpoint is not a quiet stream).

Threading: the Subscriber's application thread only (its poll turn). Nothing here waits on the network: each
handshake and request is a phase of a `ReplayClient` that `turn` advances with its own deadline. `emit` may
be called while an earlier event's actions are being carried out: the Subscriber queues such events (it
never re-enters the reconciler).
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any

from gateway import reconcile as R
from gateway.client.datagram_fills import DatagramFills
from gateway.client.directory import Directory
from gateway.client.endpoints import Endpoints
from gateway.client.leader_sidecar import LeaderSidecar
from gateway.client.link_state import ANSWERED, LEADER, LOST, REFUSED, RETRY, SHORT, LinkInput, LinkState, step
from gateway.client.replay_client import DEFAULT_FEATURES, ReplayClient, start_after
from gateway.client.replay_client import Event as Answer  # what a sidecar sends; R.Event is the reconciler's
from gateway.client.subscriber_stats import SubscriberStats
from gateway.errors import ReplayError, ReplayRefused, ZepsError
from gateway.transport.curve import CurveClientKeys
from gateway.transport.send_errors import SendErrors
from gateway.wire import batch as B
from gateway.wire.protocol import FEATURE_RANGE, FEATURE_SNAPSHOT, FetchEnd
from gateway.wire.protocol import Deliver as ZepsDeliver
from gateway.wire.protocol import SnapshotEnd as ZepsSnapshotEnd
from gateway.wire.protocol import Trimmed as ZepsTrimmed
from gateway.wire.streamkey import StreamKey

log = logging.getLogger("gateway.client.subscriber")

REPLAY_FRAMES_PER_TURN = 64  # replay frames taken in per connection per turn: bounds a turn, so deadlines hold
MAX_LEARNT_SIDECARS = 8  # sidecars learnt from heartbeats (a replicated gateway's nodes), at most
WAIT_NOTICE_S = (0.5, 30.0)  # "still waiting for the sidecar" warnings: the first after, then doubling up to
BACKOFF_S = (0.1, 5.0)  # between rounds of the sidecars: first, cap
HEAD_EVERY_S = 0.25  # replay only: how often the sidecar's head is asked, at most (its heartbeat)
HEAD_PROBE = 0  # in `_fill_ids`: a head report, not a reconciler request (their ids start at 1)


class ReplayLink:
    """The replay side of one Subscriber; see the module docstring. Not thread-safe."""

    def __init__(
        self,
        stream: str,
        replay: str | Sequence[str] | None,
        *,
        topics: tuple[str, ...],
        timeout: float,
        curve: CurveClientKeys | None,
        ctx: Any,
        directory: Directory | None,
        fill_udp: int | None,
        keys: Sequence[StreamKey],
        stats: SubscriberStats,
        emit: Callable[[R.Event], None],
        next_seq: Callable[[], int],
        on_start: Callable[[int], None],
        on_state: Callable[[str, ZepsError | None], None] | None = None,
        head_every: float | None = None,
    ) -> None:
        """`head_every`: seconds between head reports (None: off, the multicast heartbeats carry the head)."""
        self._stream = stream
        self._topics = topics
        self._pattern = topics[0] if len(topics) == 1 else ""  # one prefix is served by the sidecar's filter
        self._since_ns: int | None = None  # what the start probe asks for
        self._needs_start = False  # a start probe is to be made or under way
        self._sidecars = Endpoints(replay or (), first=BACKOFF_S[0], cap=BACKOFF_S[1])
        self._sidecars_given = bool(self._sidecars.all)
        self._leader = LeaderSidecar()
        self._timeout = timeout
        self._curve = curve
        self._ctx = ctx
        self._directory = directory
        self._fill_udp = fill_udp
        self.send_errors = SendErrors("subscriber", ["fill-request"])  # fill requests the network refuses
        self._keys = {key.id: key for key in keys}  # the fill port's answers are signed like multicast
        self._stats = stats
        self._emit = emit
        self._next_seq = next_seq
        self._on_start = on_start
        self._on_state = on_state
        self._catchup: ReplayClient | None = None
        self._catchup_id: int | None = None
        self._fill_conn: ReplayClient | None = None
        self._fill_ids: deque[int] = deque()  # fill request ids (or HEAD_PROBE) in the order the sidecar answers
        self._head_every = head_every
        self._head_at = 0.0  # when the head is next asked
        self._datagrams: DatagramFills | None = None  # for the current sidecar, made when first needed
        self._probe: tuple[ReplayClient, Generator[None, Answer, int]] | None = None
        self._reconnect_at = 0.0
        self._unready_since: float | None = None  # the first connection opened since one was last ready
        self._waiting_since: float | None = None  # asked for and not answered since (retries included)
        self._notice_at = 0.0  # the next "still waiting" warning
        self.state = LinkState.CONNECTING
        self.failed: ReplayRefused | None = None  # the final refusal, once FAILED

    # --- what the Subscriber reads ---------------------------------------------------------------------

    @property
    def endpoint(self) -> str | None:
        """The sidecar in use, or next to try (None until one is known)."""
        return self._sidecars.current

    @property
    def servers(self) -> int:
        """How many sidecars there are to try (the reconciler's ReplayServers: with more than one, a request
        that hears nothing within its first-answer deadline moves on, `no_progress`)."""
        return len(self._sidecars.all)

    @property
    def waiting(self) -> float | None:
        """Seconds the link has been waiting for a sidecar to answer (retries included); None while one
        answers, or while nothing is asked."""
        return None if self._waiting_since is None else time.monotonic() - self._waiting_since

    @property
    def datagrams(self) -> DatagramFills | None:
        return self._datagrams

    def pollables(self) -> tuple[Any, ...]:
        """What to poll: each connection's socket and monitor (a connection that ends says so there), and the
        datagram fill socket."""
        clients = self._clients()
        sockets = tuple(sock for c in clients for sock in (c.sock, c.handshake.monitor) if sock)
        return sockets if self._datagrams is None else (*sockets, self._datagrams)

    # --- what the reconciler asks ----------------------------------------------------------------------

    def request(self, req: R.Request) -> None:
        if self.state in (LinkState.RETRYING, LinkState.FAILED):
            return  # ReplayRestored re-issues it
        try:
            if req.hi is None:
                if self._catchup is not None:
                    self._catchup.close()
                self._catchup = self._connect()
                self._catchup_id = req.request_id
                if req.snapshot:
                    self._catchup.snapshot(self._topics)
                else:
                    self._catchup.subscribe(self._pattern, latest=req.lo - 1)
            else:
                fills = self._datagram_fills()
                if fills is None or not fills.ask(req.request_id, req.lo, req.hi, time.monotonic()):
                    self._fetch(req.request_id, req.lo, req.hi)
        except ReplayError as exc:
            self._lost(time.monotonic(), exc.reason)

    def cancel(self, request_id: int) -> None:
        if self._datagrams is not None:
            self._datagrams.hedge.cancel(request_id)
        if request_id == self._catchup_id and self._catchup is not None:
            self._catchup.close()  # ZEPS has no unsubscribe: the connection was the subscription
            self._catchup, self._catchup_id = None, None
        # A FETCH cannot be recalled; its answer is bounded and the reconciler ignores what it no longer needs.

    def no_progress(self, now: float, *, short: bool = False) -> None:
        """A request failed an attempt at the sidecar in use (the reconciler's NoProgress; `short`: it was
        answered with less than asked): with several, the next one. A group's sidecar serves only what its node
        holds as committed: one whose node was deposed, paused, cut off or is behind answers every request,
        with nothing newer, and would be asked again and again while the others hold the range. The newest
        leader's sidecar that answered short stays (`SHORT`: it has not committed that far yet;
        gateway.client.leader_sidecar, rule 3). A sidecar still handshaking (CONNECTING) is left too: its
        silence past the first-answer deadline is the same silence whether or not its handshake is over (a
        paused node's kernel takes the connection; a lost SYN waits a second), and the handshake's own deadline
        (`replay_timeout`, 5 s by default) held the fill that long."""
        if not self._sidecars.several or self.state not in (LinkState.READY, LinkState.CONNECTING):
            return
        if short and self.state is LinkState.READY and self._leader.holds_more(self.endpoint):
            log.info("%s: replay: %s (epoch %d's leader) answered a fill short; asking it again", self._stream,
                     self.endpoint, self._leader.epoch)  # fmt: skip
            self._move(SHORT, None)
            return
        self._lost(now, f"{self.endpoint} made no progress on a request (its node may be behind the group)")

    def probe(self, since_ns: int | None) -> None:
        """Ask the sidecar where to start: the first sequence journaled at or after `since_ns`, or (None) the
        journal's head + 1; reported to `on_start` (asked again on the next sidecar if this one fails)."""
        self._since_ns, self._needs_start = since_ns, True
        self._ask_start()

    def _ask_start(self) -> None:
        try:
            client = self._connect()
        except ReplayError:
            return  # no sidecar yet: a heartbeat will name one, and `turn` asks again
        steps = start_after(client, self._since_ns)
        next(steps)
        self._probe = (client, steps)

    def heard(self, sidecar: str, epoch: int) -> None:
        """A heartbeat of `epoch` named `sidecar` (its sender's): tried too, unless sidecars were given; one of a
        newer epoch than any heard names the new leader's sidecar, and the link moves there (`_to_leader`)."""
        known = self._sidecars.all
        if not self._sidecars_given and sidecar not in known and len(known) < MAX_LEARNT_SIDECARS:
            self._sidecars.add(sidecar)
            log.info("replay sidecar found from heartbeats: %s", sidecar)
        leader = self._leader.heard(epoch, sidecar)
        if leader is not None and leader != self.endpoint and leader in known and self.failed is None:
            self._to_leader(leader, time.monotonic())

    # --- the poll turn ---------------------------------------------------------------------------------

    def turn(self, ready: dict[Any, int], now: float) -> None:
        """Take in what the sockets in `ready` hold (and advance every handshake), then what is due: datagram
        timers, a reconnect, a start probe, a warning."""
        for client in self._clients():
            # A handshake is looked at every turn (its deadline), a ready connection when it or its monitor stirs.
            if not client.ready or client.sock in ready or client.handshake.monitor in ready:
                self._take(client, now)
        if self._datagrams is not None:
            self._take_datagrams(self._datagrams, self._datagrams.fileno() in ready, now)
        if self.state is LinkState.RETRYING and now >= self._reconnect_at:
            self._reconnect(now)
        if self._head_every is not None and now >= self._head_at and self.state is LinkState.READY:
            self._ask_head(now)
        if self._needs_start and self._probe is None and self.state is not LinkState.RETRYING and not self.failed:
            self._ask_start()  # the sidecar may have been learnt from a heartbeat since
        if self._waiting_since is not None and now >= self._notice_at and self.failed is None:
            self._notice_waiting(now - self._waiting_since, now)

    def follow_directory(self, now: float) -> None:
        """Leave a sidecar that no longer announces itself (killed, moved) for one that does: a connection to a
        dead one may never fail by itself."""
        assert self._directory is not None
        info = self._directory.lookup(self._stream)
        connected = self._catchup is not None or self._fill_conn is not None
        if connected and info is not None and info.sidecars and self.endpoint not in info.sidecars:
            self._lost(now, f"{self.endpoint} is no longer announced; {info.sidecar} is")

    def close(self) -> None:
        self._close_connections()
        if self._datagrams is not None:
            self._datagrams.close()

    # --- answers ---------------------------------------------------------------------------------------

    def _clients(self) -> tuple[ReplayClient, ...]:
        """The connections, the fill one before the catch-up: a head report taken in before the data of a turn
        (after the application was away) is not mistaken for silence."""
        probe = self._probe[0] if self._probe is not None else None
        return tuple(c for c in (probe, self._fill_conn, self._catchup) if c is not None)

    def _take(self, client: ReplayClient, now: float) -> None:
        try:
            # An action may close this connection meanwhile (Cancel of the catch-up): then stop reading it.
            for _ in range(REPLAY_FRAMES_PER_TURN):
                if client not in self._clients() or (event := client.recv(0)) is None:
                    break
                self._on_answer(client, event)
        except ReplayRefused as exc:
            if not self._sidecars.refused(exc.reason):
                self._lost(now, exc.reason, hint=exc.reason)
            elif self._sidecars.several:
                self._fail(type(exc)(f"every replay sidecar refused: {self._sidecars.refused_text()}"))
            else:
                self._fail(exc)
        except ReplayError as exc:
            self._lost(now, exc.reason)
        else:
            if client.ready and client in self._clients():
                self._unready_since = self._waiting_since = None
                if self.state is not LinkState.READY:
                    self._sidecars.succeeded()
                    self._move(ANSWERED, None)

    def _on_answer(self, client: ReplayClient, event: Answer) -> None:
        if self._probe is not None and client is self._probe[0]:
            self._probe_step(event)
            return
        if client is self._catchup:
            request_id = self._catchup_id
        else:
            request_id = self._fill_ids[0] if self._fill_ids else None
        if request_id is None:
            return  # an answer to something already given up
        if request_id == HEAD_PROBE:
            if isinstance(event, FetchEnd):  # FETCH-END of a FETCH beyond every sequence: its last is the head
                self._fill_ids.popleft()
                self._emit(R.HeadSeen(event.last, "replay"))
            return
        match event:
            case B.Batch():
                self._emit(R.Replay(event, request_id))
            case ZepsDeliver(sequence=seq, key=key, body=body):
                # A plain ZEPS server: one record, covering just its own sequence.
                single = B.Batch.parse(B.encode(seq, [(0, key.encode(), bytes(body))]))
                self._emit(R.Replay(single, request_id))
            case ZepsTrimmed(first_retained=first):
                self._emit(R.ReplayTrimmed(request_id, first))
            case FetchEnd():
                self._fill_ids.popleft()
                self._emit(R.ReplayEnd(request_id))
            case ZepsSnapshotEnd(last=last):
                self._emit(R.SnapshotDone(request_id, last))

    def _probe_step(self, event: Answer) -> None:
        assert self._probe is not None
        client, steps = self._probe
        try:
            steps.send(event)
        except StopIteration as stop:
            client.close()
            self._probe, self._needs_start = None, False
            self._on_start(stop.value)

    def _take_datagrams(self, fills: DatagramFills, readable: bool, now: float) -> None:
        """Datagram answers to the reconciler, as FETCH answers are; ranges out of tries to FETCH."""
        for rid, batch in fills.receive(now) if readable else ():  # the poller names a plain socket by its fd
            self._emit(R.Replay(batch, rid))
            if fills is not self._datagrams:
                return  # an action closed it (replay lost)
        for rid, lo, hi in fills.expire(now, self._next_seq()):
            self._fetch(rid, lo, hi)

    def _ask_head(self, now: float) -> None:
        """Ask the sidecar for its head, unless the last question is unanswered; on a fill connection that has
        'range' (the plain ZEPS one of a server without it has no head to give: no MERGED then)."""
        assert self._head_every is not None
        self._head_at = now + self._head_every
        if HEAD_PROBE in self._fill_ids:
            return
        if self._fill_conn is None:
            try:
                self._fill_conn = self._connect()  # asked at the next report, once its handshake is over
            except ReplayError as exc:
                self._lost(now, exc.reason)
        elif self._fill_conn.ready and FEATURE_RANGE in self._fill_conn.features:
            self._ask(HEAD_PROBE, lambda conn: conn.fetch_head(self._pattern))

    # --- connections -----------------------------------------------------------------------------------

    def _fetch(self, request_id: int, lo: int, hi: int) -> None:
        """FETCH lo..hi over TCP for the reconciler's request `request_id`."""
        self._ask(request_id, lambda conn: conn.fetch(lo, hi, self._pattern))

    def _ask(self, request_id: int, send: Callable[[ReplayClient], int]) -> None:
        """`send` a request on the fill connection (made if there is none); its answer is `request_id`'s."""
        try:
            if self._fill_conn is None:
                self._fill_conn = self._connect()
            send(self._fill_conn)
            self._fill_ids.append(request_id)
        except ReplayError as exc:
            self._lost(time.monotonic(), exc.reason)

    def _datagram_fills(self) -> DatagramFills | None:
        """The datagram path to the current sidecar's fill port; None when off or its address is no IPv4
        literal (a name would need a resolver call, which may block)."""
        if self._fill_udp == 0 or self.endpoint is None:
            return None
        host, _, port = self.endpoint.removeprefix("tcp://").rpartition(":")
        try:
            socket.inet_aton(host)
            address = (host, self._fill_udp or int(port))
        except (OSError, ValueError):
            return None
        old, moved = self._datagrams, []
        if old is not None and old.sidecar != address:  # the sidecar moved: ask the new one what is outstanding
            moved = [(rid, ask.lo, ask.hi) for rid, ask in old.hedge.asks.items()]
            old.close()
            self._datagrams = None
        if self._datagrams is None:
            self._datagrams = DatagramFills(address, self._stream, keys=self._keys, errors=self.send_errors)
            if self._fill_conn is None:  # the fallback's connection, ready before a range needs it: a TCP handshake
                self._fill_conn = self._connect()  # under loss can take a second (the SYN's retransmission timer)
            now = time.monotonic()
            for rid, lo, hi in moved:
                if not self._datagrams.ask(rid, lo, hi, now):
                    self._fetch(rid, lo, hi)
        return self._datagrams

    def _connect(self) -> ReplayClient:
        """A new replay connection, handshaking in the background of the poll loop (never waits)."""
        info = self._directory.lookup(self._stream) if self._directory is not None else None
        if info is not None and info.sidecar and self.endpoint not in info.sidecars + info.named:
            log.info("%s: replay sidecar at %s (announced)", self._stream, info.sidecar)
            self._sidecars.move_to(info.sidecar)
        for sidecar in info.sidecars if info is not None else ():  # a group's nodes' sidecars, tried in turn
            self._sidecars.add(sidecar)
        if self.endpoint is None:
            raise ReplayError("no replay endpoint yet: give replay=..., or wait for a heartbeat that names one")
        # The handshake deadline runs from the first connection opened since one was ready, so that the
        # reconciler re-issuing a request (a new connection) cannot keep a dead server looking "connecting".
        now = time.monotonic()
        if self._unready_since is None:
            self._unready_since = now
        if self._waiting_since is None:
            self._waiting_since, self._notice_at = now, now + WAIT_NOTICE_S[0]
        return ReplayClient(
            self.endpoint,
            self._stream,
            features=(*DEFAULT_FEATURES, FEATURE_SNAPSHOT),
            timeout=max(0.001, self._unready_since + self._timeout - now),
            curve=self._curve,
            ctx=self._ctx,
            fail_unreachable=self._sidecars.several,
            connect_timeout_ms=self._sidecars.connect_timeout_ms if self._sidecars.several else 0,
        )

    def _close_connections(self) -> None:
        for client in self._clients():
            client.close()
        self._catchup = self._fill_conn = self._probe = None
        self._catchup_id = None
        self._fill_ids.clear()
        if self._datagrams is not None:
            self._datagrams.hedge.clear()

    # --- failures --------------------------------------------------------------------------------------

    def _lost(self, now: float, reason: str, *, hint: str = "") -> None:
        """The sidecar in use failed (`hint`: its refusal, which may name another): the next one, after a backoff."""
        # The first failure of a run is a warning; the retries that follow it are debug lines.
        level = logging.WARNING if self._sidecars.backoff.failures == 0 else logging.DEBUG
        delay = self._sidecars.failed(hint)
        self._stats.replay_retries += 1
        log.log(level, "%s: replay: %s; retrying at %s in %.2f s", self._stream, reason, self.endpoint, delay)
        self._close_connections()
        self._unready_since = None
        was = self.state
        self._reconnect_at = now + delay
        self._move(LOST, ReplayError(reason))
        if was is not LinkState.RETRYING:
            self._emit(R.ReplayLost())

    def _to_leader(self, sidecar: str, now: float) -> None:
        """Move to the sidecar of a newer epoch's leader (link_state's LEADER): nothing failed, so no backoff."""
        log.info("%s: replay: epoch %d leads from %s's node; moving from %s", self._stream, self._leader.epoch,
                 sidecar, self.endpoint)  # fmt: skip
        self._sidecars.move_to(sidecar)
        was = self.state
        self._move(LEADER, None)
        if was is LinkState.RETRYING:
            self._reconnect_at = now  # the leader's sidecar at once
            return
        # Requests out at the old sidecar are asked again at the leader's; without any, its fill connection is
        # made now, so that its handshake is over when the gap comes.
        self._close_connections()
        self._unready_since = None
        self._emit(R.ReplayLost())
        self._emit(R.ReplayRestored())
        if self._fill_conn is None and self._catchup is None:
            try:
                self._fill_conn = self._connect()
            except ReplayError as exc:
                self._lost(now, exc.reason)

    def _reconnect(self, now: float) -> None:
        if self._needs_start:
            self._move(RETRY, None)
            self._ask_start()
            return
        try:
            self._fill_conn = self._connect()
        except ReplayError:  # no endpoint known yet
            self._reconnect_at = now + self._sidecars.backoff.next()
            return
        self._stats.replay_reconnects += 1
        self._move(RETRY, None)
        self._emit(R.ReplayRestored())

    def _fail(self, exc: ReplayRefused) -> None:
        """A final failure: no more tries; the Subscriber raises it once what came before is handed out."""
        log.error("%s: %s", self._stream, exc)
        self._close_connections()
        self.failed = exc
        self._move(REFUSED, exc)

    def _move(self, given: LinkInput, error: ZepsError | None) -> None:
        """Take the table's transition for `given`; report the state (again, when an error says why)."""
        old, self.state = self.state, step(self.state, given)
        if (self.state is not old or error is not None) and self._on_state is not None:
            self._on_state(self.state.value, error)

    def _notice_waiting(self, waited: float, now: float) -> None:
        """Say what is waited for and where, again and again (each interval double the last)."""
        log.warning(
            "%s: waiting for the replay sidecar at %s: no answer for %.1f s; still trying (is it running, and "
            "is the endpoint right?)",
            self._stream,
            self.endpoint,
            waited,
        )
        self._notice_at = now + min(max(waited, WAIT_NOTICE_S[0]), WAIT_NOTICE_S[1])
