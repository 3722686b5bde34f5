"""The gateway's channel plan: which --multicast endpoint carries which streams."""

from __future__ import annotations

import pytest

from gateway.errors import ConfigError, McastError, ProtocolError
from gateway.mcast import Endpoint
from gateway.sequencer.channels import Channel, parse_mapping, plan

A = "udp://10.0.0.1;239.192.1.1:5001"
B = "udp://10.0.0.1;239.192.1.2:5002"


def test_plain_endpoint_carries_every_stream() -> None:
    assert plan([A], ["px", "tr"]) == [Channel(Endpoint.parse(A), ("px", "tr"))]


def test_mapped_endpoints_carry_their_streams_only() -> None:
    assert plan([f"px={A}", f"tr={B}", f"px={B}"], ["px", "tr"]) == [
        Channel(Endpoint.parse(A), ("px",)),
        Channel(Endpoint.parse(B), ("tr", "px")),
    ]


def test_stream_names_may_hold_equals_signs() -> None:
    assert parse_mapping(f"a=b={A}") == ("a=b", Endpoint.parse(A))
    assert parse_mapping(A) == (None, Endpoint.parse(A))


def test_no_multicast_is_a_journal_only_gateway() -> None:
    assert plan([], ["px"]) == []


@pytest.mark.parametrize(
    ("texts", "error"),
    [
        ([f"fx={A}"], ConfigError),  # not a stream of this gateway
        ([f"px={A}"], ConfigError),  # tr on no channel
        ([f"p x={A}"], ProtocolError),
        (["px=tcp://127.0.0.1:1"], McastError),
    ],
)
def test_bad_plans_are_refused(texts: list[str], error: type[Exception]) -> None:
    with pytest.raises(error):
        plan(texts, ["px", "tr"])
