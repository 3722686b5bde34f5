"""A framed TCP connection driven from its owner's loop, with no thread of its own: a group's peer link.

Why not ZeroMQ here: every ZeroMQ message crosses the sender's and the receiver's I/O threads besides the
kernel, and on a busy host each hand-off is one more scheduler wake-up. The peer link of a replicated group
(docs/ha.md) is on the path of every batch the group multicasts: the leader's push to its followers, and their
acks back. Measured on the 2-core test machine while the test suite ran beside it: a DEALER/ROUTER round trip
p50 48-147 us, p99 0.4-3.5 ms; the same over a plain TCP socket p50 13 us, p99 0.11-0.16 ms.

Frames are length-prefixed (gateway.wire.length_prefixed). Nothing blocks: `send` hands a frame to the kernel
at once; what the kernel does not take waits in a queue of at most `max_queued` frames (`wants_write`: the
owner then polls for POLLOUT and calls `flush`), and past that a frame is not sent ("unread"; the caller says
it again later, as it would to a ZeroMQ peer at its high-water mark). `frames` reads what has come. A link
that fails (refused, reset, closed, a frame over the limit) stays `closed`, with `error` saying why: its owner
drops it from its `LinkSet` (which unregisters it from the poller before closing its descriptor), or connects
again.

With `tls` (gateway.transport.tls), a link runs TLS over the same socket once it is connected: its handshake
is stepped by `frames` and `flush`, within a deadline, and frames wait in the queue meanwhile.

Threading contract: a Link and a Listener belong to the thread that polls them.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import ssl
from collections import deque
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import zmq

from gateway.errors import ConfigError, ProtocolError
from gateway.transport.pollable import PolledByFd
from gateway.transport.routing import Outcome
from gateway.transport.send_errors import SendErrors
from gateway.transport.tls import Handshake, failure, names
from gateway.wire.length_prefixed import HEADER_SIZE, Deframer, header

RECV_BYTES = 256 * 1024  # one recv: many acks, or a few batches
RECONNECTED = "the link closes; the follower connects again, and what it missed comes again"


def tcp_address(endpoint: str) -> tuple[str, int]:
    """(host, port) of `tcp://HOST:PORT`; `*` for either means any (0.0.0.0, a free port)."""
    parts = urlsplit(endpoint)
    netloc = parts.netloc
    host, sep, port = netloc.rpartition(":")
    if parts.scheme != "tcp" or not sep or not host or not (port == "*" or port.isdigit()):
        raise ConfigError(f"peer link endpoint {endpoint!r}: give tcp://HOST:PORT (PORT may be *)")
    host = host.strip("[]")
    return ("0.0.0.0" if host == "*" else host), (0 if port == "*" else int(port))


def _endpoint(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class Link(PolledByFd):
    """One framed connection; frames in of at most `max_frame` bytes, at most `max_queued` frames waiting out."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        max_frame: int,
        max_queued: int,
        connecting: bool = False,
        peer: str = "",
        errors: SendErrors | None = None,
        tls: ssl.SSLContext | None = None,
        expect_name: str | None = None,
    ) -> None:
        """`peer`: where the link goes, for the log; `errors`: where sends and connects it fails are reported;
        `tls`: run TLS over the connection (gateway.transport.tls), and with `expect_name` refuse a peer whose
        certificate does not carry that name."""
        sock.setblocking(False)
        self.peer, self.errors = peer, errors
        self._sock, self._fd = sock, sock.fileno()  # the fd is kept: a poller finds us by it, also once closed
        self._connecting = connecting
        self._in = Deframer(max_frame)
        self._out: deque[memoryview] = deque()  # frames the kernel has not taken (the first maybe in part)
        self.max_queued = max_queued
        self.closed = False
        self.error = ""  # why it closed
        self.hung_up = False  # the peer closed or reset the connection (its process exited, most likely)
        self.refused = False  # the connect was refused: nothing listens there
        self.unframed = False  # the peer sent what is not our framing (a length over the limit)
        self.untrusted = False  # TLS failed: the peer is not TLS, or its certificate is not of the group's CA
        self._tls, self._expect_name = tls, expect_name
        self._handshake: Handshake | None = None  # TLS: the handshake under way, from connected until done
        self.peer_names: frozenset[str] | None = None  # TLS: the names in the peer's certificate, once verified
        if not connecting:
            self._nodelay()
            self._secure(server_side=True)

    @classmethod
    def connect(
        cls,
        endpoint: str,
        *,
        max_frame: int,
        max_queued: int,
        errors: SendErrors | None = None,
        tls: ssl.SSLContext | None = None,
        expect_name: str | None = None,
    ) -> Link:
        """A link to `endpoint` (tcp://HOST:PORT), connecting in the background: frames sent meanwhile wait in
        its queue. One that cannot even start (no such host) comes back closed, with the reason. `expect_name`:
        with `tls`, the name the peer's certificate must carry."""
        try:
            host, port = tcp_address(endpoint)
            family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        except (ConfigError, OSError) as exc:
            sock = socket.socket()
            link = cls(sock, max_frame=max_frame, max_queued=max_queued, connecting=True, peer=endpoint, errors=errors)
            link._fail(f"cannot connect to {endpoint}: {exc}")
            return link
        sock = socket.socket(family, kind, proto)
        link = cls(sock, max_frame=max_frame, max_queued=max_queued, connecting=True, peer=endpoint, errors=errors,
                   tls=tls, expect_name=expect_name)  # fmt: skip
        code = sock.connect_ex(address)
        if code not in (0, errno.EINPROGRESS):
            link._connect_failed(code, f"cannot connect to {endpoint}")
        return link

    def fileno(self) -> int:
        return self._fd

    @property
    def connecting(self) -> bool:
        """Whether a background connect is still under way (no SYN-ACK yet, as of the last `frames` or `flush`)."""
        return self._connecting and not self.closed

    @property
    def wants_write(self) -> bool:
        """Whether the owner should poll for POLLOUT: connecting, or frames wait for the kernel."""
        handshake = self._handshake
        return not self.closed and (
            self._connecting or bool(self._out) or (handshake is not None and handshake.wants_write)
        )

    def send(self, frame: bytes) -> Outcome:
        """Hand `frame` to the kernel, or queue it: "sent"; "unread" (the queue is full: not sent); "gone"."""
        if self.closed:
            return "gone"
        if self._out or self._connecting or self._tls is not None:  # (an SSLSocket has no sendmsg)
            if len(self._out) >= self.max_queued:
                return "unread"
            self._out.append(memoryview(header(len(frame)) + frame))
            self.flush()
            return "gone" if self.closed else "sent"
        size = len(frame)
        try:
            sent = self._sock.sendmsg((header(size), frame))
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._send_failed(exc)
            return "gone"
        if self.errors:
            self.errors.sent("peer-link", self.peer)
        if sent < HEADER_SIZE + size:
            self._out.append(memoryview(header(size) + frame)[sent:])
        return "sent"

    def flush(self) -> None:
        """Send what waits, as far as the kernel takes it (call when the socket polls writable)."""
        if not self._ready():
            return
        out = self._out
        while out:
            try:
                sent = self._sock.send(out[0])  # TLS: all of it or nothing (then the same again)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return
            except OSError as exc:
                self._send_failed(exc)
                return
            if sent < len(out[0]):
                out[0] = out[0][sent:]
                return
            out.popleft()

    def frames(self, limit: int) -> Iterator[bytes]:
        """The whole frames that came, at most `limit` (never waits). A stream that cannot be framed, or that
        ends, closes the link."""
        given = 0
        while given < limit:
            try:
                frame = self._in.next()
            except ProtocolError as exc:
                self.unframed = True
                self._fail(str(exc))
                return
            if frame is None:
                if not self._ready():
                    return
                try:
                    data = self._sock.recv(RECV_BYTES)
                except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    return
                except ssl.SSLError as exc:  # TLS 1.3: a peer that refuses our certificate says so after its handshake
                    self.untrusted = True
                    self._fail(f"receive failed: {failure(exc)}")
                    return
                except OSError as exc:
                    self.hung_up = exc.errno == errno.ECONNRESET
                    self._fail(f"receive failed: {exc.strerror or exc}")
                    return
                if not data:
                    self.hung_up = True
                    self._fail("closed by the peer" + (" in the middle of a frame" if self._in.partial else ""))
                    return
                self._in.feed(data)
                continue
            given += 1
            yield frame

    def _ready(self) -> bool:
        """Whether the link carries frames now: connected, and its TLS handshake (if any) done."""
        if self.closed or (self._connecting and not self._connected()):
            return False
        handshake = self._handshake
        if handshake is None:
            return True
        try:
            done = handshake.step()
        except (OSError, TimeoutError) as exc:
            self.untrusted = not isinstance(exc, TimeoutError)
            self._fail(f"TLS handshake failed: {failure(exc)}")
            return False
        if done:
            self._handshake = None
            self.peer_names = names(handshake.sock)
            if self._expect_name is not None and self._expect_name not in self.peer_names:
                self.untrusted = True
                named = ", ".join(sorted(self.peer_names))
                self._fail(f"TLS: the peer's certificate is {named}'s, not {self._expect_name}'s: each node needs "
                           "the certificate made for its --node name")  # fmt: skip
                return False
        return done

    def _secure(self, *, server_side: bool) -> bool:
        """Start TLS on the connected socket, if the link has it (same descriptor, now wrapped): whether the link
        is still open (wrapping reads the socket: a connection reset meanwhile fails here)."""
        if self._tls is not None:
            try:
                self._handshake = Handshake(self._sock, self._tls, server_side=server_side)
            except OSError as exc:
                self.hung_up = exc.errno == errno.ECONNRESET
                self._fail(f"TLS handshake failed: {failure(exc)}")
                return False
            self._sock = self._handshake.sock
        return True

    def _connected(self) -> bool:
        """Whether a background connect has finished (and how: a failure closes the link)."""
        _, writable, _ = select.select([], [self._fd], [], 0)
        if not writable:
            return False
        code = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self._connect_failed(code, "connect failed")
            return False
        self._connecting = False
        self._nodelay()
        return self._secure(server_side=False)

    def _nodelay(self) -> None:
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a frame leaves at once, not with the next

    def _connect_failed(self, code: int, why: str) -> None:
        self.refused = code == errno.ECONNREFUSED
        self._fail(f"{why}: {errno.errorcode.get(code, code)}")
        if self.errors:
            self.errors.refused("peer-link", self.peer, OSError(code, os.strerror(code)), RECONNECTED)

    def _send_failed(self, exc: OSError) -> None:
        self._fail(f"send failed: {exc.strerror or exc}")
        if self.errors and exc.errno not in (errno.EPIPE, errno.ECONNRESET):  # those: the peer hung up, not the network
            self.errors.refused("peer-link", self.peer, exc, RECONNECTED)

    def _fail(self, why: str) -> None:
        """Closed for good; the descriptor stays open until `close`, so that no poller holds a stale one."""
        if not self.closed:
            self.closed, self.error = True, why
            self._out.clear()

    def close(self) -> None:
        self._fail("closed here")
        self._sock.close()


