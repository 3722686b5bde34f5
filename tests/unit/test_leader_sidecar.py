"""The rule that sends a failover's gap fill to the new leader's sidecar (gateway.client.leader_sidecar), and the
replay link's state when it moves there (gateway.client.link_state)."""

from __future__ import annotations

from gateway.client import link_state as L
from gateway.client.leader_sidecar import LeaderSidecar

N1, N2, N3 = (f"tcp://10.0.0.{i}:5580" for i in (1, 2, 3))


def test_a_newer_epoch_names_its_leaders_sidecar() -> None:
    leader = LeaderSidecar()
    assert leader.heard(7, N1) == N1  # the first epoch heard: its leader's sidecar
    assert leader.heard(7, N1) is None  # the same epoch again: nothing new
    assert leader.heard(9, N2) == N2  # a failover: the new leader's
    assert (leader.epoch, leader.sidecar) == (9, N2)


def test_a_deposed_leaders_heartbeats_change_nothing() -> None:
    """n1 paused and deposed, resumed: its heartbeats of the older epoch do not take the link back to it."""
    leader = LeaderSidecar()
    leader.heard(7, N1)
    leader.heard(9, N2)
    assert leader.heard(7, N1) is None and leader.heard(8, N3) is None
    assert (leader.epoch, leader.sidecar) == (9, N2)


def test_a_leader_elected_again_is_named_again() -> None:
    """A newer epoch led by the same node names it again: the link goes back if a failed request moved it."""
    leader = LeaderSidecar()
    leader.heard(7, N1)
    assert leader.heard(8, N1) == N1


def test_a_single_gateway_names_no_leader() -> None:
    leader = LeaderSidecar()
    assert leader.heard(0, N1) is None and leader.heard(0, N2) is None
    assert leader.heard(3, "") is None and leader.epoch == 0


def test_the_link_moves_to_the_leaders_sidecar_from_ready_only() -> None:
    """READY -> CONNECTING (a connection to the leader's sidecar handshakes); a link that is connecting or
    retrying stays where it is (its next connection goes to the leader's sidecar); FAILED is final."""
    assert L.step(L.READY, L.LEADER) is L.CONNECTING
    for state in (L.CONNECTING, L.RETRYING, L.FAILED):
        assert L.step(state, L.LEADER) is state


def test_only_the_newest_leaders_sidecar_holds_more_after_a_short_answer() -> None:
    """Rule 3: the leader's sidecar that answered short is asked again (it has not committed that far yet); a
    deposed or following node's, or any before a leader is heard, is left."""
    leader = LeaderSidecar()
    assert not leader.holds_more(N1) and not leader.holds_more(None)
    leader.heard(7, N1)
    leader.heard(9, N2)
    assert leader.holds_more(N2)
    assert not leader.holds_more(N1) and not leader.holds_more(N3)


def test_a_short_answer_at_the_leaders_sidecar_leaves_the_link_ready_there() -> None:
    """SHORT keeps READY (the connections stay); LOST, a short answer elsewhere or silence, moves on."""
    assert L.step(L.READY, L.SHORT) is L.READY and L.SHORT in L.TRANSITIONS[L.READY].on
    assert L.step(L.READY, L.LOST) is L.RETRYING
