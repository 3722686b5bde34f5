"""udp://: plain UDP multicast, each datagram one multicast message: the MoldUDP64 model, with the replay
sidecar as its re-request server.

Why a third transport: PGM and NORM deliver in order, so one lost packet holds back everything behind it,
heartbeats included, until a NAK repairs it, and libzmq's PGM waits up to 50 ms before it even sends the NAK
(its timers are fixed in libzmq 4.3.4). Over udp:// every datagram reaches the subscriber as it arrives: a
gap shows with the very next datagram, and the reconciler fills it from the replay sidecar in about one
round trip (docs/benchmarks.md measures both). The price, as with MoldUDP64: no repair on the multicast
itself (each loss costs the subscriber that saw it a FETCH from the sidecar), and no congestion control,
so the sender paces itself at `rate_kbps` (a token bucket) and raises zmq.Again above it, like the others.

A datagram holds the frames of one message (stream, batch[, authenticator]) in the framing of
`gateway.wire.framing`. The gateway cuts each batch to fit `datagram_bytes` before it signs it
(`Batch.split`, `batch_room`), so every datagram stands alone; the default fits a 1,500-byte MTU unfragmented.
A single record too large for one datagram (65,507 bytes) is not multicast: it is counted, logged once, and
subscribers fetch it from replay like any lost datagram.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import struct
import time
from collections.abc import Sequence
from typing import cast

import zmq

from gateway.errors import UdpError
from gateway.transport.pollable import PolledByFd, again
from gateway.transport.token_bucket import TokenBucket
from gateway.wire.framing import MORE, encode_message, frame_header

log = logging.getLogger(__name__)

DATAGRAM_BYTES = 1472  # a 1,500-byte MTU less the IPv4 and UDP headers
MAX_DATAGRAM = 65_507


def batch_room(datagram_bytes: int, stream: bytes, auth_bytes: int = 0) -> int:
    """The largest batch that fits one datagram with the stream name (and an authenticator frame of
    `auth_bytes`, when the feed is signed) around it."""
    frames = [stream, b"\0" * 256] + ([b"\0" * auth_bytes] if auth_bytes else [])
    return datagram_bytes - (len(encode_message(frames)) - 256)


def decode_message(data: bytes) -> list[bytes | memoryview]:
    """The frames of one datagram: the first (the stream name) as bytes, the others as views of `data`."""
    view, pos, end, more = memoryview(data), 0, len(data), True
    frames: list[bytes | memoryview] = []
    while more:
        header = frame_header(data, pos, end)
        if header is None:
            raise UdpError(f"frame header cut off at byte {pos} of {end}")
        _, zflags, size, head = header
        pos += head
        if pos + size > end:
            raise UdpError(f"a frame of {size} bytes at byte {pos} overruns the {end}-byte datagram")
        frames.append(view[pos : pos + size])
        pos += size
        more = bool(zflags & MORE)
    if pos != end:
        raise UdpError(f"{end - pos} bytes after the last frame")
    frames[0] = bytes(frames[0])
    return frames


def join(interface: str, group: str, port: int, rcvbuf: int) -> socket.socket:
    """A non-blocking socket that receives `group:port` datagrams arriving on `interface`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # A/B feeds and many receivers on one host
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((group, port))  # the group's datagrams only, not every datagram to the port
    mreq = struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton(interface))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    sock.setblocking(False)
    return sock


class UdpSender:
    """Sends each message as one datagram to `group:port` from `interface`, paced at `rate_kbps`.

    The duck-typed subset of zmq.Socket the gateway uses: send_multipart (raising zmq.Again when over the
    rate or when the socket buffer is full: the message stays queued) and close.
    """

    def __init__(self, interface: str, group: str, port: int, *, rate_kbps: int, sndbuf: int, hops: int) -> None:
        if rate_kbps <= 0:
            raise UdpError("rate_kbps must be positive: udp:// paces itself at that rate")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, hops)
        self.sock.bind((interface, 0))
        self.sock.setblocking(False)
        self.dest = (group, port)
        rate = rate_kbps * 125.0  # bytes a second
        burst = max(MAX_DATAGRAM, rate * 0.002)  # 2 ms at the rate may go out at once
        self.bucket = TokenBucket.full(rate, burst, time.monotonic())
        self.too_large = 0  # messages over MAX_DATAGRAM, not sent (replay has them)

    def send_multipart(self, frames: Sequence[bytes | memoryview], flags: int = 0, copy: bool = True) -> None:
        del flags, copy
        if self.bucket.refill(time.monotonic()) < 0:
            raise again("udp:// is at its rate")
        data = encode_message(frames)
        try:
            self.sock.sendto(data, self.dest)
        except BlockingIOError:
            raise again("udp:// socket buffer full") from None
        except OSError as exc:
            if exc.errno != errno.EMSGSIZE:
                raise
            self.too_large += 1
            if self.too_large == 1:
                log.warning("udp %s:%d: a %d-byte message does not fit a datagram: not multicast (replay has it)",
                            *self.dest, len(data))  # fmt: skip
            return
        self.bucket.tokens -= len(data)

    def close(self, linger: int | None = None) -> None:
        del linger
        self.sock.close()


class UdpReceiver(PolledByFd):
    """Receives the datagrams sent to `group:port` on `interface` whose first frame starts with a subscription.

    Like a ZeroMQ SUB for the subscriber's loop: poll, recv_multipart (zmq.Again with NOBLOCK when nothing
    waits), close, and fileno for a zmq.Poller. A datagram that is not a well-formed message (junk, a rogue
    sender) raises UdpError from recv_multipart, for the caller to count and go on: the next call reads on.
    """

    def __init__(
        self, interface: str, group: str, port: int, *, rcvbuf: int, subscriptions: Sequence[bytes] = ()
    ) -> None:
        self.sock = join(interface, group, port, rcvbuf)
        self.subscriptions = tuple(subscriptions)
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)

    def fileno(self) -> int:
        return self.sock.fileno()

    def poll(self, timeout: int | None = None, flags: int = zmq.POLLIN) -> int:
        """zmq.POLLIN once a datagram waits (up to `timeout` ms; None waits for good), else 0."""
        del flags
        ready = select.select([self.sock], [], [], None if timeout is None else timeout / 1000)[0]
        return zmq.POLLIN if ready else 0

    def waiting(self) -> bool:
        """Whether a datagram waits: one poll(2), about a quarter of a NOBLOCK recv that finds none (its
        BlockingIOError, then zmq.Again), which a reader would otherwise pay after every burst."""
        return bool(self._poll.poll(0))

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[bytes | memoryview]:
        """The next subscribed message; zmq.Again with NOBLOCK when none waits."""
        del copy
        while True:
            if not flags & zmq.NOBLOCK:
                self.poll(None)
            try:
                data = self.sock.recv(MAX_DATAGRAM)
            except BlockingIOError:
                if flags & zmq.NOBLOCK:
                    raise again("no datagram waiting") from None
                continue
            frames = decode_message(data)
            if not self.subscriptions or cast(bytes, frames[0]).startswith(self.subscriptions):  # frame 0: bytes
                return frames

    def close(self, linger: int | None = None) -> None:
        del linger
        self.sock.close()

    def __enter__(self) -> UdpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
