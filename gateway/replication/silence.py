"""When a follower finds its leader silent, sans-IO: the clock of its pings on the peer link.

Rules
=====

1. The leader is silent once a ping of ours has been out for `suspect_s` with no answer, counted from when
   that ping *left* this process (handed to the kernel, or refused by the network), never from when it was
   queued. A ping queued behind a connect or a TLS handshake still under way, or a loop that did not run
   (this process paused, busy stepping down, blocked reconciling its journal), is this node's delay, not the
   leader's silence: a node that wakes from SIGSTOP and learns of a new leader first connects to it, and
   counts only once its ping is out (a leader that answers then is never deposed by it).
2. Any frame from the leader is an answer: the silence ends, and the next ping starts the clock again.
3. A link the network refused or broke counts as out: the network said no, which is the leader's side.
   A connect that never completes (a dead host) never starts the clock; the leader's lease ends that case
   (gateway.replication.elector: the key goes with the lease, and the follower campaigns).
4. No IO, no clock: the owner (gateway.replication.follower, on the gateway's loop) passes ``now``.

Theory of operation
===================

QUIET (nothing unanswered) --pinged()--> QUEUED --out(now)--> OUT(since now) --answered()--> QUIET
OUT --silent(now): now - since > suspect_s--> the leader is suspected
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Silence:
    """The clock of one follower's pings to one leader (rules above)."""

    suspect_s: float
    queued: bool = False  # a ping waits to leave since the last answer
    out_since: float | None = None  # when the first unanswered ping left

    def pinged(self) -> None:
        """A ping was handed to the link (sent, or queued behind a connect)."""
        self.queued = True

    def out(self, now: float) -> None:
        """The link holds nothing more (all it was given is in the kernel, or the link is gone)."""
        if self.queued and self.out_since is None:
            self.out_since = now
        self.queued = False

    def answered(self) -> None:
        """A frame came from the leader."""
        self.queued, self.out_since = False, None

    def silent(self, now: float) -> bool:
        return self.out_since is not None and now - self.out_since > self.suspect_s
