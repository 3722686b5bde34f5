"""The leader key's value (gateway.replication.follower.LeaderInfo): what followers and clients learn of a leader."""

from __future__ import annotations

import pytest

from gateway.errors import CoordinatorError
from gateway.replication.follower import LeaderInfo


def test_a_leader_record_round_trips_and_a_wildcard_bind_takes_the_replay_host() -> None:
    info = LeaderInfo("n1", "tcp://0.0.0.0:5570", "tcp://10.0.0.2:5580", "tcp://0.0.0.0:40123", "ab" * 32)
    assert LeaderInfo.decode(info.encode()) == info
    assert info.reachable(info.peer) == "tcp://10.0.0.2:40123"
    assert info.reachable("tcp://10.0.0.9:1") == "tcp://10.0.0.9:1"


@pytest.mark.parametrize(
    "text",
    [
        '{"node": "n1", "ingest": "tcp://a:1", "replay": "tcp://a:2", "ack_key": "00"}',  # an older node: no peer
        "not json",
        "[1, 2]",
    ],
)
def test_a_record_of_another_version_is_one_clear_error(text: str) -> None:
    with pytest.raises(CoordinatorError, match="run one version of zeps on every node"):
        LeaderInfo.decode(text)
