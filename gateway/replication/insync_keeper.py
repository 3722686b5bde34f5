"""The in-sync set in etcd: taken over when a node starts to lead, kept to the followers that keep up.

A leader's in-sync set (gateway.replication.replicas) lives in etcd, written only by the leader and fenced by its
epoch, so that exactly its members (and the leader) may be elected. This keeper writes it, and the node's
status under `<group>/nodes/<node>` (role, epoch, heads; `zeps ha status`) every `REPORT_EVERY_S`.

Threading contract: every method but the jobs runs on the gateway's loop and none waits on etcd. Every etcd
request runs on the elector's thread (gateway.replication.elector): the loop posts what etcd should say as a job
(`post`), the job carries copies of what it needs and touches nothing the loop uses, and its outcome comes
back through the elector's outcomes, which the node hands to `written`. One write of the in-sync set is in
flight at a time, so outcomes apply in the order the writes were made. Each job is one request, so that it
delays a renewal of the lease by one request at most: a take-over inherits the in-sync set that `eligible`
read for the campaign that won (`_campaigned_on`, the one state here on the elector's thread; the campaign's
transaction proved it unchanged when the epoch began). The in-memory set is never smaller than what etcd
lists: a joiner is added in memory before it is written, a laggard removed only once the write that dropped
it came back written (fenced by the epoch, as ever).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from gateway.errors import CoordinatorError
from gateway.journal.promotion import Promotion
from gateway.replication.promotions import take_promotions
from gateway.replication.replicas import InSync, eligible, insync_record, parse_record
from gateway.transport.etcd import Etcd

log = logging.getLogger(__name__)

RETRY_WRITE_S = 0.25  # a failed write of the in-sync set is tried again this soon (etcd is not to be hammered)
REPORT_EVERY_S = 1.0  # each report is an etcd request, whose Python work holds the GIL about 0.5 ms

Post = Callable[[str, Callable[[Etcd], Any]], None]  # Elector.post: a named job for the elector's thread


class GroupKeys(NamedTuple):
    """Where a group keeps its state in etcd."""

    leader: str  # the elected leader's lease
    insync: str  # the in-sync set
    status: str  # this node's status
    promoted: str  # the prefix of the group's promotions (gateway.replication.promotions)
    sources: str  # the prefix of its mirror streams' sources (the same)


@dataclass(frozen=True, slots=True)
class Written:
    """The outcome of a write of the in-sync set fenced by `epoch`: `members`, or not written (a successor leads);
    a take-over's also carries the group's promotions, by stream."""

    epoch: int
    members: frozenset[str]
    written: bool
    promotions: Mapping[str, Promotion] = field(default_factory=dict)


class Applied(NamedTuple):
    """What a written outcome changed: the set a take-over won (None: not one), the followers dropped."""

    taken_over: Written | None
    dropped: frozenset[str]


def write_insync(keys: GroupKeys, node: str, epoch: int, members: frozenset[str], etcd: Etcd) -> Written:
    """(elector thread) Make the in-sync set `members`, only while this node leads `epoch`."""
    written = etcd.put_if_held(keys.insync, insync_record(epoch, node, set(members)), keys.leader, epoch)
    return Written(epoch, members, written)


def put_status(key: str, status: str, etcd: Etcd) -> None:
    """(elector thread) The node's status for `zeps ha status`."""
    etcd.put(key, status)


