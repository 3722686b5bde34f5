"""The LAN directory's rules (client.directory.Table, sans-IO): merging, expiry, stale announcements, sidecars."""

from __future__ import annotations

import pytest

from gateway.client.directory import EXPIRE_INTERVALS, Table
from gateway.discovery.announcer import Discovery, advertised
from gateway.errors import McastError
from gateway.wire import announce as A

PX = A.Channel("udp", "239.192.1.1", 5001)


def gateway(node_id: int = 1, sent_ns: int = 1, head: int = 5, sidecar: str = "tcp://10.0.0.1:5580") -> A.Announcement:
    streams = (A.StreamAd("px", head, 100, (PX,)), A.StreamAd("tr", 1, 0, (A.Channel("udp", "239.192.1.2", 5002),)))
    return A.Announcement(A.GATEWAY, node_id, "gw", streams, "tcp://10.0.0.1:5570", sidecar, sent_ns)


def sidecar(node_id: int, endpoint: str, sent_ns: int = 1) -> A.Announcement:
    return A.Announcement(A.SIDECAR, node_id, "replay", (A.StreamAd("px"),), sidecar=endpoint, sent_ns=sent_ns)


def test_a_stream_merges_what_its_nodes_say() -> None:
    table = Table()
    table.heard(gateway(), 0.0)
    table.heard(sidecar(2, "tcp://10.0.0.2:5580"), 0.0)
    info = table.lookup("px", 0.5)
    assert info is not None
    assert info.channels == (PX,) and info.ingest == "tcp://10.0.0.1:5570" and (info.head, info.rate) == (5, 100)
    # The sidecar's own announcement before the endpoint the gateway was configured with.
    assert info.sidecars == ("tcp://10.0.0.2:5580",) and info.named == ("tcp://10.0.0.1:5580",)
    assert info.sidecar == "tcp://10.0.0.2:5580"
    assert set(info.nodes) == {"sidecar replay", "gateway gw"}
    assert [i.name for i in table.streams(0.5)] == ["px", "tr"]
    assert table.lookup("fx", 0.5) is None


def test_a_silent_node_is_forgotten_after_three_intervals() -> None:
    table = Table()
    table.heard(gateway(), 0.0)
    table.heard(sidecar(2, "tcp://10.0.0.2:5580"), 1.0)
    info = table.lookup("px", EXPIRE_INTERVALS + 0.01)
    assert info is not None and info.channels == () and info.sidecar == "tcp://10.0.0.2:5580"
    info = table.lookup("px", EXPIRE_INTERVALS + 1.01)
    assert info is None


def test_the_sidecar_a_gateway_names_is_the_fallback() -> None:
    table = Table()
    table.heard(gateway(), 0.0)
    info = table.lookup("px", 0.1)
    assert info is not None and info.sidecars == () and info.sidecar == "tcp://10.0.0.1:5580"


def test_a_sidecar_heard_of_later_is_preferred_and_the_old_one_expires() -> None:
    table = Table()
    table.heard(sidecar(2, "tcp://10.0.0.2:5580"), 0.0)
    table.heard(sidecar(2, "tcp://10.0.0.2:5580", sent_ns=2), 1.0)
    table.heard(sidecar(3, "tcp://10.0.0.3:5590"), 1.5)  # restarted elsewhere: a new node
    info = table.lookup("px", 1.6)
    assert info is not None and info.sidecar == "tcp://10.0.0.3:5590"
    table.heard(sidecar(3, "tcp://10.0.0.3:5590", sent_ns=2), 3.5)
    info = table.lookup("px", 4.5)  # the old one said nothing for 3.5 s
    assert info is not None and info.sidecars == ("tcp://10.0.0.3:5590",)


def test_a_groups_leader_of_the_newest_epoch_is_listed_first() -> None:
    def node(node_id: int, epoch: int, leader: bool) -> A.Announcement:
        ad = A.StreamAd("px", 5, 0, (PX,))
        ingest, replay = f"tcp://10.0.0.{node_id}:5570", f"tcp://10.0.0.{node_id}:5580"
        return A.Announcement(A.GATEWAY, node_id, f"n{node_id}", (ad,), ingest, replay, 1, epoch=epoch, leader=leader)

    table = Table()
    table.heard(node(1, 7, True), 0.0)  # killed: its announcement lives on until it expires
    table.heard(node(2, 9, True), 0.1)  # its successor
    table.heard(node(3, 9, False), 0.2)  # a follower, heard of last (newest first otherwise)
    info = table.lookup("px", 0.5)
    assert info is not None and info.epoch == 9
    assert info.ingests == ("tcp://10.0.0.2:5570", "tcp://10.0.0.1:5570", "tcp://10.0.0.3:5570")
    assert info.ingest == "tcp://10.0.0.2:5570" and info.named[0] == "tcp://10.0.0.2:5580"
    for node_id in (3, 2, 1):  # the sidecars announce themselves too, the leader's not last heard of
        table.heard(sidecar(10 + node_id, f"tcp://10.0.0.{node_id}:5580"), 0.3)
    info = table.lookup("px", 0.5)
    assert info is not None and info.sidecar == "tcp://10.0.0.2:5580"  # the one on the leader's journal
    assert set(info.sidecars) == {f"tcp://10.0.0.{n}:5580" for n in (1, 2, 3)}


def test_an_older_announcement_of_a_node_is_dropped() -> None:
    table = Table()
    assert table.heard(gateway(sent_ns=10, head=9), 0.0)
    assert not table.heard(gateway(sent_ns=5, head=1), 0.1)
    info = table.lookup("px", 0.2)
    assert info is not None and info.head == 9


def test_wildcard_endpoints_are_announced_with_the_interface_address() -> None:
    assert advertised("tcp://*:5570", "10.0.0.1") == "tcp://10.0.0.1:5570"
    assert advertised("tcp://0.0.0.0:5570", "10.0.0.1") == "tcp://10.0.0.1:5570"
    assert advertised("tcp://10.9.9.9:5570", "10.0.0.1") == "tcp://10.9.9.9:5570"
    assert advertised("", "10.0.0.1") == ""


def test_server_discovery_settings_from_the_command_line_or_toml() -> None:
    from gateway.cli.discovery_opts import server_discovery

    assert server_discovery({}) == Discovery(node=Discovery().node)
    given = server_discovery({"announce_interface": "eth1", "discovery": "239.192.9.9:6000", "announce_ms": 0})
    assert (given.interfaces, given.group, given.port, given.interval_ms) == (("eth1",), "239.192.9.9", 6000, 0)
    with pytest.raises(McastError):
        server_discovery({"discovery": "10.0.0.1:6000"})  # not a multicast group
