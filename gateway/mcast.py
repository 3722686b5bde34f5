"""Real-time multicast out and in: endpoints, socket tuning, the one way in to every multicast transport.

Every multicast message has two frames: the stream name, then a payload. The name comes first so that a SUB
can select streams by prefix on a shared group (ZeroMQ filters on the first frame; readers then check the
name exactly). The payload is either a record batch (`gateway.wire.batch`, magic b"ZB") or a heartbeat (magic
b"ZH") carrying the stream's head sequence and the replay endpoint, so a subscriber detects tail loss and
finds the replay sidecar from the multicast alone. A gateway with a stream key adds a third frame, the
authenticator of both (`gateway.wire.streamkey`).

With PGM and NORM the publisher cannot see subscriptions (ZeroMQ's PUB/SUB design): filtering happens at the
SUB side, and subscribers subscribe to whole streams so that they see every sequence (exact gap detection).

Traps measured on this platform (docs/gateway.md, docs/norm.md):
- OpenPGM resolves interface names through the resolver and fails inside namespaces: endpoints are built
  with the interface's IPv4 address (`resolve`).
- ZMQ_RATE (kbit/s) defaults to 100 and the PGM receive window derives from RATE and RECOVERY_IVL on the SUB
  side too: both are set on both sides.
- libzmq 4.3.4's norm:// engine cannot carry batches (a frame over 2,038 bytes hangs its sender for good,
  bursts stall it, a receiver aborts on loss): norm:// endpoints are served by `gateway.transport.norm`, which drives
  libnorm directly at a fixed rate with backpressure, on the same wire framing as libzmq.
- libzmq 4.3.4's epgm:// compiles OpenPGM's NAK timers in (first NAK up to 50 ms after a loss, repeats and
  repair waits of 200 ms): epgm:// and pgm:// endpoints are served by `gateway.transport.pgm`, which drives
  libpgm directly from native threads with timers for a LAN, on libzmq's wire (plain ZeroMQ SUBs read it).
  libzmq's own engine stays selectable (`Tuning.libzmq_pgm=True`, or ZEPS_PGM_ENGINE=libzmq; docs/pgm.md
  says when to choose it).
- PGM and NORM hold everything behind a lost packet until it is repaired; udp:// (`gateway.transport.udp`) hands each
  datagram over as it comes and leaves the repair to the replay sidecar: the low-latency choice under loss.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field, replace

import zmq

from gateway.errors import McastError
from gateway.transport.norm import NormReceiver, NormSender, NormSettings
from gateway.transport.pgm import PgmReceiver, PgmSender, PgmSettings
from gateway.transport.udp import DATAGRAM_BYTES, MAX_DATAGRAM, UdpReceiver, UdpSender

DEFAULT_PGM = PgmSettings()
TRANSPORTS = ("epgm", "pgm", "norm", "udp")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A multicast endpoint `TRANSPORT://INTERFACE;GROUP:PORT` with the interface as a name or an address.

    transport: epgm, pgm, norm or udp; interface: a name (eth1) or an IPv4 address (`resolve()` turns a name
    into its address); group: an IPv4 multicast address; port: 1..65535. Build it with `parse(text)`.
    """

    transport: str
    interface: str
    group: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        transport, sep, rest = text.partition("://")
        if not sep or transport not in TRANSPORTS:
            raise McastError(f"{text!r}: expected one of {', '.join(t + '://' for t in TRANSPORTS)}")
        interface, sep, target = rest.rpartition(";")
        if not sep or not interface:
            raise McastError(f"{text!r}: name the interface, e.g. {transport}://eth1;239.192.1.1:5555")
        group, _, port = target.rpartition(":")
        try:
            addr = ipaddress.IPv4Address(group)
            port_no = int(port)
        except ValueError as exc:
            raise McastError(f"{text!r}: expected GROUP:PORT with an IPv4 group, e.g. 239.192.1.1:5555") from exc
        if not addr.is_multicast:
            raise McastError(f"{text!r}: {group} is not a multicast address (224.0.0.0/4)")
        if not 0 < port_no < 65536:
            raise McastError(f"{text!r}: port {port_no} is outside 1..65535")
        return cls(transport, interface, group, port_no)

    def resolve(self) -> Endpoint:
        """The same endpoint with the interface given by its IPv4 address (in the current namespace)."""
        try:
            ipaddress.IPv4Address(self.interface)
            return self
        except ValueError:
            pass
        return Endpoint(self.transport, interface_address(self.interface), self.group, self.port)

    def __str__(self) -> str:
        return f"{self.transport}://{self.interface};{self.group}:{self.port}"