class Listener(PolledByFd):
    """A listening socket for links (`tcp://HOST:PORT`, PORT `*` for a free one); `endpoint` is where it is."""

    def __init__(self, endpoint: str, *, backlog: int = 64, errors: SendErrors | None = None) -> None:
        self.errors = errors  # where connections the network refused are reported
        host, port = tcp_address(endpoint)
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            raise ConfigError(f"peer link endpoint {endpoint}: {exc}; give an address of this host") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(backlog)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot listen on {endpoint} ({exc.strerror or exc}): give a free port or *") from None
        sock.setblocking(False)
        self._sock, self._fd = sock, sock.fileno()
        bound = sock.getsockname()  # numeric: a follower connecting to it looks up no name on its loop
        self.endpoint = _endpoint(bound[0], bound[1])

    def fileno(self) -> int:
        return self._fd

    def accept(self, *, max_frame: int, max_queued: int, tls: ssl.SSLContext | None = None) -> list[Link]:
        """The connections waiting, as links (never waits)."""
        links: list[Link] = []
        while True:
            try:
                sock, address = self._sock.accept()
            except BlockingIOError:
                return links
            except ConnectionAbortedError:
                continue  # that one gave up before we took it
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and self.errors:
                    # accept(2) passes on an error of the new connection (EPERM from a firewall, ENETUNREACH, ...):
                    # that one is gone, and its node connects again
                    self.errors.refused("peer-link", self.endpoint, exc, "that connection is dropped; it comes again")
                return links  # out of descriptors: the connection waits in the backlog; others: try at the next poll
            peer = f"tcp://{address[0]}"  # its port is new each time: one episode per host
            links.append(Link(sock, max_frame=max_frame, max_queued=max_queued, peer=peer, errors=self.errors, tls=tls))

    def close(self) -> None:
        self._sock.close()


class LinkSet:
    """Links kept registered in their owner's zmq.Poller for what each waits on: input always, and output while
    it connects or holds frames the kernel has not taken. `drop` unregisters a link before closing it."""

    def __init__(self, watch: Callable[[Link, int], None], unwatch: Callable[[Link], None]) -> None:
        self._watch, self._unwatch = watch, unwatch
        self._events: dict[Link, int] = {}  # each link, and the events it is registered for

    def add(self, link: Link) -> Link:
        self._events[link] = 0
        self._register(link)
        return link

    def refresh(self) -> None:
        """Register each link for what it waits on now (call before the owner polls)."""
        for link in self._events:
            self._register(link)

    def _register(self, link: Link) -> None:
        events = zmq.POLLIN | (zmq.POLLOUT if link.wants_write else 0)
        if self._events[link] != events:
            self._events[link] = events
            self._watch(link, events)

    def drop(self, link: Link) -> bool:
        """Unregister and close `link`: whether it was here (dropping it again changes nothing)."""
        here = self._events.pop(link, None) is not None
        if here:
            self._unwatch(link)
        link.close()
        return here

    def __iter__(self) -> Iterator[Link]:
        return iter(list(self._events))

    def __len__(self) -> int:
        return len(self._events)
