"""The leader's in-sync set and commit point (gateway.replication.replicas), sans-IO."""

from __future__ import annotations

from gateway.replication.replicas import SWITCH_S, InSync, eligible, parse_record


def insync(min_insync: int = 1, members: tuple[str, ...] = ("b", "c")) -> InSync:
    s = InSync("a", 7, min_insync, 1.0, {"s": 0})
    s.start(set(members), now=0.0)
    return s


def test_commit_waits_for_every_in_sync_follower() -> None:
    s = insync()
    s.ack("b", 7, "s", 10, 10, now=0.1)
    s.advance({"s": 10}, now=0.1)
    assert s.committed["s"] == 0  # c has nothing yet
    s.ack("c", 7, "s", 8, 8, now=0.2)
    s.advance({"s": 10}, now=0.2)
    assert s.committed["s"] == 8


def test_confirms_wait_for_every_in_sync_disk_and_multicast_only_for_the_copies() -> None:
    s = insync()
    s.ack("b", 7, "s", 10, 4, now=0.1)  # written through 10, fsynced through 4
    s.ack("c", 7, "s", 8, 8, now=0.1)
    s.advance({"s": 10}, now=0.1)
    assert (s.committed["s"], s.durable["s"]) == (8, 4)
    s.ack("b", 7, "s", 10, 10, now=0.2)
    s.advance({"s": 10}, now=0.2)
    assert (s.committed["s"], s.durable["s"]) == (8, 8)  # never past what every member wrote
    s.ack("c", 7, "s", 10, 9, now=0.3)
    s.ack("c", 7, "s", 10, 3, now=0.3)  # an older ack arriving late moves nothing back
    s.advance({"s": 10}, now=0.3)
    assert (s.committed["s"], s.durable["s"]) == (10, 9)


def test_acks_of_another_epoch_count_for_nothing() -> None:
    s = insync(members=("b",))
    s.ack("b", 6, "s", 10, 10, now=0.1)  # b still follows the old leader
    s.advance({"s": 10}, now=0.1)
    assert s.committed["s"] == 0


def test_below_min_insync_nothing_commits_and_the_point_never_goes_back() -> None:
    s = insync(min_insync=1, members=("b",))
    s.ack("b", 7, "s", 5, 5, now=0.1)
    s.advance({"s": 10}, now=0.1)
    assert s.committed["s"] == 5
    s.remove("b")
    s.advance({"s": 12}, now=0.2)
    assert s.committed["s"] == 5
    alone = insync(min_insync=0, members=())
    alone.advance({"s": 12}, now=0.2)
    assert alone.committed["s"] == 12


def test_a_silent_or_lagging_follower_is_a_laggard_and_a_caught_up_one_joins() -> None:
    s = insync(min_insync=0, members=("b",))
    s.ack("b", 7, "s", 3, 3, now=0.5)
    s.advance({"s": 10}, now=0.5)  # b behind since 0.5
    assert s.laggards(now=1.4) == []
    assert s.laggards(now=1.6) == ["b"]
    s.ack("c", 7, "s", 3, 3, now=1.6)  # c holds everything committed (3)
    s.advance({"s": 10}, now=1.6)
    assert s.joinable() == ["c"]
    silent = insync(min_insync=1, members=("b",))
    assert silent.laggards(now=SWITCH_S + 0.1) == ["b"]  # silence leaves whatever min_insync says


def test_a_member_only_behind_stays_while_the_set_needs_it_to_commit() -> None:
    s = insync(min_insync=1, members=("b",))  # b joined after a stall: behind the head by what piled up
    s.ack("b", 7, "s", 3, 3, now=0.1)
    s.advance({"s": 100}, now=0.1)
    assert s.committed["s"] == 3
    s.ack("b", 7, "s", 50, 50, now=1.5)  # catching up, acknowledging all along
    s.advance({"s": 120}, now=1.5)
    assert s.laggards(now=1.5) == []  # dropping it would stop every commit until it joined again
    assert s.committed["s"] == 50
    two = insync(min_insync=1, members=("b", "c"))
    two.ack("b", 7, "s", 40, 40, now=0.1)
    two.ack("c", 7, "s", 20, 20, now=0.1)
    two.advance({"s": 100}, now=0.1)
    two.ack("b", 7, "s", 60, 60, now=1.2)
    two.ack("c", 7, "s", 30, 30, now=1.2)
    assert two.laggards(now=1.2) == ["c"]  # one may leave: the furthest behind


def test_a_member_taken_over_is_counted_from_its_first_ack_in_the_epoch() -> None:
    s = insync(min_insync=0, members=("b",))  # the epoch began at 0; b must find this leader and connect first
    s.advance({"s": 10}, now=0.5)
    assert s.laggards(now=1.5) == []  # past lag_s (1.0) since the epoch began, but not heard yet
    s.ack("b", 7, "s", 3, 3, now=1.6)  # its first ack, still behind
    s.advance({"s": 10}, now=1.6)  # behind since 1.6, not since the epoch began
    assert s.laggards(now=2.5) == []
    s.ack("b", 7, "s", 4, 4, now=2.5)
    assert s.laggards(now=2.7) == ["b"]  # behind for longer than lag_s since its first ack


def test_a_member_taken_over_that_never_acks_leaves_after_switch_s() -> None:
    s = insync(members=("b", "c"))
    s.ack("c", 7, "s", 10, 10, now=0.2)
    s.advance({"s": 10}, now=0.2)
    assert s.committed["s"] == 0  # b holds every commit while it is a member
    s.ack("c", 7, "s", 10, 10, now=SWITCH_S)
    assert s.laggards(now=SWITCH_S) == []
    assert s.laggards(now=SWITCH_S + 0.01) == ["b"]


def test_a_follower_joins_only_holding_what_earlier_epochs_committed() -> None:
    s = InSync("a", 7, 1, 1.0, {"s": 0}, floor={"s": 100})  # a's head when epoch 7 began
    s.start(set(), now=0.0)
    s.ack("c", 7, "s", 60, 60, now=0.1)  # this epoch has committed nothing yet: 60 >= 0, but not >= 100
    assert s.joinable() == []
    s.ack("c", 7, "s", 100, 100, now=0.2)
    assert s.joinable() == ["c"]


def test_the_record_names_who_may_be_elected() -> None:
    s = insync(members=("b", "a"))  # the leader is never its own follower
    text = s.record()
    assert parse_record(text) == ("a", {"b"})
    assert eligible("a", text) and eligible("b", text) and not eligible("c", text)
    assert eligible("c", None)  # a new group: anyone


def test_a_follower_whose_link_hung_up_leaves_at_once_and_an_ack_takes_that_back() -> None:
    s = insync()
    s.ack("b", 7, "s", 10, 10, now=0.1)
    s.ack("c", 7, "s", 10, 10, now=0.1)
    s.hung_up("c")  # its process exited: the kernel closed the peer link
    assert s.laggards(now=0.2) == ["c"]  # well within lag_s (1.0): no wait for silence
    s.ack("c", 7, "s", 11, 11, now=0.3)  # it was only a new connection: it acknowledged again
    assert s.laggards(now=0.4) == []
    s.hung_up("d")  # not a follower: nothing to do
    assert s.laggards(now=0.4) == []