def address_of(interface: str) -> str:
    """`interface` if it is an IPv4 address, else the address of the interface by that name."""
    try:
        return str(ipaddress.IPv4Address(interface))
    except ValueError:
        return interface_address(interface)


def interface_address(name: str) -> str:
    """The first IPv4 address of interface `name` in the current network namespace."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        links = ipr.link_lookup(ifname=name)
        if not links:
            raise McastError(f"no interface named {name!r} in this network namespace")
        for msg in ipr.get_addr(family=socket.AF_INET, index=links[0]):
            return msg.get_attr("IFA_ADDRESS")
    raise McastError(f"interface {name!r} has no IPv4 address; give the endpoint an address instead")


PGM_ENGINE_ENV = "ZEPS_PGM_ENGINE"
PGM_ENGINES = ("libzmq", "openpgm")


def libzmq_pgm_default() -> bool:
    """gateway.transport.pgm unless ZEPS_PGM_ENGINE=libzmq selects libzmq's PGM engine (docs/pgm.md says when).

    The OpenPGM engine repairs loss in milliseconds, and its I/O loops run in native threads, so at full rate
    it costs what libzmq's does (docs/pgm.md, "Cost at full rate")."""
    engine = os.environ.get(PGM_ENGINE_ENV, "openpgm")
    if engine not in PGM_ENGINES:
        raise McastError(f"{PGM_ENGINE_ENV}={engine!r}: give one of {', '.join(PGM_ENGINES)}")
    return engine == "libzmq"


@dataclass(frozen=True, slots=True)
class Tuning:
    """Transport settings, configured once and applied as each transport needs.

    rate_kbps: PGM's ZMQ_RATE on both sides; NORM's fixed transmit rate (repairs included).
    recovery_ivl_ms: how long PGM senders keep data for NAK repair (also sizes the receive window).
    norm_buffer_bytes: the NORM sender's stream buffer: its repair window and the most a burst may queue
        (receivers size their buffer for that sender from it); at rate_kbps it drains in buffer*8/rate s.
    datagram_bytes: udp:// datagrams at most this large: batches are cut to fit (the default fits a 1,500-byte
        MTU; up to 65,507 lets the IP layer fragment, and then one lost fragment loses the datagram).
    pgm: the OpenPGM timers for epgm:// and pgm:// (rate, recovery interval, buffers and hops come from here).
    libzmq_pgm: serve epgm:// and pgm:// with libzmq's engine (its fixed timers) rather than gateway.transport.pgm
        (default: gateway.transport.pgm's, unless the environment says ZEPS_PGM_ENGINE=libzmq).
    sndbuf, rcvbuf: the sockets' kernel buffers in bytes (capped by net.core.wmem_max/rmem_max: `zeps doctor`).
    sndhwm: batches libzmq may queue per endpoint before a sender sees zmq.Again.
    linger_ms: how long a closing socket may still send what it holds.
    """

    rate_kbps: int = 100_000
    recovery_ivl_ms: int = 2_000
    sndbuf: int = 4 * 1024 * 1024
    rcvbuf: int = 4 * 1024 * 1024
    hops: int = 16
    sndhwm: int = 64  # messages (batches) libzmq may hold per endpoint before senders see zmq.Again
    linger_ms: int = 2_000
    norm_buffer_bytes: int = 8 * 1024 * 1024
    datagram_bytes: int = DATAGRAM_BYTES
    pgm: PgmSettings = DEFAULT_PGM
    libzmq_pgm: bool = field(default_factory=libzmq_pgm_default)

    def __post_init__(self) -> None:
        if not 256 <= self.datagram_bytes <= MAX_DATAGRAM:
            raise McastError(f"datagram_bytes {self.datagram_bytes}: give 256..{MAX_DATAGRAM} (1472 fits one MTU)")

    def apply(self, sock: zmq.Socket, endpoint: Endpoint) -> None:
        sock.setsockopt(zmq.LINGER, self.linger_ms)
        if endpoint.transport in ("epgm", "pgm"):
            sock.setsockopt(zmq.RATE, self.rate_kbps)
            sock.setsockopt(zmq.RECOVERY_IVL, self.recovery_ivl_ms)
            sock.setsockopt(zmq.MULTICAST_HOPS, self.hops)
            sock.setsockopt(zmq.SNDBUF, self.sndbuf)
            sock.setsockopt(zmq.RCVBUF, self.rcvbuf)

    def norm(self) -> NormSettings:
        """The NORM session settings these stand for (the rest are NormSettings' measured defaults)."""
        return NormSettings(
            rate_kbps=self.rate_kbps,
            buffer_bytes=self.norm_buffer_bytes,
            socket_buffer_bytes=max(self.sndbuf, self.rcvbuf),
            ttl=self.hops,
        )

    def pgm_settings(self) -> PgmSettings:
        """The OpenPGM settings these stand for: `pgm`'s timers with this Tuning's rate, buffers and hops."""
        return replace(self.pgm, rate_kbps=self.rate_kbps, recovery_ivl_ms=self.recovery_ivl_ms, sndbuf=self.sndbuf,
                       rcvbuf=self.rcvbuf, hops=self.hops)  # fmt: skip


