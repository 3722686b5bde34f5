"""DatagramFills, the subscriber's side of datagram gap fills, against a UDP socket on loopback standing in for
the sidecar's fill port: repeats, escalation to TCP, forged and late answers, a silent port. The rules without
sockets are in tests/unit/test_fill.py."""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Iterator

import pytest
import zmq

from gateway.client.datagram_fills import FIRST_WAIT_S, STALE, DatagramFills
from gateway.client.subscriber import reported_as
from gateway.wire import batch as B
from gateway.wire import fill as F
from gateway.wire.streamkey import StreamKey

KEY = StreamKey(b"k" * 32)


@pytest.fixture
def sidecar() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2.0)
    yield sock
    sock.close()


def test_unanswered_datagrams_are_repeated_then_the_range_goes_to_tcp(sidecar: socket.socket) -> None:
    fills = DatagramFills(sidecar.getsockname(), "s", tries=3)
    try:
        assert not fills.ask(1, 1, 10_000, 0.0)  # too large: FETCH
        assert fills.ask(2, 10, 19, 0.0)
        sidecar.settimeout(0.0)
        seen: list[F.FillRequest] = []
        escalated: list[tuple[int, int, int]] = []
        now = 0.0
        while fills.hedge.asks and now < 5.0:
            now += FIRST_WAIT_S / 2
            escalated += fills.expire(now, next_seq=12)
            with contextlib.suppress(BlockingIOError):
                seen.append(F.decode_request(sidecar.recv(100)))
        # Three datagrams, then FETCH (returned once), with datagrams asking alongside up to three more.
        assert [(r.request_id, r.first, r.last) for r in seen] == [(2, 10, 19)] + [(2, 12, 19)] * 5
        assert escalated == [(2, 12, 19)] and fills.stats.escalated == 1 and not fills.hedge.asks
    finally:
        fills.close()


def test_answers_move_the_range_on_and_forged_ones_are_dropped(sidecar: socket.socket) -> None:
    fills = DatagramFills(sidecar.getsockname(), "s", keys={KEY.id: KEY})
    rogue = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        fills.ask(3, 1, 10, 0.0)
        req_raw, client = sidecar.recvfrom(100)
        assert F.decode_request(req_raw, {KEY.id: KEY}).count == 10
        first = B.encode(1, [(0, b"k", b"v")] * 6)
        rogue.sendto(F.encode_answer(3, first, b"s", KEY), client)  # right tag, wrong source
        sidecar.sendto(F.encode_answer(3, first, b"s"), client)  # unsigned
        sidecar.sendto(F.encode_answer(3, first, b"s", KEY), client)
        assert select.select([fills], [], [], 2.0)[0]
        got = fills.receive(0.001)  # loopback delivers at sendto: all three wait
        assert [(rid, b.first_seq, b.last_seq) for rid, b in got] == [(3, 1, 6)]
        assert fills.stats.rejected == 2 and fills.hedge.asks[3].lo == 7
        assert fills.hedge.srtt is not None  # a first try's answer is a round-trip sample
        fills.hedge.cancel(3)
        assert fills.hedge.next_due() is None
    finally:
        rogue.close()
        fills.close()


def test_a_silent_fill_port_sends_ranges_to_tcp_at_once_and_is_probed(sidecar: socket.socket) -> None:
    fills = DatagramFills(sidecar.getsockname(), "s", tries=1)
    try:
        now = 0.0
        for rid in (1, 2):
            assert fills.ask(rid, 1, 5, now)
            now += 1.0
            assert fills.expire(now, 1) == [(rid, 1, 5)]
        assert fills.hedge.silent
        assert not fills.ask(3, 1, 5, now)  # TCP at once; a probe datagram goes with it
        assert not fills.ask(4, 1, 5, now)  # no second probe within PROBE_S
        sidecar.settimeout(0.0)
        sent = []
        with contextlib.suppress(BlockingIOError):
            while True:
                data, client = sidecar.recvfrom(100)
                sent.append(F.decode_request(data).request_id)
        assert sent == [1, 1, 2, 2, 3] and fills.stats.probes == 1  # each range asked again alongside its FETCH
        sidecar.sendto(F.encode_answer(3, B.encode(1, [(0, b"k", b"v")] * 5), b"s"), client)  # the probe's answer
        assert select.select([fills], [], [], 2.0)[0]
        assert [(rid, b.first_seq) for rid, b in fills.receive(now)] == [(STALE, 1)]
        assert not fills.hedge.silent and fills.ask(5, 1, 5, now)  # the port answers again: datagrams first
    finally:
        fills.close()


def test_a_readable_fill_socket_is_found_in_the_pollers_answer(sidecar: socket.socket) -> None:
    """zmq.Poller reports a socket that is not ZeroMQ's by its fd; the Subscriber tells a turn with a fill answer
    from one with multicast alone by what `reported_as` gives, which must be what the poller reports."""
    fills = DatagramFills(sidecar.getsockname(), "s")
    poller = zmq.Poller()
    poller.register(fills, zmq.POLLIN)
    try:
        assert fills.ask(1, 10, 19, 0.0)  # its request binds the socket; the answer comes back to it
        _, address = sidecar.recvfrom(100)
        assert reported_as(fills) not in dict(poller.poll(0))
        sidecar.sendto(b"x", address)
        assert reported_as(fills) in dict(poller.poll(2000))
    finally:
        poller.unregister(fills)
        fills.close()
