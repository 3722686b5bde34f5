"""A replicated group's mirror streams in etcd (docs/mirroring.md, "Promoting a group"): which ones it made
primary, and which source each one mirrors.

Under `<group>/promoted/<stream>` etcd holds the promotion (gateway.journal.promotion.Promotion: the sequence the
stream was promoted at, and the source it mirrored until then). The leader that takes PROMOTE writes it fenced
by its epoch (a deposed leader's write fails, so it never answers PROMOTE-OK for a promotion the group does not
hold); a node that starts to lead reads every promotion after its campaign won, so it knows each one a
predecessor answered for, before it takes any mirror batch. A follower of a group with mirror streams reads
them every `LEARN_EVERY_S`. Each node keeps the mark in its journal (gateway.journal.promotion) once it knows
it, and a new leader writes to etcd any mark of its own that etcd lacks: the fence survives a node restarted
without etcd's word and an etcd that lost its data.

Under `<group>/sources/<stream>` the leader keeps the source sidecar its mirror session named (MIRROR), written
fenced by its epoch when it changes; followers read it with the promotions, so every node announces the same
copy and source (the directory is right whichever node a client asks). It says where the copy comes from; it
fences nothing.

Threading contract: these are jobs for the elector's thread (gateway.replication.elector); each touches
nothing of the loop's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.journal.promotion import Promotion
from gateway.transport.etcd import Etcd

LEARN_EVERY_S = 1.0  # a follower reads the group's promotions and sources this often (two etcd requests)


def promote(prefix: str, stream: str, promotion: Promotion, leader_key: str, epoch: int, etcd: Etcd) -> bool:
    """(elector thread) The group promotes `stream`, only while this node leads `epoch`: whether written."""
    return etcd.put_if_held(f"{prefix}{stream}", promotion.encode(), leader_key, epoch)


def read_promotions(prefix: str, etcd: Etcd) -> dict[str, Promotion]:
    """(elector thread) Every promotion of the group, by stream."""
    return {entry.key[len(prefix) :]: Promotion.decode(entry.value.decode()) for entry in etcd.get_prefix(prefix)}


def take_promotions(
    prefix: str, own: Mapping[str, Promotion], leader_key: str, epoch: int, etcd: Etcd
) -> dict[str, Promotion]:
    """(elector thread) Every promotion of the group, read by the leader of `epoch` once elected, with the marks
    of its own journal (`own`) that etcd lacked written there (fenced by `epoch`)."""
    known = read_promotions(prefix, etcd)
    for stream, promotion in own.items():
        if stream not in known and promote(prefix, stream, promotion, leader_key, epoch, etcd):
            known[stream] = promotion
    return known


def record_source(prefix: str, stream: str, source: str, leader_key: str, epoch: int, etcd: Etcd) -> bool:
    """(elector thread) `stream` is mirrored from `source`, as the leader of `epoch` says: whether written."""
    return etcd.put_if_held(f"{prefix}{stream}", source, leader_key, epoch)


@dataclass(frozen=True, slots=True)
class Learnt:
    """What a follower reads of its group's mirror streams: their promotions and their sources."""

    promotions: dict[str, Promotion]
    sources: dict[str, str]


def learn(promoted: str, sources: str, etcd: Etcd) -> Learnt:
    """(elector thread) The group's promotions (under the prefix `promoted`) and mirror sources (`sources`)."""
    found = {entry.key[len(sources) :]: entry.value.decode() for entry in etcd.get_prefix(sources)}
    return Learnt(read_promotions(promoted, etcd), found)
