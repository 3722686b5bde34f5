"""The IO shell of gateway.client.mirror_paths: one ReplayClient per path, all with one source sidecar.

`poll(now, reading)` takes what every open session has received (only while `reading`: the mirror stops
reading while the mirror site's window is full, and credit then stops the sidecar), reports it to the core
(Up, Arrived, Ended, Trimmed, Down, then a Tick), and carries out the core's actions: Open (a new ReplayClient,
which connects and sends ATTACH without waiting), Close, Fetch, Subscribe. `pop()` hands out the batches in
order. `ask_head()` asks the source's head on an open session (a FETCH beyond any sequence); its FETCH-END is
kept here (`source_head`), never shown to the core. With a datagram tail (gateway.client.datagram_tail), its
socket is read with the sessions and its batches reported (Datagram); AskTail sends TAIL-UDP on that path,
or, if the sidecar did not grant 'datagram-tail', says once that the TCP copies carry the tail alone.

Failures: a session that fails (ReplayError: no answer within the opening's deadline, a closed connection) is
Down and the core replaces it; ReplayRefused (final) is raised; once every path is down at once the last
failure is raised, ending the mirror's round as a single session's failure always did. Nothing waits: every
receive is recv(0).

Threading: the mirror's thread alone.
"""

from __future__ import annotations

import logging

import zmq

from gateway.client import mirror_paths as M
from gateway.client.datagram_tail import DatagramTail
from gateway.client.replay_client import Event, ReplayClient
from gateway.errors import ReplayError, ReplayRefused
from gateway.transport.curve import CurveClientKeys
from gateway.wire import batch as B
from gateway.wire import protocol as P

log = logging.getLogger(__name__)
TICK_S = 0.01  # a poll that only received batches Ticks the core at most this often (its work is per Tick)