class LibzmqSub(zmq.Socket):
    """libzmq's SUB (tuning.libzmq_pgm), with the other receivers' `waiting`."""

    def waiting(self) -> bool:
        """True: a NOBLOCK read says (zmq.Again); asking libzmq first (ZMQ_EVENTS) costs as much as that read."""
        return True


# What open_pub / open_sub return, whichever the transport: each offers the socket calls the callers use, and
# a receiver `waiting()`: False when no message waits, so that a reader's burst ends without a read that finds none.
McastSender = zmq.Socket | NormSender | UdpSender | PgmSender
McastReceiver = LibzmqSub | NormReceiver | UdpReceiver | PgmReceiver


def open_pub(ctx: zmq.Context, endpoint: Endpoint, tuning: Tuning) -> McastSender:
    """A sender on the multicast endpoint (interface resolved to its address).

    PGM: a `PgmSender` (OpenPGM at tuning.rate_kbps), which raises zmq.Again when tuning.sndhwm messages wait
    for its rate limiter; `ctx` is not used. With tuning.libzmq_pgm, an XPUB with XPUB_NODROP. A PUB drops
    silently at its high-water mark; this raises zmq.Again
    instead, so a sender that outruns the transport's rate keeps its data and slows down rather than losing it.
    NORM: a `NormSender` (libnorm at tuning.rate_kbps), which raises zmq.Again the same way when its stream
    is full; `ctx` is not used. UDP: a `UdpSender` paced at tuning.rate_kbps, which does the same.
    """
    resolved = endpoint.resolve()
    if endpoint.transport == "norm":
        return NormSender(resolved.interface, resolved.group, resolved.port, tuning.norm(), tuning.linger_ms)
    if endpoint.transport == "udp":
        return UdpSender(resolved.interface, resolved.group, resolved.port, rate_kbps=tuning.rate_kbps,
                         sndbuf=tuning.sndbuf, hops=tuning.hops)  # fmt: skip
    if not tuning.libzmq_pgm:
        return PgmSender(resolved.interface, resolved.group, resolved.port, tuning.pgm_settings(),
                         udp=endpoint.transport == "epgm", hwm=tuning.sndhwm, linger_ms=tuning.linger_ms)  # fmt: skip
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.XPUB_NODROP, 1)
    sock.setsockopt(zmq.SNDHWM, tuning.sndhwm)
    tuning.apply(sock, endpoint)
    sock.connect(str(resolved))
    return sock


def open_sub(ctx: zmq.Context, endpoint: Endpoint, tuning: Tuning, streams: list[str]) -> McastReceiver:
    """A receiver on the multicast endpoint, subscribed to whole streams (every sequence is seen).

    PGM: a `PgmReceiver` (a `LibzmqSub` with tuning.libzmq_pgm). NORM and UDP: a `NormReceiver` or
    `UdpReceiver`. All offer the same poll / waiting /
    recv_multipart / close (and a fileno for zmq.Poller); `ctx` is not used.
    """
    resolved = endpoint.resolve()
    names = [stream.encode() for stream in streams]
    if endpoint.transport == "norm":
        return NormReceiver(resolved.interface, resolved.group, resolved.port, tuning.norm(), names)
    if endpoint.transport == "udp":
        return UdpReceiver(resolved.interface, resolved.group, resolved.port, rcvbuf=tuning.rcvbuf, subscriptions=names)
    if not tuning.libzmq_pgm:
        return PgmReceiver(resolved.interface, resolved.group, resolved.port, tuning.pgm_settings(), names,
                           udp=endpoint.transport == "epgm")  # fmt: skip
    sock = ctx.socket(zmq.SUB, socket_class=LibzmqSub)
    tuning.apply(sock, endpoint)
    # No high-water mark on the pipe: libzmq 4.3.4's PGM receiver aborts the whole process when that pipe is full
    # and packets keep coming (pgm_receiver.cpp:131), which any host on the LAN can cause. Unread messages wait
    # in memory instead; the Subscriber's drain (client.feed_drain) keeps reading, and drops beyond its own bound.
    sock.setsockopt(zmq.RCVHWM, 0)
    for name in names:
        sock.setsockopt(zmq.SUBSCRIBE, name)
    sock.connect(str(resolved))
    return sock
