"""Where a stream is served, by its name alone: the directory clients resolve streams with.

`Directory` is what a client asks: a stream's channels, sidecar and ingest (`StreamInfo`). `LanDirectory` is
the one kept from the announcements heard on this LAN's discovery group (gateway.wire.announce); beyond one
subnet (routed networks, hosts in different Docker networks), `EtcdDirectory` (gateway.client.etcd_directory)
reads the same announcements from etcd, and `FileDirectory` (gateway.client.file_directory) a static file.

`Table` is the LAN directory's sans-IO core. Its rules:
- Every announcement (one datagram) refreshes what its node (node id and role) says of the streams in it; a
  stream a node has said nothing of for EXPIRE_INTERVALS of that node's intervals is forgotten, so a node that
  stops (or moves) drops out within about three seconds.
- An announcement older than the newest one heard from the same node is dropped (a stale or replayed one).
- A stream's sidecars are those announcing themselves, newest node first (the one heard of last: a sidecar
  restarted elsewhere is preferred at once over the old address, still remembered until it expires). The
  sidecar a gateway names (its --replay-endpoint, a static setting) is the fallback when none announces, so a
  moved sidecar is followed without restarting the gateway.
- Each gateway says what copy of the stream it holds (`Holder`, docs/mirroring.md): the primary, a mirror (of
  the source sidecar its `zeps mirror` reads) or a promoted former mirror. A mirror refuses publishers, so the
  ingests of mirrors are listed after every other: a directory shared by two sites resolves publishers to the
  stream's authoritative copy.
- Channels, ingest, head and rate come from gateway announcements. Of a replicated group's nodes (docs/ha.md)
  the leader of the highest epoch is listed first (its ingest is `ingest`, and the sidecar it names, if one
  announces itself, is `sidecar`), then former leaders not yet expired, then followers: a publisher goes to
  the leader, a subscriber to the sidecar that serves the leader's journal, and both have the others to try.

`LanDirectory` is the IO shell, driven by its user's thread: `drain()` reads what has arrived without waiting
(a Subscriber polls `fileno()` with its other sockets); `wait()` blocks at most until the caller's deadline.
With stream keys, only announcements signed by one of them are taken: the rest (a rogue host redirecting
clients, junk on the port) are counted in `dropped` by kind and never raise.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.errors import ConfigError, DiscoveryError, McastError, Unauthenticated
from gateway.mcast import address_of
from gateway.transport.pollable import PolledByFd
from gateway.transport.udp import join
from gateway.wire import announce as A
from gateway.wire.streamkey import StreamKey

log = logging.getLogger(__name__)

EXPIRE_INTERVALS = 3
RCVBUF = 1 << 20
# Datagrams one drain reads at most: a flood on the discovery group (junk or replays) cannot hold the caller's
# loop; the socket stays readable, so its next poll comes back for the rest.
DRAIN_MAX = 1024


@dataclass(frozen=True, slots=True)
class Holder:
    """A gateway holding a copy of a stream: `node`'s name, `copy` (one of gateway.wire.announce.COPIES) and, for
    a mirror (or a promoted one, until its gateway restarts), the source sidecar its mirror reads."""

    node: str
    copy: str = A.PRIMARY
    source: str = ""


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """One stream as the directory knows it, merged from every node that announces it.

    name: the stream; channels: its multicast channels; sidecars, named: replay endpoints (announced by the
    sidecars, named by gateways); ingests: publishing endpoints; nodes: who announces it; head: the last
    sequence announced; rate: records/s announced; epoch: the HA term (0 without HA); holders: the gateways
    announcing it and what copy each holds, in the order of `ingests`.
    """

    name: str
    channels: tuple[A.Channel, ...] = ()
    sidecars: tuple[str, ...] = ()  # announced by the sidecars themselves, the preferred one first
    named: tuple[str, ...] = ()  # the sidecars gateways name (their --replay-endpoint): the fallback
    ingests: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()  # "role name" of each node announcing it
    head: int = 0
    rate: int = 0
    epoch: int = 0  # HA: the highest term announced (0 without HA)
    holders: tuple[Holder, ...] = ()

    @property
    def authoritative(self) -> tuple[Holder, ...]:
        """The gateways holding the stream's authoritative copy here (primary or promoted): none when only
        mirrors are listed (the authoritative copy is then at their source)."""
        return tuple(h for h in self.holders if h.copy != A.MIRROR)

    @property
    def sidecar(self) -> str | None:
        """The sidecar to ask for replay: the preferred one announcing itself, else one a gateway names."""
        return next(iter(self.sidecars or self.named), None)

    @property
    def ingest(self) -> str | None:
        return self.ingests[0] if self.ingests else None


class Directory(Protocol):
    """What clients resolve streams with (the LAN's announcements, etcd, a static file).

    Threading: a directory is driven by one thread, its user's (a Subscriber's application thread, a Publisher's
    IO thread); whatever it runs in the background of its own stays behind `fileno()`."""

    where: str  # where it looks, for messages
    dropped: dict[str, int]  # announcements refused, by kind (malformed, unsigned, bad-tag, unknown-key, ...)

    def lookup(self, stream: str) -> StreamInfo | None:
        """What is known of `stream` now (no waiting), or None."""

    def wait(self, stream: str, deadline: float, need: Callable[[StreamInfo], bool]) -> StreamInfo:
        """`stream` once `need` holds for it; DiscoveryError at the monotonic `deadline`."""

    def streams(self) -> list[StreamInfo]:
        """Every stream known now, by name."""

    def drain(self) -> None:
        """Take in what has arrived, without waiting."""

    def fileno(self) -> int:
        """Readable when `drain` has something to take in (for the caller's poller; the object compares equal to
        it, as zmq.Poller reports it by its fd: gateway.transport.pollable)."""

    def listen(self, seconds: float) -> list[StreamInfo]:
        """Every stream known within `seconds` (for listing: it waits the whole time only where it must)."""

    def close(self) -> None: ...


def merged(stream: str, said: Sequence[tuple[A.Announcement, A.StreamAd]]) -> StreamInfo:
    """`stream` as every node says it (newest node first): the rules of the module docstring."""
    gateways = [(ann, ad) for ann, ad in said if ann.role == A.GATEWAY]
    # A primary's or promoted copy's gateways first, a group's leader first (stable: newest next); mirrors last.
    gateways.sort(key=lambda s: (s[1].copy == A.MIRROR, not s[0].leader, -s[0].epoch))
    leaders = {ann.sidecar for ann, _ in gateways[:1] if ann.leader}  # the sidecar on the leader's journal
    sidecars = [ann.sidecar for ann, _ in said if ann.role == A.SIDECAR and ann.sidecar]
    sidecars.sort(key=lambda endpoint: endpoint not in leaders)
    return StreamInfo(
        stream,
        channels=tuple(dict.fromkeys(ch for _, ad in gateways for ch in ad.channels)),
        sidecars=tuple(dict.fromkeys(sidecars)),
        named=tuple(dict.fromkeys(ann.sidecar for ann, _ in gateways if ann.sidecar)),
        ingests=tuple(dict.fromkeys(ann.ingest for ann, _ in gateways if ann.ingest)),
        nodes=tuple(dict.fromkeys(f"{A.ROLES[ann.role]} {ann.node}" for ann, _ in said)),
        head=max((ad.head for _, ad in gateways), default=0),
        rate=max((ad.rate for _, ad in gateways), default=0),
        epoch=max(ann.epoch for ann, _ in said),
        holders=tuple(dict.fromkeys(Holder(ann.node, ad.copy, ad.source) for ann, ad in gateways)),
    )


@dataclass
class _Said:
    """What one node said of one stream, and until when it holds."""

    ann: A.Announcement
    ad: A.StreamAd
    expires: float


@dataclass
class Table:
    """The LAN directory's state (sans-IO); see the module docstring for its rules."""

    said: dict[tuple[int, int, str], _Said] = field(default_factory=dict)  # (node id, role, stream)
    newest: dict[tuple[int, int], int] = field(default_factory=dict)  # node -> newest sent_ns heard
    first_heard: dict[tuple[int, int], float] = field(default_factory=dict)

    def heard(self, ann: A.Announcement, now: float) -> bool:
        """Take in an announcement; False if it was older than one already heard from its node (dropped)."""
        node = (ann.node_id, ann.role)
        if ann.sent_ns < self.newest.get(node, 0):
            return False
        self.newest[node] = ann.sent_ns
        self.first_heard.setdefault(node, now)
        expires = now + EXPIRE_INTERVALS * max(ann.interval_ms, 1) / 1000
        for ad in ann.streams:
            self.said[(ann.node_id, ann.role, ad.name)] = _Said(ann, ad, expires)
        return True

    def expire(self, now: float) -> None:
        self.said = {k: s for k, s in self.said.items() if s.expires > now}
        alive = {(node_id, role) for node_id, role, _ in self.said}
        self.newest = {n: t for n, t in self.newest.items() if n in alive}
        self.first_heard = {n: t for n, t in self.first_heard.items() if n in alive}

    def lookup(self, stream: str, now: float) -> StreamInfo | None:
        self.expire(now)
        said = [s for (_, _, name), s in self.said.items() if name == stream]
        if not said:
            return None
        said.sort(key=lambda s: self.first_heard[(s.ann.node_id, s.ann.role)], reverse=True)  # newest node first
        return merged(stream, [(s.ann, s.ad) for s in said])

    def streams(self, now: float) -> list[StreamInfo]:
        self.expire(now)
        names = sorted({name for _, _, name in self.said})
        return [info for name in names if (info := self.lookup(name, now)) is not None]


