"""The sending side of discovery: a gateway or replay sidecar announces what it serves (gateway.wire.announce).

An `Announcer` belongs to its owner's event loop (no thread): the owner's timers call `announce(now, streams)`
once `now` reaches `due`, and wait no longer than `due`. Each announcement sends one announcement (a few
datagrams when many streams do not fit one) on every announcing interface, with TTL 1: announcements describe
one LAN and never cross a router (docs/discovery.md says what does). Sends never block: a full socket buffer or
an unreachable network skips this round, logged once; the next round comes an interval later. Intervals are
jittered by +-10% so that many senders on a LAN do not fall into step.

Endpoints are announced as peers must dial them: a wildcard host (`tcp://*:5570`, `tcp://0.0.0.0:5570`)
becomes the address of the interface it is announced on.
"""

from __future__ import annotations

import logging
import random
import re
import socket
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gateway.errors import ConfigError, McastError, ProtocolError
from gateway.mcast import Endpoint, address_of
from gateway.transport.send_errors import SendErrors
from gateway.wire import announce as A
from gateway.wire.protocol import validate_stream_name
from gateway.wire.streamkey import StreamKey

log = logging.getLogger(__name__)

_WILDCARD = re.compile(r"^(\w+://)(?:\*|0\.0\.0\.0)(:\d+)$")


@dataclass(frozen=True)
class Discovery:
    """Where and how often to announce. `interfaces` empty: a gateway announces on its channels' interfaces."""

    interfaces: tuple[str, ...] = ()
    group: str = A.DISCOVERY_GROUP
    port: int = A.DISCOVERY_PORT
    interval_ms: int = A.DISCOVERY_INTERVAL_MS  # 0: do not announce
    node: str = field(default_factory=socket.gethostname)

    def where(self) -> str:
        return f"{self.group}:{self.port}"


def parse_group(text: str) -> tuple[str, int]:
    """`GROUP:PORT` of a discovery channel, checked like a multicast endpoint's."""
    endpoint = Endpoint.parse(f"udp://any;{text}")
    return endpoint.group, endpoint.port


def advertised(endpoint: str, address: str) -> str:
    """`endpoint` as a peer reaches it through the interface with `address` (wildcard hosts replaced)."""
    match = _WILDCARD.match(endpoint)
    return f"{match[1]}{address}{match[2]}" if match else endpoint


class Announcer:
    """Sends `role` announcements of node `discovery.node` on each of `discovery.interfaces`, signed with `key`."""

    def __init__(
        self,
        discovery: Discovery,
        role: int,
        *,
        ingest: str = "",
        sidecar: str = "",
        key: StreamKey | None = None,
        errors: SendErrors | None = None,
    ) -> None:
        """`errors`: where announcements the network refuses are reported (else they are logged only)."""
        if not discovery.interfaces:
            raise ConfigError("announcing needs an interface: give --announce-interface NAME")
        self.discovery = discovery
        self.role = role
        self.node_id = random.getrandbits(32)
        self.ingest, self.sidecar, self.key = ingest, sidecar, key
        self.sent = 0  # datagrams
        self.failed = 0
        self.errors = errors or SendErrors(A.ROLES[role], ["announce"])
        self._socks: list[tuple[socket.socket, str]] = []
        try:
            for name in dict.fromkeys(discovery.interfaces):
                address = address_of(name)
                self._socks.append((_sender(address), address))
        except BaseException:
            self.close()
            raise
        self.due = 0.0  # monotonic time of the next announcement
        self._heads: dict[str, tuple[int, float]] = {}  # per stream: head and when, at the last announcement
        via = ",".join(address for _, address in self._socks)
        log.info("announcing %s %s (%08x) on %s via %s every %d ms", A.ROLES[role], discovery.node, self.node_id,
                 discovery.where(), via, discovery.interval_ms)  # fmt: skip

    def announce(self, now: float, streams: list[A.StreamAd], *, epoch: int = 0, leader: bool = False) -> None:
        """Announce `streams` (their rates filled in here) on every interface, with the node's standing in its
        group (docs/ha.md; 0 and False for a single gateway); the next is due an interval on."""
        self.due = now + self.discovery.interval_ms / 1000 * random.uniform(0.9, 1.1)
        rated = [_rated(ad, self._heads.get(ad.name), now) for ad in streams]
        self._heads = {ad.name: (ad.head, now) for ad in streams}
        for sock, address in self._socks:
            ann = A.Announcement(
                self.role,
                self.node_id,
                self.discovery.node,
                tuple(rated),
                advertised(self.ingest, address),
                advertised(self.sidecar, address),
                time.time_ns(),
                self.discovery.interval_ms,
                epoch,
                leader,
            )
            where = f"{self.discovery.group}:{self.discovery.port} via {address}"
            try:
                for datagram in ann.encode_all(self.key):
                    sock.sendto(datagram, (self.discovery.group, self.discovery.port))
                    self.sent += 1
            except OSError as exc:
                self.failed += 1
                self.errors.refused("announce", where, exc, "sent again next interval")
            except McastError as exc:
                self.failed += 1
                level = logging.WARNING if self.failed == 1 else logging.DEBUG
                log.log(level, "announcement via %s not sent (%s); trying again next interval", address, exc)
            else:
                self.errors.sent("announce", where)

    def close(self) -> None:
        for sock, _ in self._socks:
            sock.close()
        self._socks.clear()


def _rated(ad: A.StreamAd, before: tuple[int, float] | None, now: float) -> A.StreamAd:
    if before is None or now <= before[1] or ad.head < before[0]:
        return ad
    return replace(ad, rate=round((ad.head - before[0]) / (now - before[1])))


def _sender(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(address))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)  # this LAN only
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)  # listeners on this host hear it too
    sock.bind((address, 0))
    sock.setblocking(False)
    return sock


def gateway_streams(
    heads: dict[str, int],
    outputs: list[tuple[Endpoint, Collection[str]]],
    copies: Mapping[str, tuple[str, str]] | None = None,
) -> list[A.StreamAd]:
    """A gateway's streams as announced: each with its head, the channels (group, port) that carry it and, from
    `copies`, what copy it holds and a mirror's source (a stream not in `copies` is a primary)."""
    copies = copies or {}
    return [
        A.StreamAd(
            name,
            head,
            0,
            tuple(A.Channel(ep.transport, ep.group, ep.port) for ep, on in outputs if name in on),
            *copies.get(name, (A.PRIMARY, "")),
        )
        for name, head in heads.items()
    ]


def journal_streams(root: Path) -> list[A.StreamAd]:
    """A sidecar's streams as announced: every stream directory under the journal root (none before it exists)."""
    if not root.is_dir():
        return []
    return [A.StreamAd(p.name) for p in sorted(root.iterdir()) if p.is_dir() and _is_stream(p.name)]


def _is_stream(name: str) -> bool:
    try:
        validate_stream_name(name)
    except ProtocolError:
        return False
    return True


def gateway_announcer(
    discovery: Discovery,
    outputs: list[Endpoint],
    *,
    ingest: str,
    sidecar: str,
    key: StreamKey | None,
    errors: SendErrors | None = None,
) -> Announcer | None:
    """The gateway's announcer: on the interfaces given, else on its channels' interfaces; None when it has
    neither (a journal-only gateway stays quiet unless told where to announce) or announcing is off."""
    interfaces = discovery.interfaces or tuple(endpoint.interface for endpoint in outputs)
    if not interfaces or not discovery.interval_ms:
        return None
    return Announcer(replace(discovery, interfaces=interfaces), A.GATEWAY, ingest=ingest, sidecar=sidecar, key=key,
                     errors=errors)  # fmt: skip
