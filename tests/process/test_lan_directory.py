"""The LAN directory's socket side (client.directory.LanDirectory.drain) on a datagram socket pair: no multicast
group is joined here (the lab tests hear real announcements)."""

from __future__ import annotations

import socket

from gateway.client.directory import DRAIN_MAX, LanDirectory, Table


def test_a_flood_on_the_discovery_group_is_read_in_bounded_drains() -> None:
    # 1.5 drains' worth of junk takes two calls, each returning after DRAIN_MAX datagrams, each counted.
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with here, there:
        lan = LanDirectory.__new__(LanDirectory)  # its socket is the pair's end, not a joined group
        lan.where, lan.keys, lan.table, lan.dropped, lan.sock = "test", [], Table(), {}, here
        here.setblocking(False)
        there.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
        here.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        junk = DRAIN_MAX + DRAIN_MAX // 2
        for _ in range(junk):
            there.send(b"junk")
        lan.drain()
        assert lan.dropped == {"malformed": DRAIN_MAX}
        lan.drain()
        assert lan.dropped == {"malformed": junk}
        lan.drain()
        assert lan.dropped == {"malformed": junk}