class LanDirectory(PolledByFd):
    """The directory kept from the announcements on `interface`'s LAN; see the module docstring.

    group, port: where announcements are sent (the default discovery group); keys: the stream keys whose
    signatures are accepted.
    """

    def __init__(
        self,
        interface: str,
        *,
        group: str = A.DISCOVERY_GROUP,
        port: int = A.DISCOVERY_PORT,
        keys: Iterable[StreamKey] = (),
    ) -> None:
        self.where = f"{group}:{port} on {interface}"
        self.keys = list(keys)
        self.table = Table()
        self.dropped: dict[str, int] = {}  # by kind: malformed, unsigned, bad-tag, unknown-key, stale
        self.sock = join(address_of(interface), group, port, RCVBUF)

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> None:
        now = time.monotonic()
        for _ in range(DRAIN_MAX):
            try:
                data = self.sock.recv(A.MAX_BYTES + 1)
            except BlockingIOError:
                return
            try:
                ann = A.decode(data, self.keys)
            except McastError as exc:
                self._drop(exc.kind if isinstance(exc, Unauthenticated) else "malformed", str(exc))
                continue
            if not self.table.heard(ann, now):
                self._drop("stale", f"an announcement of {ann.node} older than one heard before")

    def _drop(self, kind: str, what: str) -> None:
        count_drop(self.dropped, self.where, kind, what)

    def lookup(self, stream: str) -> StreamInfo | None:
        self.drain()
        return self.table.lookup(stream, time.monotonic())

    def streams(self) -> list[StreamInfo]:
        self.drain()
        return self.table.streams(time.monotonic())

    def wait(self, stream: str, deadline: float, need: Callable[[StreamInfo], bool]) -> StreamInfo:
        return wait_until(self, stream, deadline, need, self._missing)

    def _missing(self, stream: str) -> str:
        heard = ", ".join(i.name for i in self.table.streams(time.monotonic())) or "nothing"
        signed = " signed with the stream key given" if self.keys else ""
        return (
            f"stream {stream!r} was not announced{signed} on {self.where} in time (heard: {heard}): is its "
            "gateway up and announcing on this LAN? Or give its endpoints (--multicast, --replay, --ingest)"
        )

    def listen(self, seconds: float) -> list[StreamInfo]:
        """Every stream announced within `seconds` (announcements come about once a second)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            select.select([self.sock], [], [], left)
            self.drain()
        return self.streams()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> LanDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(
    directory: Directory,
    stream: str,
    deadline: float,
    need: Callable[[StreamInfo], bool],
    missing: Callable[[str], str],
) -> StreamInfo:
    """What `directory` says of `stream` once `need` holds of it, waiting on its fileno() until `deadline`
    (time.monotonic()); DiscoveryError(missing(stream)) then."""
    while True:
        info = directory.lookup(stream)
        if info is not None and need(info):
            return info
        left = deadline - time.monotonic()
        if left <= 0:
            raise DiscoveryError(missing(stream))
        select.select([directory.fileno()], [], [], left)


def count_drop(dropped: dict[str, int], where: str, kind: str, what: str) -> None:
    """Count an announcement refused; the first of each kind is a warning, the rest are counted."""
    dropped[kind] = dropped.get(kind, 0) + 1
    level = logging.WARNING if dropped[kind] == 1 else logging.DEBUG
    log.log(level, "discovery %s: dropped %s; further ones are counted", where, what)


def resolve_feeds(
    stream: str,
    interface: str | None,
    directory: Directory | None,
    keys: Sequence[StreamKey],
    timeout: float,
) -> tuple[Directory, list[str]]:
    """For a Subscriber given no endpoints: the directory (`directory`, or the LAN's on `interface`) and the
    multicast endpoints of `stream` on `interface` (none without one: replay only), found within `timeout`."""
    own = directory is None
    if directory is None:
        if interface is None:
            raise ConfigError(
                f"stream {stream!r}: give multicast=[...] (its feeds), replay='tcp://HOST:PORT' (a sidecar) or both, "
                "or interface='IF' or directory=... to find the stream by its announcements"
            )
        directory = LanDirectory(interface, keys=keys)
    live = interface is not None
    try:
        info = directory.wait(stream, time.monotonic() + timeout, lambda i: bool(i.channels if live else i.sidecar))
    except BaseException:
        if own:
            directory.close()
        raise
    multicast = [ch.on(interface) for ch in info.channels] if interface is not None else []
    log.info("%s resolved: channels %s, sidecar %s", stream, ", ".join(multicast) or "none", info.sidecar or "not yet")
    return directory, multicast


def resolve_ingest(
    stream: str, interface: str | None, directory: Directory | None, keys: Sequence[StreamKey], timeout: float
) -> tuple[Directory, str]:
    """For a Publisher given no endpoint: the directory (`directory`, or the LAN's on `interface`) and the ingest
    of `stream` found in it within `timeout`."""
    own = directory is None
    if directory is None:
        if interface is None:
            raise ValueError("give the gateway's ingest endpoint, or --interface to find it by its announcements")
        directory = LanDirectory(interface, keys=keys)
    try:
        info = directory.wait(stream, time.monotonic() + timeout, lambda i: i.ingest is not None)
    except BaseException:
        if own:
            directory.close()
        raise
    assert info.ingest is not None
    return directory, info.ingest
