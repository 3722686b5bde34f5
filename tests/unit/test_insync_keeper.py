"""The leader's writes of its in-sync set (gateway.replication.insync_keeper), driven by hand: the jobs it posts
for the elector's thread are collected, and their outcomes handed back as the elector would."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import CoordinatorError
from gateway.replication.insync_keeper import RETRY_WRITE_S, GroupKeys, InSyncKeeper, Written
from gateway.replication.replicas import InSync

KEYS = GroupKeys("/g/leader", "/g/insync", "/g/nodes/a", "/g/promoted/", "/g/sources/")


def leader(members: set[str]) -> tuple[InSyncKeeper, InSync, list[Callable[..., Any]]]:
    """Node a leading epoch 7 with `members` in sync (as etcd lists them), --min-insync 1, lag 1 s."""
    posted: list[Callable[..., Any]] = []
    keeper = InSyncKeeper("a", KEYS, lambda _name, job: posted.append(job))
    insync = InSync("a", 7, 1, 1.0, {"s": 0})
    insync.start(members, now=0.0)
    keeper.leads(insync)
    return keeper, insync, posted


def target(job: Callable[..., Any]) -> frozenset[str]:
    """The members a posted write of the in-sync set would give etcd."""
    return job.args[3]  # type: ignore[attr-defined, no-any-return]  # partial(write_insync, keys, node, epoch, members)


def test_a_joiner_whose_write_failed_and_who_then_went_silent_leaves_and_commits_go_on() -> None:
    keeper, insync, posted = leader({"c"})
    insync.ack("c", 7, "s", 10, 10, now=0.1)
    insync.ack("b", 7, "s", 10, 10, now=0.1)
    insync.advance({"s": 10}, now=0.1)
    keeper.keep(insync, now=0.1)  # b holds what is committed: it joins, here first, then in etcd
    assert insync.members == {"b", "c"} and target(posted[-1]) == {"b", "c"}
    # etcd did not answer in time (it may have written it all the same): the keeper tries again later
    keeper.written(CoordinatorError("etcd unreachable"), insync, now=0.2)
    assert insync.members == {"b", "c"}  # never smaller than etcd may list
    # b goes silent before the retry: it must leave, through a write, although etcd lists it as far as we know
    insync.ack("c", 7, "s", 20, 20, now=1.5)
    insync.advance({"s": 20}, now=1.5)
    assert insync.committed["s"] == 10  # b holds commits back
    posted.clear()
    keeper.keep(insync, now=1.5 + RETRY_WRITE_S)
    assert [target(job) for job in posted] == [{"c"}]  # without the fix: nothing posted, b in memory for good
    keeper.written(Written(7, frozenset({"c"}), True), insync, now=1.6)
    assert insync.members == {"c"}
    insync.advance({"s": 20}, now=1.6)
    assert insync.committed["s"] == 20  # commits follow c alone again


def test_nothing_is_written_while_etcd_lists_what_memory_holds() -> None:
    keeper, insync, posted = leader({"c"})
    insync.ack("c", 7, "s", 5, 5, now=0.1)
    insync.advance({"s": 5}, now=0.1)
    keeper.keep(insync, now=0.1)
    assert posted == []


def test_a_take_over_is_not_held_back_by_a_failed_write_of_an_earlier_epoch() -> None:
    # a led epoch 7 and was deposed while a write of its set was in flight; it wins epoch 9: the write of 7
    # comes back fenced out, and the take-over of 9 goes at once, not RETRY_WRITE_S later
    keeper, insync, posted = leader({"c"})
    insync.ack("b", 7, "s", 0, 0, now=0.1)
    keeper.keep(insync, now=0.1)  # b joins: a write of epoch 7 in flight
    assert len(posted) == 1
    keeper.take_over(9, now=0.15, promoted=dict)
    assert len(posted) == 1  # one write in flight at a time
    keeper.written(Written(7, frozenset({"b", "c"}), False), None, now=0.2)  # fenced out: a successor leads
    keeper.take_over(9, now=0.21, promoted=dict)
    assert len(posted) == 2  # the take-over, at once
    keeper.written(CoordinatorError("etcd unreachable"), None, now=0.3)
    keeper.take_over(9, now=0.31, promoted=dict)
    assert len(posted) == 2  # the take-over of 9 itself failed: it waits RETRY_WRITE_S before trying again
    keeper.take_over(9, now=0.3 + RETRY_WRITE_S, promoted=dict)
    assert len(posted) == 3