class InSyncKeeper:
    """This node's writes to etcd: its in-sync set while it leads, its status always."""

    def __init__(self, node: str, keys: GroupKeys, post: Post) -> None:
        self.node, self.keys, self._post = node, keys, post
        self._campaigned_on: str | None = None  # (elector thread) the in-sync record of the last campaign
        self._recorded: set[str] = set()  # the in-sync set as last written to etcd
        # the write of the in-sync set in flight: (epoch, members; None for a take-over), and whom it drops
        self._writing: tuple[int, frozenset[str] | None] | None = None
        self._dropping: set[str] = set()
        self._write_retry_at = 0.0
        self._retry_epoch = 0  # the epoch of the write that failed last: the retry wait holds back its epoch only
        self._report_at = 0.0

    def eligible(self, etcd: Etcd) -> tuple[str, int] | None:
        """(elector thread) May this node campaign: it led or was in sync last (the set's revision), or None."""
        record = etcd.holder(self.keys.insync)
        self._campaigned_on = None if record is None else record.value
        if record is None:
            return (self.keys.insync, 0)  # a new group: anyone, unless a set is written meanwhile
        return (self.keys.insync, record.mod_revision) if eligible(self.node, record.value) else None

    def take_over(self, epoch: int, now: float, promoted: Callable[[], Mapping[str, Promotion]]) -> None:
        """Ask for the previous epoch's in-sync set to be taken over (`written` says when it was), and for the
        group's promotions, `promoted()` (this node's own marks, read only if asked) added to them. A write of
        an earlier epoch that failed does not hold it back: that epoch is over (a leader deposed and elected
        again waited `RETRY_WRITE_S` more before it could lead, while publishers heard "none is elected yet")."""
        if self._writing is not None or (now < self._write_retry_at and epoch <= self._retry_epoch):
            return
        self._writing, self._dropping = (epoch, None), set()
        self._post("insync", partial(self._take_over, epoch, dict(promoted())))

    def _take_over(self, epoch: int, own: Mapping[str, Promotion], etcd: Etcd) -> Written:
        """(elector thread) Inherit the in-sync set of the campaign that won `epoch` (if the last one did: else
        the write is fenced out), less the previous leader and this node; then read the group's promotions."""
        old_leader, members = parse_record(self._campaigned_on)
        inherited = frozenset(members - {old_leader, self.node})
        written = write_insync(self.keys, self.node, epoch, inherited, etcd)
        if not written.written:
            return written
        promotions = take_promotions(self.keys.promoted, own, self.keys.leader, epoch, etcd)
        return dataclasses.replace(written, promotions=promotions)

    def leads(self, insync: InSync) -> None:
        """This node leads with `insync`, as etcd lists it."""
        self._recorded = set(insync.members)

    def written(self, outcome: Written | CoordinatorError, insync: InSync | None, now: float) -> Applied:
        """A write of the in-sync set came back: a take-over to lead from, or followers dropped from `insync`."""
        writing, self._writing = self._writing, None
        assert writing is not None  # one write in flight at a time, and this was it
        epoch, target = writing
        if isinstance(outcome, CoordinatorError) or not outcome.written:
            why = outcome if isinstance(outcome, CoordinatorError) else "a successor leads"
            log.warning("ha: %s (%s); trying again", "cannot take over yet" if target is None else "in-sync set not "
                        "written", why)  # fmt: skip
            self._write_retry_at, self._retry_epoch = now + RETRY_WRITE_S, epoch
            return Applied(None, frozenset())
        if target is None:
            return Applied(outcome, frozenset())
        if insync is None or insync.epoch != epoch:
            return Applied(None, frozenset())
        for gone in self._dropping:
            insync.remove(gone)  # only now: commits went on without it only once etcd no longer lists it
        log.info("ha: in sync now: %s (was %s)", sorted(target), sorted(self._recorded))
        self._recorded = set(target)
        return Applied(None, frozenset(self._dropping))

    def keep(self, insync: InSync, now: float) -> None:
        """Bring etcd's in-sync set to what it should be: joiners in, laggards out."""
        for name in insync.joinable():
            insync.add(name)  # here first: commits wait for it before etcd says it may be elected
        target = insync.members - set(insync.laggards(now))
        if self._writing is not None or now < self._write_retry_at:
            return
        if target == self._recorded == insync.members:
            return
        # A laggard leaves memory only through a write, also one that etcd never listed as far as we know: the
        # write that added it failed (a timeout, say), and may have been applied all the same. Else it stayed
        # in memory for good and every commit waited for it.
        self._writing, self._dropping = (insync.epoch, frozenset(target)), insync.members - target
        self._post("insync", partial(write_insync, self.keys, self.node, insync.epoch, frozenset(target)))

    def report(self, now: float, status: Callable[[], str]) -> None:
        """Post this node's status (built on the loop, by `status`) every REPORT_EVERY_S."""
        if now < self._report_at:
            return
        self._report_at = now + REPORT_EVERY_S
        self._post("status", partial(put_status, self.keys.status, status()))
