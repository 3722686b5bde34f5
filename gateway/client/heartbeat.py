"""`Heartbeat`: how long the Publisher's connection waits for an answer to a ZMTP ping (sans-IO).

libzmq sends a PING every `ivl_ms` and drops the connection when nothing at all has come back `timeout_ms` after
one (any frame counts: confirms too). Its IO thread answers PINGs without Python, so a gateway that is only busy
(a long fsync, a full loop) stays up, while one paused or cut off is left. With several endpoints that is how
fast a publisher moves on from a faulted leader: a replicated group has a new leader 0.31-0.37 s after the fault
(its followers' `--suspect-ms`, 300 ms), and a 500 ms timeout left the faulted leader 0.49-0.60 s after it, the
largest fixed cost of a pause or partition of the leader (docs/hardening.md). So the timeout is the group's own
suspicion, TIMEOUT_MS. With one endpoint there is nowhere to move: LONE_IVL_MS / LONE_TIMEOUT_MS.

Rules
=====

1. A false suspicion is the price of a short timeout: libzmq's IO thread runs its due timers before it reads its
   sockets, so a publisher process not scheduled for `timeout_ms` after a PING went out gives up a gateway whose
   answer waits in its socket (docs/benchmarks.md, fan-in: a reconnect storm of 1,000 publishers in four
   processes). One costs a reattach (the unconfirmed batches re-sent, the gateway drops those it has journaled).
2. It shows: the publisher attaches again, within FUTILE_S, at the endpoint it left (the other nodes name it as
   the leader). Each such futile departure doubles the timeout, up to LONE_TIMEOUT_MS, so a starved process
   reconnects a few times, not for as long as it is starved.
3. An attach at another endpoint than the last one (a failover, whether a departure or a server's refusal
   moved the publisher) sets the timeout back to TIMEOUT_MS.
4. A departure is a drop of an attached connection (`left`); a refusal or a deadline of the opening is none.
5. libzmq takes the timeout when the connection is made, so a connection gets the one its attach would set
   (rules 2, 3): the first run with the timeout set at the attach left a new leader after 0.69 s twice, on
   the doubled timeout of the false suspicion just before that failover.
"""

from __future__ import annotations

from dataclasses import dataclass

IVL_MS, TIMEOUT_MS = 100, 300  # several endpoints: a group's `--suspect-ms`
LONE_IVL_MS, LONE_TIMEOUT_MS = 1000, 5000  # one endpoint: nowhere to move, so a starved process keeps it
FUTILE_S = 1.0  # back at the endpoint it left within this: leaving was a false suspicion (or gained nothing)


@dataclass(frozen=True, slots=True)
class _Left:
    endpoint: str
    at: float


class Heartbeat:
    """The ZMTP heartbeat of the Publisher's next connection. Not thread-safe (the session's IO thread's)."""

    def __init__(self) -> None:
        self.widened = 0  # futile departures since the last failover (rule 2)
        self._left: _Left | None = None
        self._at: str | None = None  # where it last attached

    def ms(self, several: bool, endpoint: str, now: float) -> tuple[int, int]:
        """(ping interval, timeout) in ms for a connection to `endpoint` made `now`: what its attach would set
        (rule 5)."""
        if not several:
            return LONE_IVL_MS, LONE_TIMEOUT_MS
        return IVL_MS, min(LONE_TIMEOUT_MS, TIMEOUT_MS << min(self._if_attached(endpoint, now), 8))

    def left(self, endpoint: str, now: float) -> None:
        """An attached connection to `endpoint` dropped (the heartbeat timed out, or the gateway hung up)."""
        self._left = _Left(endpoint, now)

    def attached(self, endpoint: str, now: float) -> bool:
        """Attached at `endpoint`; True if that made the last departure futile (the timeout doubled)."""
        widened, self.widened, self._left = self.widened, self._if_attached(endpoint, now), None
        self._at = endpoint
        return self.widened > widened

    def _if_attached(self, endpoint: str, now: float) -> int:
        left = self._left
        if left is not None and endpoint == left.endpoint and now - left.at <= FUTILE_S:
            return self.widened + 1  # rule 2
        return self.widened if endpoint == self._at else 0  # rule 3
