"""Leadership of a gateway group, sans-IO: who may sequence, multicast and confirm, and until when.

Rules
=====

1. Authority is a lease, measured on this process's monotonic clock from the moment the request that
   obtained or renewed it was *sent*. etcd starts the lease's TTL when it *receives* the request, so the
   coordinator's lease always ends after ours: a leader that stops acting at ``sent_at + ttl - margin``
   has stopped before anyone else can be elected. ``margin`` covers clock-rate differences and the time
   between asking `may_act` and acting.
2. A leader acts (multicasts, confirms) only while `may_act(now)` holds. A process paused past its lease
   (SIGSTOP, a long GC, a VM migration) wakes up without authority: it must renew before acting again,
   and renewing a lease that etcd already expired fails, so it becomes a follower.
3. The epoch is the coordinator's revision at which this leader's key was created. It only grows, it is
   carried by heartbeats and journaled, so followers and subscribers can ignore an older leader.
4. Nothing here does I/O or reads a clock: the caller passes ``now`` and the outcome of each request.

Theory of operation
===================

FOLLOWER --granted(sent_at, epoch, ttl)--> LEADER --(now >= authority_until)--> (still LEADER, may not act)
LEADER --renewed(sent_at, ttl)--> LEADER (authority extended)
LEADER --lost()--> FOLLOWER            (renewal refused, key gone, or shut down)

A renewal is due every ``ttl / RENEWALS_PER_TTL``, so one or two lost renewals leave authority intact.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

RENEWALS_PER_TTL = 4


class Role(enum.Enum):
    FOLLOWER = "follower"
    LEADER = "leader"


@dataclass
class Leadership:
    """This node's view of its own leadership; the elector feeds it, the gateway asks `may_act`."""

    margin_s: float
    role: Role = Role.FOLLOWER
    epoch: int = 0
    ttl_s: float = 0.0
    authority_until: float = float("-inf")
    renewed_at: float = float("-inf")

    def granted(self, sent_at: float, epoch: int, ttl_s: float) -> None:
        """The leader key was created under our lease by a request sent at `sent_at`."""
        if epoch <= self.epoch:
            raise ValueError(f"epoch {epoch} is not after {self.epoch}: epochs only grow")
        self.role, self.epoch, self.ttl_s = Role.LEADER, epoch, ttl_s
        self._extend(sent_at, ttl_s)

    def renewed(self, sent_at: float, ttl_s: float) -> None:
        """The coordinator kept our lease alive (for `ttl_s` from when it got the request)."""
        if self.role is Role.LEADER:
            self._extend(sent_at, ttl_s)

    def lost(self) -> None:
        """The lease is gone (refused renewal, deleted key) or we are stepping down."""
        self.role = Role.FOLLOWER
        self.authority_until = float("-inf")

    def may_act(self, now: float) -> bool:
        """Whether this node may multicast and confirm at `now`."""
        return self.role is Role.LEADER and now < self.authority_until

    def renewal_due(self, now: float) -> bool:
        return self.role is Role.LEADER and now >= self.renewed_at + self.ttl_s / RENEWALS_PER_TTL

    def _extend(self, sent_at: float, ttl_s: float) -> None:
        if ttl_s <= self.margin_s:
            raise ValueError(f"a lease of {ttl_s} s leaves no authority with a margin of {self.margin_s} s")
        self.renewed_at = sent_at
        self.authority_until = max(self.authority_until, sent_at + ttl_s - self.margin_s)
