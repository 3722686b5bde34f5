"""The authority clock of a leader (gateway.replication.leadership): no I/O, times given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.replication.leadership import RENEWALS_PER_TTL, Leadership, Role


def test_a_follower_may_not_act() -> None:
    assert not Leadership(0.2).may_act(0.0)


def test_authority_runs_from_when_the_request_was_sent() -> None:
    lead = Leadership(0.2)
    lead.granted(sent_at=10.0, epoch=7, ttl_s=1.0)
    assert lead.role is Role.LEADER and lead.epoch == 7
    assert lead.may_act(10.79) and not lead.may_act(10.8)


def test_renewals_extend_and_never_shorten() -> None:
    lead = Leadership(0.2)
    lead.granted(10.0, 1, 1.0)
    lead.renewed(10.5, 1.0)
    assert lead.may_act(11.2) and not lead.may_act(11.3)
    lead.renewed(10.1, 1.0)  # a late answer to an older request does not pull the deadline back
    assert lead.may_act(11.2)


def test_a_renewal_is_due_a_fraction_of_the_ttl_after_the_last() -> None:
    lead = Leadership(0.2)
    lead.granted(0.0, 1, 2.0)
    assert not lead.renewal_due(2.0 / RENEWALS_PER_TTL - 0.01) and lead.renewal_due(2.0 / RENEWALS_PER_TTL)


def test_lost_leadership_acts_no_more_and_epochs_only_grow() -> None:
    lead = Leadership(0.2)
    lead.granted(0.0, 5, 1.0)
    lead.lost()
    assert not lead.may_act(0.1) and lead.role is Role.FOLLOWER
    lead.renewed(0.2, 1.0)  # a renewal answer arriving after the loss gives nothing back
    assert not lead.may_act(0.3)
    with pytest.raises(ValueError, match="epochs only grow"):
        lead.granted(1.0, 5, 1.0)
    with pytest.raises(ValueError, match="no authority"):
        lead.granted(1.0, 6, 0.2)


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.5, 5)), min_size=1, max_size=20))
def test_authority_never_outlives_the_newest_request_plus_ttl(renewals: list[tuple[float, float]]) -> None:
    """Whatever order answers arrive in, we stop before etcd's lease (>= newest send + ttl) can end."""
    lead = Leadership(0.2)
    lead.granted(0.0, 1, 1.0)
    for sent_at, ttl in renewals:
        lead.renewed(sent_at, ttl)
    limit = max([1.0] + [s + t for s, t in renewals])
    assert not lead.may_act(limit - 0.2)
