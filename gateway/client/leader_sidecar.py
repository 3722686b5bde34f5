"""`LeaderSidecar`: which sidecar of a replicated group serves a failover's gap, from the heartbeats (sans-IO).

Rules
=====

1. A replicated group's leader multicasts heartbeats naming its epoch and its own node's sidecar
   (gateway.wire.heartbeat); a follower is silent on the multicast. So the sidecar a heartbeat of the newest
   epoch names is the leader's, and nothing else in the subscriber knows which node leads.
2. A heartbeat of a newer epoch than any heard says the group has a new leader: its sidecar is where the
   replay link goes (`heard` returns it), whatever sidecar the link is at. A heartbeat of the same epoch
   or an older one (a deposed leader that was paused and resumes) changes nothing; nor does epoch 0 (a
   single gateway, whose one sidecar is the only one).
3. A request the newest epoch's leader's sidecar answered short (the reconciler's ``NoProgress(short=True)``)
   is asked there again, after the reconciler's backoff (`holds_more`): that sidecar serves what its node
   has committed, and a new leader commits what the group holds within moments of leading. Any other
   sidecar that answers short is deposed, paused or behind, and the link moves on; so does it after silence.
4. Sans-IO: no sockets, no clocks. The replay link (gateway.client.replay_link) feeds every heartbeat's
   epoch and sidecar and moves its connections when told to.

Theory of operation
===================

A group's sidecar serves only what its node holds as committed (docs/ha.md). After a failover the deposed
leader's sidecar, paused, cut off or behind, holds nothing past the fault, yet it is where the link stood
(nothing failed there while nothing was asked), so the fill of the failover's gap went there first and moved
on only at the reconciler's first-answer deadline (0.3 s) or a short answer, plus the link's backoff: the
last 0.3-0.5 s of every SIGSTOP or partition of the leader that kept a subscriber silent for more than 1 s.
The new leader multicasts heartbeats from the moment it leads, 0.2-0.3 s before its first commit (it waits
for its publisher to re-attach and a follower to acknowledge), so the link is at its sidecar before the gap
is seen; the leader's sidecar holds everything the group has committed, which is what fills that gap.
A leader re-elected in a newer epoch is named again, so the link goes back to it if a failed request had
moved the link elsewhere meanwhile.

Until the new leader's first commit of its epoch, its committed mark lags what it holds (it commits what
the deposed leader had multicast once an in-sync follower acknowledges), and its sidecar answers a fill of
that range short. Moving on then (rule 3 says not to) took the link to a follower's sidecar, which holds
no more, at a backoff and a new handshake each, and away from the one sidecar about to hold the range.
"""

from __future__ import annotations


class LeaderSidecar:
    """The newest epoch a heartbeat carried and the sidecar it named; see the module docstring. Not thread-safe."""

    def __init__(self) -> None:
        self.epoch = 0  # the newest epoch heard; 0: none (or a single gateway's)
        self.sidecar: str | None = None  # the sidecar of that epoch's leader

    def heard(self, epoch: int, sidecar: str) -> str | None:
        """A heartbeat of `epoch` naming `sidecar`: the sidecar to move to (rule 2), or None."""
        if epoch <= self.epoch or not sidecar:
            return None
        self.epoch, self.sidecar = epoch, sidecar
        return sidecar

    def holds_more(self, sidecar: str | None) -> bool:
        """Whether `sidecar`, having answered a request short, will hold more soon (rule 3): it is the newest
        epoch's leader's."""
        return sidecar is not None and sidecar == self.sidecar
