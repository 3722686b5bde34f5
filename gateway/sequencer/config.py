"""What `zeps gateway` can be told: the CLI and the TOML config file fill the same fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gateway.discovery.announcer import Discovery
from gateway.errors import ConfigError
from gateway.journal import Durability, Retention
from gateway.mcast import Tuning
from gateway.transport.curve import CurveServerKeys
from gateway.transport.link import tcp_address
from gateway.transport.tls import PeerTls
from gateway.wire import protocol as P
from gateway.wire.streamkey import StreamKey

FRAME_SLACK = 1 << 20  # room for record headers and keys above --max-message-bytes in one ingest frame


@dataclass
class GatewayConfig:
    """Everything `zeps gateway` can be told; the CLI and the TOML config file fill the same fields."""

    streams: list[str]
    journal: Path
    ingest: str
    ingest_pub: str | None = None
    multicast: list[str] = field(
        default_factory=list
    )  # ENDPOINT (every stream) or STREAM=ENDPOINT (sequencer.channels)
    replay_endpoint: str = ""
    tuning: Tuning = field(default_factory=Tuning)
    heartbeat_ms: int = 100
    linger_ms: int = 2  # an upper bound only: a batch leaves once the ingest has nothing more queued
    batch_records: int = 1024
    batch_bytes: int = 60_000
    max_message_bytes: int = 1024 * 1024
    max_clients: int = 1024
    client_timeout: float = 60.0  # at the client limit, sessions silent this long make room for new ones
    journal_retry_ms: int = 1000  # while the journal's disk is full: refuse publishes this long between tries
    producer_expiry_s: float = 3600.0  # a producer silent this long is forgotten (its next batch is taken as new)
    max_producers: int = 100_000  # per stream; beyond it the least recently seen producer is forgotten
    producer_scan_bytes: int = 1 << 30  # on start, producer state is rebuilt from at most this much journal tail
    max_out_queue: int = 256
    durability: Durability = field(default_factory=Durability)
    retention: Retention = field(default_factory=Retention)
    segment_bytes: int = 64 * 1024 * 1024
    metrics: str | None = None
    stream_key: StreamKey | None = None  # signs every multicast message (gateway.transport.curve)
    curve: CurveServerKeys | None = None  # CURVE on the ingest sockets; None: plain TCP
    discovery: Discovery = field(default_factory=Discovery)  # announcements (discovery.announcer)
    etcd: tuple[str, ...] = ()  # etcd client URLs: the directory beyond one subnet (discovery.registrar); with node, HA
    node: str = ""  # with etcd: this gateway is this node of a replicated group (docs/ha.md); "": a single gateway
    min_insync: int = 0  # in-sync followers a batch needs before it is multicast and confirmed
    ha_lag_s: float = 1.0  # an in-sync follower silent or behind this long leaves the set
    ha_suspect_s: float = 0.3  # a leader that answers nothing this long is deposed by its followers
    peer_endpoint: str = ""  # a node's link for its followers' acks; "": the ingest's address, a free port
    peer_tls: PeerTls | None = None  # a node's TLS on the peer link (gateway.transport.tls); None: plain TCP
    mirror: list[str] = field(default_factory=list)  # streams mirrored from another site (docs/mirroring.md)

    def __post_init__(self) -> None:
        if not self.streams:
            raise ConfigError("name at least one stream (--stream NAME)")
        for name in self.streams:
            P.validate_stream_name(name)
        if self.node and not self.etcd:
            raise ConfigError(f"node {self.node!r} of a replicated group needs --etcd URL: its coordinator")
        if self.node and not self.replay_endpoint:
            raise ConfigError("a node (--node) needs --replay-endpoint: its followers copy its journal from there")
        for name in self.mirror:
            if name not in self.streams:
                raise ConfigError(f"--mirror {name}: not a stream of this gateway; add --stream {name}")
        if self.ingest_pub and len(self.streams) != 1:
            raise ConfigError("--ingest-pub carries no stream name: use it with exactly one --stream")
        if self.peer_endpoint:
            tcp_address(self.peer_endpoint)  # ConfigError naming it, before anything is bound
        if (
            min(self.max_message_bytes, self.max_clients, self.journal_retry_ms, self.max_producers) < 1
            or min(self.client_timeout, self.producer_expiry_s) <= 0
        ):
            raise ConfigError(
                "--max-message-bytes, --max-clients, --journal-retry-ms, --client-timeout, --producer-expiry-s and "
                "--max-producers must be > 0"
            )

    @property
    def max_frame_bytes(self) -> int:
        """The ingest's ZMQ_MAXMSGSIZE: ZeroMQ closes a connection that sends a larger frame without reading it
        (so no peer can make the gateway buffer unbounded frames). Smaller frames over the record limit are
        read and answered with INVALID naming the limit."""
        return self.max_message_bytes + FRAME_SLACK
