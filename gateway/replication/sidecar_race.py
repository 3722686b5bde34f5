"""A follower's connection to its leader's sidecar, whose opening is raced: a second connection after 0.2 s, not one
attempt waited out.

A follower's copier opens a replay client to the leader's sidecar for each stream it cuts (its questions) and
copies (its tail). At 1-5% loss a lost segment of a fresh connection (the ZMTP greeting, the ATTACH, its
READY) waits for TCP's retransmission timeout, 0.2 s at least and doubled for each further loss; past the
opening's deadline (the follower's `timeout_s`, 0.5 s) the copy failed, and began again 0.2 s later
(`RETRY_FOLLOW_S`) with a new cut. Seen in a chaos run: the new leader's in-sync follower joined 1.1 s late,
and with `--min-insync 1` nothing was committed meanwhile. So, as the peer link does with its connects
(gateway.transport.connect_retry, whose waits this uses):

1. While no connection has finished its opening, another one is opened each time the newest has gone
   unanswered for its wait (0.2 s, then 0.4 s, ...), with every request made so far (each client numbers its
   requests from 1, so a FETCH has the same id on each), until the first connection's deadline.
2. The first whose opening ends (READY, or an answer) wins; the others are closed. Each keeps its own
   deadline: the race fails when every connection has failed (with the last failure), and at once on a
   refusal (ReplayRefused: final on every connection).

Threading contract: the gateway's loop only; nothing waits (`recv(0)` polls each connection once). Each
connection's socket is in the loop's poller (`watch`) from its opening to its close (`unwatch` first), so an
answer on any of them wakes the loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import zmq

from gateway.errors import ReplayError, ReplayRefused
from gateway.transport.connect_retry import ConnectRetry
from gateway.transport.pollable import Unwatch, Watch
from gateway.wire import batch as B
from gateway.wire import protocol as P

log = logging.getLogger(__name__)

T = TypeVar("T")
Event = B.Batch | P.Deliver | P.FetchEnd | P.Trimmed | P.SnapshotEnd


class ReplaySource(Protocol):
    """What a follower needs of gateway.client.replay_client.ReplayClient."""

    sock: zmq.Socket

    @property
    def ready(self) -> bool: ...

    def subscribe(self, pattern: str = "", latest: int = 0) -> None: ...

    def fetch(self, first: int, last: int = ..., pattern: str = "") -> int: ...

    def recv(self, timeout: float | None = None) -> Event | None: ...

    def close(self) -> None: ...


class RacedReplay:
    """Replay clients made by `open_client`, raced until one finishes its opening (the rules above); then that one.
    `window_s`: how long after `now` a connection may still be opened (the first one's deadline)."""

    def __init__(
        self,
        open_client: Callable[[], ReplaySource],
        now: float,
        window_s: float,
        watch: Watch,
        unwatch: Unwatch,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open, self._watch, self._unwatch, self._clock = open_client, watch, unwatch, clock
        self._retry = ConnectRetry()  # its waits: 0.2 s, doubled for each connection unanswered
        self._last_start = now + window_s
        self._requests: list[Callable[[ReplaySource], object]] = []  # made so far, for each connection opened later
        self.racing: list[ReplaySource] = []  # the connections open; the winner alone once there is one
        self.won = False
        self._start(now)

    @property
    def ready(self) -> bool:
        """Whether a connection finished its opening (and is the one used from then on)."""
        return self.won

    def subscribe(self, pattern: str = "", latest: int = 0) -> None:
        self._request(lambda client: client.subscribe(pattern, latest))

    def fetch(self, first: int, last: int = B.MAX_SEQ, pattern: str = "") -> int:
        """The request id (the same on every connection)."""
        return self._request(lambda client: client.fetch(first, last, pattern))

    def recv(self, timeout: float | None = 0) -> Event | None:
        """What the connection that won sent (waiting `timeout` once one won); None meanwhile (never waits). Raises
        ReplayRefused at once, ReplayError once every connection failed."""
        if self.won:
            return self.racing[0].recv(timeout)
        failed: ReplayError | None = None
        for client in list(self.racing):
            try:
                event = client.recv(0)
            except ReplayRefused:
                raise
            except ReplayError as exc:
                self._drop(client)
                failed = exc
                continue
            if event is not None or client.ready:
                for other in [c for c in self.racing if c is not client]:
                    self._drop(other)
                self.won = True
                return event
        if not self.racing:
            assert failed is not None
            raise failed
        now = self._clock()
        if now < self._last_start and self._retry.expired(now):
            log.debug("ha: the leader's sidecar has not answered a connection yet; racing another")
            self._start(now)
        return None

    def close(self) -> None:
        for client in list(self.racing):
            self._drop(client)

    def _request(self, request: Callable[[ReplaySource], T]) -> T:
        self._requests.append(request)
        answers = [request(client) for client in self.racing]  # every connection asks it
        return answers[0]

    def _start(self, now: float) -> None:
        client = self._open()
        try:
            for request in self._requests:
                request(client)
        except BaseException:
            client.close()
            raise
        self._watch(client.sock, zmq.POLLIN)
        self.racing.append(client)
        self._retry.started(now)

    def _drop(self, client: ReplaySource) -> None:
        self.racing.remove(client)
        self._unwatch(client.sock)
        client.close()
