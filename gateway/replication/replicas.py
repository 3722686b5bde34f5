"""The leader's followers, sans-IO: their acknowledgements, the in-sync set, and what may be made visible.

Rules (Kafka's acks=all with min.insync.replicas, docs/ha.md)
=============================================================

1. A record is *committed* once every in-sync follower has acknowledged writing it to its journal and there
   are at least `min_insync` of them. Only committed records are multicast (and served by sidecars): a
   successor holds each of them. A committed record is *durable* once every in-sync follower has also
   acknowledged it as durable as its --fsync says (fsynced; or, with never, written); the leader confirms
   only durable records that its own journal holds as durably. Both points of a stream only grow. (Like
   Kafka, visibility waits for the followers' copies, not their disks: a record is seen once a second host
   holds it, and confirmed once it is on every in-sync disk.)
2. The in-sync set is kept in etcd, written only by the leader and fenced by its epoch, so that exactly its
   members (and the leader) may be elected: each holds every committed record.
3. A follower joins once it has every committed record (`joinable`): it is added here first, then in etcd
   (commits wait for it from that moment on, so it never misses one). Every committed record means those of
   earlier epochs too, not only this epoch's commit point, which starts at 0: else, until the first commit of
   an epoch, any follower that acknowledged anything joined, and could be elected next without records an
   earlier leader had confirmed (seen: a follower 2,950 records short joined a leader that then lost its
   lease, was elected, and the other member had to cut its journal below its committed mark). So a joiner
   must hold the leader's journal head as it was when the epoch began (`floor`): the leader was in sync, so
   it holds every record committed before, including those whose commit it never heard of (its committed
   mark can lag: the last REPLICA-COMMIT may not have arrived), and a mark would leave that gap open.
4. A follower that acknowledged nothing for `lag_s`, or stayed behind the head for `lag_s`, or whose peer
   link hung up (`hung_up`: its process exited, and the kernel closed its connection; waiting `lag_s` for
   it would only stall every commit), leaves: in etcd first (`laggards`), here only once that write
   succeeded (`remove`). A deposed leader's write fails, so
   it can never shrink its set to commit alone. A member that is only behind (it acknowledges) stays while
   the set would fall below `min_insync` without it: commits follow its acknowledgements, and without it
   nothing would commit at all until a follower joined again (the one joining after a failover is behind the
   head by what the stall let pile up, and used to be dropped again a `lag_s` later, over and over). Of
   several such members, the furthest behind leave first.
5. A member taken over from the previous epoch (`start`) must first learn of this leader, connect and maybe
   cut its journal: both of its clocks start at its first acknowledgement in this epoch, not at the epoch's
   start (else a failover under load drops the very follower the new leader needs, and commits wait until
   it joins again). One that has not acknowledged `SWITCH_S` after the epoch began leaves (a dead member
   holds every commit until it does).
6. Nothing here does I/O or reads a clock: the caller passes `now`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

SWITCH_S = 2.0  # a member taken over by a new leader acknowledges it within this, or leaves (rule 5)


@dataclass
class _Follower:
    acked: dict[str, int]  # per stream, the last sequence it journaled (wrote)
    heard_at: float  # its last acknowledgement
    durable: dict[str, int] = field(default_factory=dict)  # per stream, the last sequence it made durable
    behind_since: float | None = None  # since when it has been behind the head (None: caught up)
    hung_up: bool = False  # its peer link closed and it has not acknowledged anything since
    heard: bool = True  # it acknowledged in this epoch (False: a member taken over, `heard_at` the epoch's start)


@dataclass
class InSync:
    """One leader's followers for one epoch."""

    node: str
    epoch: int
    min_insync: int
    lag_s: float
    # per stream; starts at 0: what this node journaled as a follower is committed again in its epoch, once
    # its in-sync followers hold it (they may not, if the old leader died before they did)
    committed: dict[str, int]
    # per stream, this node's journal head when its epoch began: a joiner holds at least that (rule 3)
    floor: dict[str, int] = field(default_factory=dict)
    members: set[str] = field(default_factory=set)  # in-sync followers (not the leader)
    followers: dict[str, _Follower] = field(default_factory=dict)
    durable: dict[str, int] = field(init=False)  # per stream, as committed: what every member made durable

    def __post_init__(self) -> None:
        self.durable = dict.fromkeys(self.committed, 0)

    def start(self, members: set[str], now: float) -> None:
        """Take over the in-sync set of the previous epoch (minus this node and the old leader)."""
        self.members = set(members) - {self.node}
        for name in self.members:
            self.followers[name] = _Follower({}, now, heard=False)

    def ack(self, node: str, epoch: int, stream: str, seq: int, durable: int, now: float) -> None:
        """A follower's REPLICA-ACK (written through `seq`, durable through `durable`); acks for another epoch
        (a follower of someone else) are ignored."""
        if epoch != self.epoch or stream not in self.committed or node == self.node:
            return
        f = self.followers.setdefault(node, _Follower({}, now))
        f.acked[stream] = max(f.acked.get(stream, 0), seq)
        f.durable[stream] = max(f.durable.get(stream, 0), min(durable, seq))
        f.heard_at = now
        f.hung_up = False
        f.heard = True

    @property
    def quorate(self) -> bool:
        """Whether the set is large enough to commit (rule 1): else nothing commits until a follower joins."""
        return len(self.members) >= self.min_insync

    def advance(self, heads: dict[str, int], now: float) -> None:
        """Move each stream's commit point to what every in-sync follower holds (rule 1); track who is behind
        (from its first acknowledgement in this epoch: rule 5)."""
        for f in self.followers.values():
            behind = f.heard and any(f.acked.get(s, 0) < head for s, head in heads.items())
            if not behind:
                f.behind_since = None
            elif f.behind_since is None:
                f.behind_since = now
        if not self.quorate:
            return
        for stream, head in heads.items():
            held = min((self.followers[m].acked.get(stream, 0) for m in self.members), default=head)
            self.committed[stream] = max(self.committed[stream], min(head, held))
            kept = min((self.followers[m].durable.get(stream, 0) for m in self.members), default=head)
            self.durable[stream] = max(self.durable[stream], min(self.committed[stream], kept))

    def joinable(self) -> list[str]:
        """Followers outside the set that hold every committed record, of this epoch and before (rule 3)."""
        return [
            name
            for name, f in self.followers.items()
            if name not in self.members
            and all(f.acked.get(s, 0) >= max(c, self.floor.get(s, 0)) for s, c in self.committed.items())
        ]

    def hung_up(self, node: str) -> None:
        """`node`'s peer link closed (rule 4): it leaves at the next `laggards`, unless it acknowledges first."""
        if (f := self.followers.get(node)) is not None:
            f.hung_up = True

    def laggards(self, now: float) -> list[str]:
        """In-sync followers silent or behind for longer than `lag_s` (behind: only as many as leave `min_insync`),
        or hung up (rule 4); a member taken over that has not acknowledged this epoch for `SWITCH_S` (rule 5)."""
        out, behind = [], []
        for name in self.members:
            f = self.followers[name]
            silent = now - f.heard_at > (self.lag_s if f.heard else SWITCH_S)
            if f.hung_up or silent:
                out.append(name)
            elif f.behind_since is not None and now - f.behind_since > self.lag_s:
                behind.append(name)
        behind.sort(key=lambda name: sum(self.followers[name].acked.values()))  # the furthest behind first
        room = max(0, len(self.members) - len(out) - self.min_insync)  # who may leave without stalling commits
        return out + sorted(behind[:room])

    def add(self, node: str) -> None:
        self.members.add(node)

    def remove(self, node: str) -> None:
        self.members.discard(node)
        self.followers.pop(node, None)

    def record(self, members: set[str] | None = None) -> str:
        """The etcd value of the in-sync set (this one, or `members` about to be written)."""
        return insync_record(self.epoch, self.node, self.members if members is None else members)

    def acked(self) -> dict[str, dict[str, int]]:
        return {name: dict(f.acked) for name, f in self.followers.items()}


def insync_record(epoch: int, leader: str, members: set[str]) -> str:
    """The etcd value of an in-sync set: `leader`'s followers `members`, in `epoch`."""
    return json.dumps({"epoch": epoch, "leader": leader, "insync": sorted(members)})


def parse_record(text: str | None) -> tuple[str, set[str]]:
    """(leader, in-sync followers) of an etcd in-sync record; ("", empty) when there is none yet."""
    if not text:
        return "", set()
    data = json.loads(text)
    return str(data.get("leader", "")), set(data.get("insync", ()))


def eligible(node: str, text: str | None) -> bool:
    """Whether `node` may campaign: no set recorded yet (a new group), or it led or was in sync last."""
    if not text:
        return True
    leader, members = parse_record(text)
    return node == leader or node in members
