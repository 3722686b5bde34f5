"""A replicated group's promotions (docs/mirroring.md, "Promoting a group"): which mirror streams it made primary.

Under `<group>/promoted/<stream>` etcd holds the sequence the stream was promoted at. The leader that takes
PROMOTE writes it fenced by its epoch (a deposed leader's write fails, so it never answers PROMOTE-OK for a
promotion the group does not hold); a node that starts to lead reads every promotion after its campaign won,
so it knows each one a predecessor answered for, before it takes any mirror batch. A follower of a group with
mirror streams reads them every `LEARN_EVERY_S`. Each node keeps the mark in its journal
(gateway.journal.promotion) once it knows it, and a new leader writes to etcd any mark of its own that etcd
lacks: the fence survives a node restarted without etcd's word and an etcd that lost its data.

Threading contract: these are jobs for the elector's thread (gateway.replication.elector); each touches
nothing of the loop's.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.transport.etcd import Etcd


def promoted_key(prefix: str, stream: str) -> str:
    """The key of `stream`'s promotion; `prefix`: the group's promotions (<group>/promoted/)."""
    return f"{prefix}{stream}"


def promote(prefix: str, stream: str, head: int, leader_key: str, epoch: int, etcd: Etcd) -> bool:
    """(elector thread) The group promotes `stream` at `head`, only while this node leads `epoch`: whether written."""
    return etcd.put_if_held(promoted_key(prefix, stream), str(head), leader_key, epoch)


LEARN_EVERY_S = 1.0  # a follower reads the group's promotions this often (one etcd request)


def read_promotions(prefix: str, etcd: Etcd) -> dict[str, int]:
    """(elector thread) Every promotion of the group: stream -> the sequence it was promoted at."""
    return {entry.key[len(prefix) :]: int(entry.value.split()[0]) for entry in etcd.get_prefix(prefix)}


def take_promotions(prefix: str, own: Mapping[str, int], leader_key: str, epoch: int, etcd: Etcd) -> dict[str, int]:
    """(elector thread) Every promotion of the group, read by the leader of `epoch` once elected, with the marks
    of its own journal (`own`) that etcd lacked written there (fenced by `epoch`)."""
    known = {entry.key[len(prefix) :]: int(entry.value.split()[0]) for entry in etcd.get_prefix(prefix)}
    for stream, head in own.items():
        if stream not in known and promote(prefix, stream, head, leader_key, epoch, etcd):
            known[stream] = head
    return known
