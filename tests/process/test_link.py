"""The peer link's framing and its TCP connection (gateway.wire.length_prefixed, gateway.transport.link): frames
come out whole however the stream is cut, sends never block and never exceed their queue, and every way a
connection can fail closes the link with a reason, never an exception in the owner's loop.

Every test of a connected pair runs over plain TCP and over TLS (gateway.transport.tls: mutual, certificates of
one CA); TLS also refuses a peer that is not of the group, and ends a handshake that does not finish.

Real sockets and certificates on loopback; nothing is mocked.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from support.certs import Certs, make_certs

from gateway.errors import ConfigError, ProtocolError
from gateway.transport.link import Link, LinkSet, Listener, tcp_address
from gateway.transport.send_errors import SendErrors
from gateway.transport.tls import HANDSHAKE_S, PeerTls, make_ca, make_node
from gateway.wire.length_prefixed import Deframer, header


def framed(*frames: bytes) -> bytes:
    return b"".join(header(len(f)) + f for f in frames)


def test_frames_come_out_whole_wherever_the_stream_is_cut() -> None:
    frames = [b"", b"a", os.urandom(300), os.urandom(70_000)]
    stream = framed(*frames)
    for step in (1, 3, 4, 5, 4096, len(stream)):
        d, got = Deframer(1 << 20), []
        for i in range(0, len(stream), step):
            d.feed(stream[i : i + step])
            while (frame := d.next()) is not None:
                got.append(frame)
        assert got == frames and not d.partial, step


def test_a_length_over_the_limit_is_refused_before_its_bytes_are_buffered() -> None:
    d = Deframer(100)
    d.feed(header(101))
    with pytest.raises(ProtocolError, match="frame of 101 bytes, over the limit of 100"):
        d.next()
    d = Deframer(100)
    d.feed(header(100) + b"x" * 99)
    assert d.next() is None and d.partial


@pytest.mark.parametrize(
    ("endpoint", "address"),
    [("tcp://127.0.0.1:5", ("127.0.0.1", 5)), ("tcp://*:*", ("0.0.0.0", 0)), ("tcp://[::1]:7", ("::1", 7))],
)
def test_endpoints(endpoint: str, address: tuple[str, int]) -> None:
    assert tcp_address(endpoint) == address


@pytest.mark.parametrize("endpoint", ["udp://1.2.3.4:5", "tcp://1.2.3.4", "tcp://:5", "tcp://h:x"])
def test_endpoints_that_are_not_tcp_host_port_say_so(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="give tcp://HOST:PORT"):
        tcp_address(endpoint)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"), ["a", "b"])


def connected(
    client_tls: ssl.SSLContext | None, server_tls: ssl.SSLContext | None, expect_name: str | None = None
) -> tuple[Link, Link]:
    """(client, server) links over loopback, not yet used (a TLS handshake still to come)."""
    listener = Listener("tcp://127.0.0.1:*")
    client = Link.connect(listener.endpoint, max_frame=1 << 25, max_queued=8, tls=client_tls, expect_name=expect_name)
    accepted: list[Link] = []
    deadline = time.monotonic() + 5
    while not accepted and time.monotonic() < deadline:
        accepted = listener.accept(max_frame=1 << 25, max_queued=8, tls=server_tls)
    listener.close()
    assert accepted
    return client, accepted[0]


@pytest.fixture(params=["plain", "tls"])
def pair(request: pytest.FixtureRequest, certs: Certs) -> Iterator[tuple[Link, Link]]:
    """(client, server) links connected over loopback, plain or TLS, each having carried a frame."""
    a, b = (certs.peer_tls("a"), certs.peer_tls("b")) if request.param == "tls" else (None, None)
    client, server = connected(a and a.client, b and b.server)
    assert client.send(b"hello") == "sent" and receive(server, 1, other=client) == [b"hello"]
    assert server.send(b"hi") == "sent" and receive(client, 1, other=server) == [b"hi"]
    yield client, server
    client.close()
    server.close()


def receive(link: Link, count: int, deadline_s: float = 5.0, other: Link | None = None) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < count and time.monotonic() < deadline and not link.closed:
        got.extend(link.frames(count - len(got)))
        if other is not None:
            other.flush()
    return got


def test_frames_go_both_ways_in_order_and_a_large_one_waits_in_the_queue_until_flushed(
    pair: tuple[Link, Link],
) -> None:
    client, server = pair
    small = [b"ping %d" % i for i in range(100)]
    for frame in small:
        assert client.send(frame) == "sent"
    assert receive(server, 100) == small
    big = os.urandom(20_000_000)  # more than loopback's socket buffers take at once
    assert server.send(big) == "sent"
    assert server.send(b"after") == "sent"
    assert server.wants_write  # the rest waits for the kernel: the owner polls POLLOUT
    assert receive(client, 2, other=server) == [big, b"after"]
    assert not server.wants_write


def test_a_peer_that_reads_nothing_fills_the_queue_and_then_frames_are_not_sent(pair: tuple[Link, Link]) -> None:
    client, server = pair
    outcomes = [server.send(b"x" * 100_000) for _ in range(200)]  # 20 MB: the kernel's buffers take a part
    assert outcomes[-1] == "unread" and "sent" in outcomes
    assert not server.closed  # slow is not gone
    taken = outcomes.count("sent")
    assert len(receive(client, taken, other=server)) == taken  # everything that was "sent" arrives


def test_a_peer_that_closes_closes_the_link_with_the_reason(pair: tuple[Link, Link]) -> None:
    client, server = pair
    client.send(b"last")
    client.close()
    assert receive(server, 2) == [b"last"]
    assert server.closed and server.error == "closed by the peer"
    assert server.send(b"x") == "gone"


def test_a_frame_over_the_limit_closes_the_link(pair: tuple[Link, Link]) -> None:
    client, server = pair
    client.send(b"x" * ((1 << 25) + 1))
    assert receive(server, 1) == []
    assert server.closed and server.unframed and "over the limit" in server.error


def test_a_zeromq_peer_is_not_framed() -> None:
    """A node of an older version (ZeroMQ on the peer link) sends a ZMTP greeting: the link closes, naming it."""
    listener = Listener("tcp://127.0.0.1:*")
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(listener.endpoint)
    try:
        dealer.send(b"hello", zmq.NOBLOCK)
        links: list[Link] = []
        deadline = time.monotonic() + 5
        while not links and time.monotonic() < deadline:
            links = listener.accept(max_frame=4096, max_queued=8)
        assert links
        assert receive(links[0], 1) == []
        assert links[0].closed and "over the limit of 4,096" in links[0].error
        links[0].close()
    finally:
        dealer.close()
        ctx.term()
        listener.close()


def test_a_refused_connect_closes_the_link_with_the_reason() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once it closes
    errors = SendErrors("test", [])
    endpoint = f"tcp://127.0.0.1:{port}"
    link = Link.connect(endpoint, max_frame=100, max_queued=8, errors=errors)
    assert link.send(b"waits while connecting") in ("sent", "gone")
    deadline = time.monotonic() + 5
    while not link.closed and time.monotonic() < deadline:
        list(link.frames(1))
    assert link.closed and "ECONNREFUSED" in link.error
    assert errors.open_episodes() == {("peer-link", endpoint): "ECONNREFUSED"}  # logged once, counted
    link.close()
    bad = Link.connect("tcp://no-such-host.invalid:1", max_frame=100, max_queued=8)
    assert bad.closed and "cannot connect to tcp://no-such-host.invalid:1" in bad.error
    bad.close()


def test_a_busy_port_is_one_clear_error() -> None:
    listener = Listener("tcp://127.0.0.1:*")
    try:
        with pytest.raises(ConfigError, match=r"cannot listen on .*give a free port or \*"):
            Listener(listener.endpoint)
    finally:
        listener.close()


def test_a_link_set_polls_output_only_while_frames_wait_and_unregisters_before_closing(
    pair: tuple[Link, Link],
) -> None:
    client, server = pair
    polled: dict[Link, int] = {}
    links = LinkSet(polled.__setitem__, polled.pop)
    links.add(server)
    assert polled == {server: zmq.POLLIN}
    server.send(os.urandom(20_000_000))
    links.refresh()
    assert polled == {server: zmq.POLLIN | zmq.POLLOUT}
    receive(client, 1, other=server)
    links.refresh()
    assert polled == {server: zmq.POLLIN}
    assert links.drop(server) and not polled and not links.drop(server)
    with pytest.raises(OSError):
        os.fstat(server.fileno())  # closed once out of the poller


def test_a_listener_names_itself_by_address_so_that_connecting_looks_up_no_name() -> None:
    listener = Listener("tcp://localhost:*")
    try:
        host, port = tcp_address(listener.endpoint)
        assert ipaddress.ip_address(host).is_loopback and port > 0, listener.endpoint
    finally:
        listener.close()


def handshake(client: Link, server: Link) -> None:
    """Step both ends until both close (or 5 s): the client says something, the server reads, and closes its
    socket once its link failed (as its owner would)."""
    client.send(b"hello")
    deadline = time.monotonic() + 5
    while not (client.closed and server.closed) and time.monotonic() < deadline:
        list(server.frames(1))
        if server.closed:
            server.close()
        list(client.frames(1))
        client.flush()


def test_tls_refuses_a_peer_whose_certificate_another_ca_signed(certs: Certs, tmp_path: Path) -> None:
    other_ca = make_ca(tmp_path / "other")
    make_node(tmp_path / "rogue", other_ca, [])
    rogue = PeerTls.load(tmp_path / "rogue.crt", tmp_path / "rogue.key", other_ca[0])
    for client_tls, server_tls in (
        (rogue.client, certs.peer_tls("b").server),
        (certs.peer_tls("a").client, rogue.server),
    ):
        client, server = connected(client_tls, server_tls)
        handshake(client, server)
        assert client.closed and server.closed and client.untrusted and server.untrusted
        errors = client.error + server.error  # the first to verify refuses; the other hears its alert
        assert "the peer's certificate is not trusted" in errors and "ALERT_UNKNOWN_CA" in errors, errors
        client.close()
        server.close()


def test_tls_names_each_end_and_a_client_refuses_a_server_that_is_not_the_node_it_expects(certs: Certs) -> None:
    """A follower expects its leader's name in the leader's certificate: another node's key (of the same CA)
    does not pass for it. Both ends learn the other's names (the leader checks an ack's node against them)."""
    client, server = connected(certs.peer_tls("a").client, certs.peer_tls("b").server, expect_name="b")
    assert client.send(b"hello") == "sent" and receive(server, 1, other=client) == [b"hello"]
    assert client.peer_names is not None and "b" in client.peer_names and "a" not in client.peer_names
    assert server.peer_names is not None and "a" in server.peer_names
    client.close()
    server.close()
    client, server = connected(certs.peer_tls("a").client, certs.peer_tls("b").server, expect_name="c")
    handshake(client, server)
    assert client.closed and client.untrusted, client.error
    assert "not c's" in client.error and "b" in client.error and "--node name" in client.error, client.error
    client.close()
    server.close()


def test_tls_refuses_a_peer_without_a_certificate_and_a_plain_one(certs: Certs) -> None:
    keyless = ssl.create_default_context(cafile=certs.ca)
    keyless.check_hostname = False
    for client_tls in (keyless, None):
        client, server = connected(client_tls, certs.peer_tls("b").server)
        handshake(client, server)
        assert server.closed and server.untrusted and "TLS" in server.error, server.error
        assert client.closed  # told by an alert, or its frame unanswered and the connection closed
        client.close()
        server.close()


def test_a_tls_handshake_that_does_not_finish_closes_the_link_at_its_deadline(certs: Certs) -> None:
    client, server = connected(None, certs.peer_tls("b").server)  # the client sends nothing at all
    started = time.monotonic()
    while not server.closed and time.monotonic() - started < 5:
        list(server.frames(1))
        time.sleep(0.01)
    assert server.closed and "not done in" in server.error and not server.untrusted
    assert time.monotonic() - started >= HANDSHAKE_S * 0.9
    client.close()
    server.close()


def test_bad_tls_files_are_one_clear_error(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--peer-tls-cert .*/nope.crt: no such file: make one with `zeps keygen"):
        PeerTls.load(tmp_path / "nope.crt", certs.key("a"), certs.ca)
    with pytest.raises(
        ConfigError, match=r"--peer-tls-cert .*a.crt with --peer-tls-key .*b.key: not a PEM certificate and"
    ):
        PeerTls.load(certs.cert("a"), certs.key("b"), certs.ca)
    with pytest.raises(ConfigError, match=r"--peer-tls-ca .*a.key: not a PEM certificate"):
        PeerTls.load(certs.cert("a"), certs.key("a"), certs.key("a"))
    with pytest.raises(ConfigError, match=r"a.crt exists: certificates are never overwritten"):
        make_node(certs.dir / "a", (certs.ca, certs.dir / "ca.key"), [])


@pytest.mark.parametrize("tls", [False, True])
def test_a_connection_reset_as_it_is_made_closes_the_link(certs: Certs, tls: bool) -> None:
    """The peer's process dies just after its kernel accepted us (a killed leader, restarting): the reset is a
    closed link, not an exception in the owner's loop (with TLS, wrapping the socket reads it: seen in
    test_ha's TLS pair as a follower's gateway exiting with "Connection reset by peer")."""
    listener = socket.create_server(("127.0.0.1", 0))
    tls_ctx = certs.peer_tls("a").client if tls else None
    client = Link.connect(f"tcp://127.0.0.1:{listener.getsockname()[1]}", max_frame=100, max_queued=8, tls=tls_ctx)
    accepted, _ = listener.accept()
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    accepted.close()  # a reset
    listener.close()
    time.sleep(0.05)
    deadline = time.monotonic() + 5
    while not client.closed and time.monotonic() < deadline:
        list(client.frames(1))
        client.flush()
    assert client.closed and ("ECONNRESET" in client.error or "reset" in client.error), client.error
    client.close()
