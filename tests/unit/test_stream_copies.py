"""Where a stream's authoritative copy lives (docs/mirroring.md, Fan-in): the copy and source a gateway announces
(announcement version 2, only for copies), and the directory's merge of a primary and its mirrors."""

from __future__ import annotations

import pytest

from gateway.client.directory import Holder, Table
from gateway.discovery.announcer import gateway_streams
from gateway.errors import McastError
from gateway.mcast import Endpoint
from gateway.sequencer import mirroring as MR
from gateway.wire import announce as A
from gateway.wire.streamkey import StreamKey

KEY = StreamKey(b"k" * 32)
CH = A.Channel("udp", "239.192.1.1", 5001)
SOURCE = "tcp://10.1.0.2:5571"


def ann(node_id: int, node: str, *streams: A.StreamAd, ingest: str = "") -> A.Announcement:
    return A.Announcement(A.GATEWAY, node_id, node, streams, ingest or f"tcp://10.0.0.{node_id}:5570", "", node_id)


def test_the_copies_are_the_mirroring_rules_roles() -> None:
    assert sorted({role.copy for role in MR.Role}) == sorted(A.COPIES)
    assert MR.Role.PROMOTING.copy == A.MIRROR  # not promoted until the mark is persisted


@pytest.mark.parametrize("key", [None, KEY])
def test_a_copy_round_trips_in_version_2(key: StreamKey | None) -> None:
    sent = ann(1, "agg", A.StreamAd("s1", 9, 0, (CH,), A.MIRROR, SOURCE), A.StreamAd("s2", 3, 0, (), A.PROMOTED))
    data = sent.encode(key)
    assert data[2] == A.VERSION_COPIES
    assert A.decode(data, [KEY] if key else []) == sent


def test_primaries_stay_in_version_1_datagrams_of_their_own() -> None:
    """A listener that speaks version 1 alone still hears every primary stream of a gateway that also mirrors."""
    plain, mirrored = A.StreamAd("p", 1, 0, (CH,)), A.StreamAd("m", 2, 0, (CH,), A.MIRROR, SOURCE)
    datagrams = ann(1, "agg", mirrored, plain).encode_all()
    assert [(d[2], A.decode(d).streams) for d in datagrams] == [(1, (plain,)), (2, (mirrored,))]


def test_an_unknown_copy_is_refused() -> None:
    data = bytearray(ann(1, "agg", A.StreamAd("m", 2, 0, (), A.MIRROR, "")).encode())
    data[-2] = len(A.COPIES)  # the copy byte, before the empty source
    with pytest.raises(McastError, match="unknown copy"):
        A.decode(bytes(data))


def test_a_source_no_announcement_can_carry_is_not_known() -> None:
    assert A.announceable(SOURCE) == SOURCE
    assert A.announceable("tcp://host name:1") == A.announceable("x" * 256) == ""


def test_a_gateway_announces_the_copy_it_holds_of_each_stream() -> None:
    out = Endpoint.parse("udp://lo;239.192.1.1:5001")
    ads = gateway_streams({"s1": 4, "s2": 7}, [(out, {"s1", "s2"})], {"s1": (A.MIRROR, SOURCE)})
    assert [(ad.name, ad.copy, ad.source) for ad in ads] == [("s1", A.MIRROR, SOURCE), ("s2", A.PRIMARY, "")]


def test_fan_in_each_stream_lists_where_its_authoritative_copy_lives() -> None:
    """Two sites' primaries and one aggregator mirroring both, in one directory (etcd: the same merge)."""
    table = Table()
    table.heard(ann(1, "site-a", A.StreamAd("s1", 10, 0, (CH,))), 0.0)
    table.heard(ann(2, "site-b", A.StreamAd("s2", 20, 0, (CH,))), 0.0)
    agg = ann(3, "agg", A.StreamAd("s1", 10, 0, (), A.MIRROR, "tcp://a:5571"),
              A.StreamAd("s2", 20, 0, (), A.MIRROR, "tcp://b:5571"))  # fmt: skip
    table.heard(agg, 0.1)  # heard of last: newest first, but a mirror's ingest goes after the primary's
    s1, s2 = table.lookup("s1", 0.2), table.lookup("s2", 0.2)
    assert s1 is not None and s2 is not None
    assert s1.holders == (Holder("site-a"), Holder("agg", A.MIRROR, "tcp://a:5571"))
    assert s1.ingests == ("tcp://10.0.0.1:5570", "tcp://10.0.0.3:5570")
    assert s1.authoritative == (Holder("site-a"),)
    assert s2.authoritative == (Holder("site-b"),) and s2.holders[1].source == "tcp://b:5571"


def test_only_mirrors_listed_means_the_authoritative_copy_is_at_their_source() -> None:
    table = Table()
    table.heard(ann(3, "agg", A.StreamAd("s1", 10, 0, (), A.MIRROR, "tcp://a:5571")), 0.0)
    info = table.lookup("s1", 0.1)
    assert info is not None and info.authoritative == () and info.holders[0].source == "tcp://a:5571"
    table.heard(ann(3, "agg", A.StreamAd("s1", 11, 0, (), A.PROMOTED, "tcp://a:5571")), 1.0)
    info = table.lookup("s1", 1.1)
    assert info is not None and info.authoritative == (Holder("agg", A.PROMOTED, "tcp://a:5571"),)
