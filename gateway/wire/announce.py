"""Discovery announcements: what a gateway or replay sidecar serves, sent about once a second (sans-IO codec).

Every gateway and every replay sidecar multicasts an announcement on a well-known discovery group and port
(`DISCOVERY_GROUP`:`DISCOVERY_PORT`, docs/discovery.md), the way Zyre's UDP beacons announce peers. Clients
listen there and learn, by stream name alone, the multicast channels to join, the sidecar to ask for replay,
and the ingest to publish to. Each announcement stands alone (the full state of its sender), so a lost one
costs nothing and a listener that joins late knows everything within one interval.

One announcement is one UDP datagram of at most MAX_BYTES (one Ethernet MTU: no IP fragments to lose), all
integers little-endian like the other multicast formats:

    header (30 bytes): magic b"ZD", version u8 (1; 2 with copies), role u8 (1 gateway, 2 sidecar),
        flags u8 (bit 0: leader), pad u8, node id u32 (random per process: a restart is a new node),
        epoch u64 (HA term; 0 without HA), sent at u64 (ns since the epoch, sender's wall clock),
        interval u16 (ms until the next one), body length u16
    body: node name str8, ingest str8, sidecar str8, stream count u8, then per stream:
        name str8, head u64 (last sequence journaled), rate u32 (records/s over the last interval),
        channel count u8, then per channel: transport u8 (0 epgm, 1 pgm, 2 norm, 3 udp), group 4 bytes,
        port u16; in version 2 only, after the channels: copy u8 (0 primary, 1 mirror, 2 promoted: what copy of
        the stream this gateway holds, docs/mirroring.md), source str8 (a mirror's source sidecar; may be empty)
    authenticator (24 bytes, only with a stream key): as on the multicast feeds (gateway.wire.streamkey), the
        tag computed over header and body under the pseudo stream name DOMAIN, which no stream can have.

Beyond one subnet the same announcements are kept in etcd (gateway.discovery.registrar, docs/discovery.md): one
entry per stream and node, at `etcd_key(stream, role, node_id)` under ETCD_PREFIX, its value the announcement of
that one stream, signed as on the LAN, bound to the node's lease.

Version 2 is sent only for streams that are not plain primaries, in datagrams of their own (`encode_all`), so a
listener that speaks version 1 alone still hears every primary stream and drops only the mirrored ones.

str8 is a length u8 then that many bytes of printable ASCII. Endpoints are what a peer on the LAN connects to
(tcp://ADDRESS:PORT); channels carry no interface, since each listener joins a group on its own interface.
A sender with more streams than fit one datagram sends several announcements (`encode_all`); listeners merge
what one node says. Anything that does not parse exactly raises McastError; with keys, anything not signed by
one of them raises Unauthenticated: the listener counts it and drops it.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass, replace

from gateway.errors import McastError, ProtocolError, Unauthenticated
from gateway.wire.protocol import validate_stream_name
from gateway.wire.streamkey import AUTH, AUTH_MAGIC, AUTH_VERSION, StreamKey, parse_auth

MAGIC = b"ZD"
VERSION = 1
VERSION_COPIES = 2  # streams with a copy and source (site mirroring)
# 239.192.0.0/14 is the IPv4 Organization Local Scope (RFC 2365): routers do not forward it out of the
# organisation. 239.192.0.0/24 is kept for the gateway's own infrastructure; .1 is discovery. The port is the
# one after the ZEPS ingest default (5570) and clear of Zyre's 5670.
DISCOVERY_GROUP = "239.192.0.1"
DISCOVERY_PORT = 5569
DISCOVERY_INTERVAL_MS = 1000
MAX_BYTES = 1472  # the UDP payload of one 1,500-byte Ethernet frame
ETCD_PREFIX = "/zeps/directory/"  # etcd: ETCD_PREFIX + STREAM + "/" + ROLE.NODEID (etcd_key)
DOMAIN = b"/zeps-discovery"  # signs announcements apart from every stream ('/' is never in a stream name)

# Transport codes on the wire (the multicast transports of gateway.mcast); append only.
TRANSPORTS = ("epgm", "pgm", "norm", "udp")
GATEWAY, SIDECAR = 1, 2
ROLES = {GATEWAY: "gateway", SIDECAR: "sidecar"}
FLAG_LEADER = 0x01
# What copy of a stream a gateway holds (docs/mirroring.md): the primary (its own sequencer), a mirror of another
# site's, or a former mirror promoted to primary. Codes on the wire are the index; append only.
COPIES = ("primary", "mirror", "promoted")
PRIMARY, MIRROR, PROMOTED = COPIES

_HEADER = struct.Struct("<2sBBBxIQQHH")
_STREAM = struct.Struct("<QI")
_CHANNEL = struct.Struct("<B4sH")


@dataclass(frozen=True, slots=True)
class Channel:
    """A multicast channel as announced: transport, group, port; `on(interface)` is the endpoint to join."""

    transport: str
    group: str
    port: int

    def on(self, interface: str) -> str:
        return f"{self.transport}://{interface};{self.group}:{self.port}"

    def __str__(self) -> str:
        return f"{self.transport}://{self.group}:{self.port}"


@dataclass(frozen=True, slots=True)
class StreamAd:
    """One stream as a node announces it."""

    name: str
    head: int = 0
    rate: int = 0
    channels: tuple[Channel, ...] = ()
    copy: str = PRIMARY  # one of COPIES
    source: str = ""  # a mirror's source sidecar, as its `zeps mirror` said (empty: not known here)

    @property
    def version(self) -> int:
        return VERSION if self.copy == PRIMARY and not self.source else VERSION_COPIES


@dataclass(frozen=True, slots=True)
class Announcement:
    """What one node (gateway or sidecar process) serves, as of `sent_ns`."""

    role: int
    node_id: int
    node: str
    streams: tuple[StreamAd, ...]
    ingest: str = ""
    sidecar: str = ""
    sent_ns: int = 0
    interval_ms: int = DISCOVERY_INTERVAL_MS
    epoch: int = 0
    leader: bool = False

    def encode(self, key: StreamKey | None = None) -> bytes:
        """The datagram; McastError if it does not fit MAX_BYTES (use `encode_all`) or a field is out of range."""
        body = bytearray()
        for text in (self.node, self.ingest, self.sidecar):
            _put_str(body, text)
        if len(self.streams) > 255:
            raise McastError(f"{len(self.streams)} streams in one announcement, at most 255: use encode_all")
        body.append(len(self.streams))
        version = max((ad.version for ad in self.streams), default=VERSION)
        for ad in self.streams:
            _put_str(body, ad.name)
            body += _STREAM.pack(ad.head, min(ad.rate, 0xFFFFFFFF))
            body.append(len(ad.channels))
            for ch in ad.channels:
                body += _CHANNEL.pack(TRANSPORTS.index(ch.transport), socket.inet_aton(ch.group), ch.port)
            if version == VERSION_COPIES:
                body.append(COPIES.index(ad.copy))
                _put_str(body, ad.source)
        flags = FLAG_LEADER if self.leader else 0
        header = _HEADER.pack(MAGIC, version, self.role, flags, self.node_id, self.epoch, self.sent_ns,
                              min(self.interval_ms, 0xFFFF), len(body))  # fmt: skip
        data = header + bytes(body)
        if key is not None:
            data += AUTH.pack(AUTH_MAGIC, AUTH_VERSION, key.id, key.tag(DOMAIN, data))
        if len(data) > MAX_BYTES:
            raise McastError(f"an announcement of {len(data)} bytes is over {MAX_BYTES}: use encode_all")
        return data

    def encode_all(self, key: StreamKey | None = None) -> list[bytes]:
        """The datagrams of this announcement, its streams spread over as many as it takes (at least one);
        version 2 streams (copies) in datagrams of their own."""
        out: list[bytes] = []
        batch: list[StreamAd] = []
        for ad in sorted(self.streams, key=lambda ad: ad.version):  # stable: version 1 first, in order
            if batch and batch[-1].version != ad.version:
                out.append(replace(self, streams=tuple(batch)).encode(key))
                batch = []
            try:
                replace(self, streams=(*batch, ad)).encode(key)
            except McastError:
                if not batch:
                    raise  # one stream alone does not fit: too many channels
                out.append(replace(self, streams=tuple(batch)).encode(key))
                batch = []
            batch.append(ad)
        out.append(replace(self, streams=tuple(batch)).encode(key))
        return out


def announceable(text: str) -> str:
    """`text` if an announcement can carry it (printable ASCII, at most 255 bytes), else "" (not known)."""
    return text if len(text) <= 255 and all(0x21 <= ord(c) <= 0x7E for c in text) else ""


def etcd_key(stream: str, role: int, node_id: int) -> str:
    """The etcd key of what node `node_id` (in `role`) says of `stream`: /zeps/directory/px/gateway.1a2b3c4d."""
    return f"{ETCD_PREFIX}{stream}/{ROLES[role]}.{node_id:08x}"


def decode(data: bytes | memoryview, keys: Iterable[StreamKey] = ()) -> Announcement:
    """The announcement in one datagram. With keys, it must be signed by one of them (else Unauthenticated);
    without, a signature is neither needed nor checked. Anything malformed raises McastError."""
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise McastError(f"an announcement of {len(data)} bytes is shorter than its {_HEADER.size}-byte header")
    magic, version, role, flags, node_id, epoch, sent_ns, interval_ms, body_len = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise McastError(f"not an announcement (magic {magic!r})")
    if version not in (VERSION, VERSION_COPIES):
        raise McastError(f"announcement version {version}, this side speaks {VERSION} and {VERSION_COPIES}: upgrade it")
    if role not in ROLES:
        raise McastError(f"announcement of unknown role {role}")
    end = _HEADER.size + body_len
    if len(data) not in (end, end + AUTH.size):
        raise McastError(f"announcement of {len(data)} bytes with a {body_len}-byte body")
    _check_signature(data[:end], data[end:], {k.id: k for k in keys})
    r = _Reader(data, _HEADER.size, end)
    node, ingest, sidecar = r.str8(), r.str8(), r.str8()
    streams = []
    for _ in range(r.u8()):
        name = r.str8()
        try:
            validate_stream_name(name)
        except ProtocolError as exc:
            raise McastError(f"announced stream: {exc.reason}") from None
        head, rate = r.unpack(_STREAM)
        channels = []
        for _ in range(r.u8()):
            transport, group, port = r.unpack(_CHANNEL)
            channels.append(_channel(transport, group, port))
        copy, source = PRIMARY, ""
        if version == VERSION_COPIES:
            code = r.u8()
            if code >= len(COPIES):
                raise McastError(f"announced stream {name}: unknown copy {code}")
            copy, source = COPIES[code], r.str8()
        streams.append(StreamAd(name, head, rate, tuple(channels), copy, source))
    if r.pos != end:
        raise McastError(f"{end - r.pos} bytes after the last announced stream")
    return Announcement(role, node_id, node, tuple(streams), ingest, sidecar, sent_ns, interval_ms, epoch,
                        bool(flags & FLAG_LEADER))  # fmt: skip


def _check_signature(signed: bytes, auth: bytes, keys: dict[int, StreamKey]) -> None:
    if not keys:
        return
    if not auth:
        raise Unauthenticated("unsigned", "an unsigned announcement (a rogue host, or a sender without the key)")
    key_id, tag = parse_auth(auth)
    key = keys.get(key_id)
    if key is None:
        raise Unauthenticated("unknown-key", f"an announcement signed with key {key_id:08x}, not one held here")
    if not hmac.compare_digest(key.tag(DOMAIN, signed), tag):
        raise Unauthenticated("bad-tag", f"an announcement whose tag does not match key {key_id:08x} (forged)")


def _channel(transport: int, group: bytes, port: int) -> Channel:
    if transport >= len(TRANSPORTS):
        raise McastError(f"announced channel of unknown transport {transport}")
    addr = ipaddress.IPv4Address(group)
    if not addr.is_multicast or port == 0:
        raise McastError(f"announced channel {addr}:{port} is not a multicast group and port")
    return Channel(TRANSPORTS[transport], str(addr), port)


def _put_str(out: bytearray, text: str) -> None:
    raw = text.encode("ascii", "replace")
    if len(raw) > 255 or not all(0x21 <= b <= 0x7E for b in raw):
        raise McastError(f"{text!r}: announced names and endpoints are printable ASCII of at most 255 bytes")
    out.append(len(raw))
    out += raw


class _Reader:
    """Reads the body, refusing to go past `end`."""

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data, self.pos, self.end = data, pos, end

    def take(self, n: int) -> bytes:
        if self.pos + n > self.end:
            raise McastError(f"announcement truncated at byte {self.pos} (needs {n} more)")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def u8(self) -> int:
        return self.take(1)[0]

    def unpack(self, fmt: struct.Struct) -> tuple:
        return fmt.unpack(self.take(fmt.size))

    def str8(self) -> str:
        raw = self.take(self.u8())
        if not all(0x21 <= b <= 0x7E for b in raw):
            raise McastError("announced names and endpoints must be printable ASCII")
        return raw.decode("ascii")