class SourcePaths:
    """`paths` sessions with the sidecar at `endpoint`, resuming after `after` (the module docstring).

    `first`, if given, is the session of path 0 (already opened by the caller, who probed the source on it);
    `tallies`, if given, the paths' counts to go on with (the mirror's, across rounds: mirror_paths rule 10)."""

    def __init__(
        self,
        endpoint: str,
        stream: str,
        *,
        paths: int,
        after: int,
        features: tuple[str, ...],
        timeout_s: float,
        curve: CurveClientKeys | None,
        ctx: zmq.Context,
        first: ReplayClient | None = None,
        stall_s: float = M.STALL_S,
        tallies: list[M.PathTally] | None = None,
        tail: DatagramTail | None = None,
    ) -> None:
        self.endpoint, self.stream, self.features = endpoint, stream, features
        self.tail = tail
        self.timeout_s, self.curve, self.ctx = timeout_s, curve, ctx
        self.core = M.SourcePathsCore(paths, after, stall_s=stall_s, tallies=tallies, tail=tail is not None)
        self.clients: list[ReplayClient | None] = [None] * paths
        self._first = first
        self._up = [False] * paths
        self._probe: tuple[int, int] | None = None  # (path, request id) of the head's FETCH in flight
        self.source_head = 0
        self._failure: ReplayError | None = None
        self._ticked = 0.0
        self._tail_refused = False
        self._act()

    @property
    def socks(self) -> list[zmq.Socket | int]:
        """What to poll: the sessions' sockets, and the datagram tail's descriptor."""
        socks: list[zmq.Socket | int] = [client.sock for client in self.clients if client is not None]
        return [*socks, self.tail.fileno()] if self.tail is not None else socks

    @property
    def next(self) -> int:
        """The first sequence not handed out yet."""
        return self.core.next

    @property
    def gone(self) -> tuple[int, int, int] | None:
        """(lo, hi, first retained): records the source no longer holds (the mirror must stop naming them)."""
        return self.core.gone

    def pop(self) -> B.Batch | None:
        return self.core.pop()

    def ask_head(self) -> None:
        """FETCH beyond any sequence on an open session with no range FETCH waiting (the first open one else)."""
        if self._probe is not None:
            return
        open_ = [i for i, client in enumerate(self.clients) if client is not None and client.ready]
        idle = [i for i in open_ if not self.core.paths[i].fetches]
        for i in idle[:1] or open_[:1]:
            client = self.clients[i]
            assert client is not None
            self._probe = (i, client.fetch_head())

    def poll(self, now: float, reading: bool = True) -> None:
        """Take what has arrived (while `reading`), tell the core, carry out its actions (the module docstring).
        The core is Ticked after any report but a batch, else every TICK_S: a batch alone leaves it nothing to do
        at once, and the live tail brings thousands a second on each of two paths."""
        changed = False
        if self.tail is not None and reading:  # first: what came by both ways is then taken from the datagrams
            for piece in self.tail.receive():
                self.core.on(M.Datagram(piece), now)
        for i, client in enumerate(self.clients):
            if client is None or not reading:
                continue
            try:
                while (event := client.recv(0)) is not None:
                    changed = self._report(i, event, now) or changed
                if client.ready and not self._up[i]:
                    self._up[i], changed = True, True
                    self.core.on(M.Up(i), now)
            except ReplayRefused:
                raise
            except ReplayError as exc:
                self._down(i, exc, now)
                changed = True
        if changed or not reading or now - self._ticked >= TICK_S:
            self._ticked = now
            self.core.on(M.Tick(reading), now)
            self._act()
        if all(client is None for client in self.clients):
            assert self._failure is not None  # a path is closed only when it failed or stalled
            raise self._failure

    def close(self) -> None:
        for i in range(len(self.clients)):
            self._close(i)

    # --- plumbing ---------------------------------------------------------------------------------------

    def _report(self, i: int, event: Event, now: float) -> bool:
        """Tell the core; whether that is more than a batch."""
        match event:
            case B.Batch():
                self.core.on(M.Arrived(i, event), now)
                return False
            case P.FetchEnd(request_id=rid, last=last) if self._probe == (i, rid):
                self._probe = None
                self.source_head = max(self.source_head, last)
            case P.FetchEnd(last=last):
                self.core.on(M.Ended(i, last), now)
            case P.Trimmed(first_retained=first):
                self.core.on(M.Trimmed(i, first), now)
        return True

    def _down(self, i: int, exc: ReplayError, now: float) -> None:
        if len(self.clients) > 1:
            log.info("mirror of %s: path %d of %d to %s failed (%s); replacing it", self.stream, i + 1,
                     len(self.clients), self.endpoint, exc)  # fmt: skip
        self._failure = exc
        self._close(i)
        self.core.on(M.Down(i), now)

    def _close(self, i: int) -> None:
        client, self.clients[i], self._up[i] = self.clients[i], None, False
        self.core.tallies[i].up = False  # the core hears of a failed or stalled path, not of the round's end
        if self._probe is not None and self._probe[0] == i:
            self._probe = None
        if client is not None:
            client.close()

    def _act(self) -> None:
        actions, self.core.actions = self.core.actions, []
        for action in actions:
            match action:
                case M.Open(path=i):
                    self.clients[i] = self._open(i)
                case M.Close(path=i, why=why):
                    log.info("mirror of %s: path %d of %d to %s %s; replacing it", self.stream, i + 1,
                             len(self.clients), self.endpoint, why)  # fmt: skip
                    self._failure = ReplayError(f"the replay server at {self.endpoint} {why}")
                    self._close(i)
                case M.Fetch(path=i, first=first, last=last):
                    self._client(i).fetch(first, last)
                case M.Subscribe(path=i, after=after):
                    self._client(i).subscribe("", after)
                case M.AskTail(path=i):
                    self._ask_tail(self._client(i))

    def _ask_tail(self, client: ReplayClient) -> None:
        assert self.tail is not None  # the core asks only when given one
        if P.FEATURE_TAIL not in client.features:
            if not self._tail_refused:
                self._tail_refused = True
                log.warning("mirror of %s: the sidecar at %s did not grant 'datagram-tail' (CURVE, "
                            "--no-datagram-tail or an older version): the TCP copies carry the live tail alone",
                            self.stream, self.endpoint)  # fmt: skip
            return
        client.tail_udp(*self.tail.request())

    def _open(self, i: int) -> ReplayClient:
        if i == 0 and self._first is not None:
            client, self._first = self._first, None
            return client
        return ReplayClient(self.endpoint, self.stream, features=self.features, timeout=self.timeout_s,
                            curve=self.curve, ctx=self.ctx, fail_unreachable=True)  # fmt: skip

    def _client(self, i: int) -> ReplayClient:
        client = self.clients[i]
        assert client is not None  # the core gives work to paths that are up only
        return client
