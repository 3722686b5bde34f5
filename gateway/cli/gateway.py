"""`zeps gateway`: run the broker (ingest -> sequence -> journal -> multicast)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cli import config, discovery_opts, heap, keyopts, tls_opts
from gateway.cli.options import (
    Parser,
    add_pgm_engine,
    byte_size,
    duration,
    host_port,
    journal_root,
    mcast_channel,
    nonnegative,
    positive,
    say,
    stream_name,
    tcp_endpoint,
)

if TYPE_CHECKING:
    from gateway.sequencer.config import GatewayConfig

_MAX_BATCH = 64 << 20  # gateway.wire.batch.MAX_BATCH (not imported: `zeps --help` stays light)


def register(commands: argparse._SubParsersAction) -> None:
    p: Parser = commands.add_parser(
        "gateway",
        help="run the gateway: ingest, sequence, journal, multicast",
        description="Publishers attach over ZEPS (--ingest) or plain ZeroMQ PUB (--ingest-pub); every record is "
        "journaled before it is multicast. With no --multicast the gateway journals only (TCP-only deployments "
        "are served by the replay sidecar's live tail). Options may also come from a TOML file (--config; keys "
        "as the long options, e.g. max_message_bytes = '4MiB'); command-line options win. Sizes take units "
        "(64KiB, 1MiB), times too (250ms, 30s, 7d).",
    )
    p.add_argument("--config", type=Path, help="TOML file with the same settings (keys as the long options)")
    p.add_argument("--stream", action="append", type=stream_name, help="stream to serve (repeatable)")
    p.add_argument("--journal", type=journal_root, help="journal root directory")
    p.add_argument(
        "--mirror",
        action="append",
        type=stream_name,
        metavar="STREAM",
        help="serve STREAM (one of --stream) as a mirror of another site's: written by `zeps mirror` only, with the "
        "source's sequences; publishers refused until `zeps mirror promote` (repeatable; docs/mirroring.md)",
    )
    p.add_argument("--ingest", type=tcp_endpoint, help="ZEPS endpoint for publishers, e.g. tcp://127.0.0.1:5570")
    p.add_argument("--ingest-pub", type=tcp_endpoint, help="XSUB endpoint for plain ZeroMQ PUB publishers")
    p.add_argument(
        "--multicast",
        action="append",
        type=mcast_channel,
        metavar="[STREAM=]ENDPOINT",
        help="epgm://, norm:// or udp:// endpoint carrying every stream, or STREAM=ENDPOINT carrying that stream "
        "only (repeatable: A/B feeds, a channel per stream)",
    )
    discovery_opts.add_server_options(p, "default: the interfaces of the --multicast channels")
    p.add_argument("--replay-endpoint", type=tcp_endpoint, help="replay sidecar endpoint advertised in heartbeats")
    p.add_argument("--rate-kbps", type=positive, help="multicast rate: PGM ZMQ_RATE, NORM and UDP pacing (100000)")
    p.add_argument("--recovery-ivl-ms", type=positive, help="PGM recovery interval in ms (default 2000)")
    p.add_argument("--datagram-bytes", type=byte_size(256, 65507), help="udp:// datagram size at most (1472: one MTU)")
    add_pgm_engine(p)
    p.add_argument("--heartbeat-ms", type=positive, help="heartbeat interval in ms (default 100)")
    p.add_argument(
        "--linger-ms", type=nonnegative, help="most a batch waits while publishes keep coming, ms (default 2)"
    )
    p.add_argument("--batch-records", type=positive, help="records per batch at most (default 1024)")
    p.add_argument("--batch-bytes", type=byte_size(1024, _MAX_BATCH), help="bytes per batch at most (default 60000)")
    p.add_argument(
        "--max-message-bytes", type=byte_size(1, _MAX_BATCH // 2), help="largest record body accepted (default 1MiB)"
    )
    p.add_argument("--max-clients", type=positive, help="ZEPS publisher sessions at most (default 1024)")
    p.add_argument("--client-timeout", type=duration, help="at the client limit, end sessions silent this long (60s)")
    p.add_argument("--producer-expiry-s", type=duration, help="forget a producer silent this long (default 1h)")
    p.add_argument("--max-producers", type=positive, help="producers remembered per stream at most (default 100000)")
    p.add_argument("--journal-retry-ms", type=positive, help="disk full: refuse publishes this long between tries")
    p.add_argument("--fsync", choices=("always", "group", "never"), help="journal durability (default group)")
    p.add_argument("--fsync-ms", type=positive, help="group commit: fsync at least this often, in ms")
    p.add_argument("--retention-bytes", type=byte_size(1), help="delete old segments beyond this size per stream")
    p.add_argument("--retention-s", type=duration, help="delete segments older than this, e.g. 86400, 7d")
    p.add_argument("--metrics", type=host_port, help="serve Prometheus metrics at HOST:PORT")
    p.add_argument("--stream-key", metavar="FILE", help="sign every multicast message with this key (zeps keygen)")
    p.add_argument(
        "--accept-corrupt-tail",
        action="store_true",
        default=None,
        help="start even if a stream's last batch is corrupt, discarding it (default: refuse, see zeps journal repair)",
    )
    p.add_argument(
        "--etcd",
        action="append",
        metavar="URL",
        help="etcd client URL, e.g. http://10.0.0.9:2379 (repeatable or comma-separated: one cluster): register in "
        "the directory kept there (docs/discovery.md); with --node NAME also be node NAME of a replicated group "
        "(docs/ha.md)",
    )
    p.add_argument("--min-insync", type=nonnegative, help="in-sync followers a batch needs before it is confirmed (0)")
    p.add_argument(
        "--suspect-ms",
        type=positive,
        help="a group node: depose a leader whose peer link answers nothing this long, in ms (default 300; docs/ha.md)",
    )
    p.add_argument(
        "--peer-endpoint",
        metavar="ENDPOINT",
        help="a group node: where its followers' acks and pings reach it, named to them in etcd (default: the "
        "ingest's address on a free port; docs/ha.md)",
    )
    keyopts.add_server_options(p)
    p.add_argument(
        "--curve-key",
        metavar="FILE",
        help="a group node whose sidecars require CURVE: this node's client NAME.key_secret (in the other nodes' "
        "sidecars' --curve-allow), with which it copies its leader's journal (docs/ha.md)",
    )
    p.add_argument(
        "--curve-server",
        metavar="FILE",
        help="with --curve-key: the group's sidecars' public NAME.key (one key pair for all of them, as clients "
        "given every sidecar trust one server key)",
    )
    tls_opts.add_gateway_options(p)
    p.set_defaults(handler=_run)


def configure(args: argparse.Namespace) -> GatewayConfig:
    """The command line, completed by the --config file, as a GatewayConfig. ConfigError for anything wrong."""
    from gateway.errors import ConfigError

    if args.config is not None:
        config.merge(args, config.load(args.config, args.parser))
    missing = [f"--{k}" for k in ("stream", "journal", "ingest") if not getattr(args, k)]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)}: give it on the command line or in the --config file")
    if (args.curve_key or args.curve_server) and not (args.etcd and args.node):
        raise ConfigError(
            "--curve-key and --curve-server are a group node's (with --etcd and --node): its follower copies the "
            "leader's journal with them; a single gateway's CURVE is --curve-secret and --curve-allow"
        )
    tls_opts.check_gateway_options(args)
    return _gateway_config(args)


# Settings handed to GatewayConfig as they are, when given (its own defaults otherwise).
_PASSED_ON = (
    "heartbeat_ms",
    "linger_ms",
    "batch_records",
    "batch_bytes",
    "max_message_bytes",
    "max_clients",
    "client_timeout",
    "journal_retry_ms",
    "producer_expiry_s",
    "max_producers",
    "min_insync",
    "peer_endpoint",
)


def _gateway_config(args: argparse.Namespace) -> GatewayConfig:
    from gateway.journal import Durability, Retention
    from gateway.mcast import Tuning
    from gateway.sequencer.config import GatewayConfig
    from gateway.transport.etcd import Cluster
    from gateway.wire.streamkey import StreamKey

    given = {k: v for k, v in vars(args).items() if v is not None}
    tuning: dict[str, Any] = {k: given[k] for k in ("rate_kbps", "recovery_ivl_ms", "datagram_bytes") if k in given}
    if "pgm_engine" in given:
        tuning["libzmq_pgm"] = given["pgm_engine"] == "libzmq"
    durability = {"mode": given["fsync"]} if "fsync" in given else {}
    if "fsync_ms" in given:
        durability["group_ms"] = given["fsync_ms"]
    discovery = discovery_opts.server_discovery(given)
    return GatewayConfig(
        streams=list(args.stream),
        journal=Path(args.journal),
        ingest=args.ingest,
        ingest_pub=args.ingest_pub,
        multicast=list(args.multicast or []),
        replay_endpoint=args.replay_endpoint or "",
        tuning=Tuning(**tuning),
        durability=Durability(**durability),
        retention=Retention(max_bytes=args.retention_bytes, max_age_s=args.retention_s),
        metrics=args.metrics,
        stream_key=StreamKey.load(args.stream_key) if args.stream_key else None,
        curve=keyopts.server_curve(args),
        discovery=discovery,
        etcd=Cluster(discovery_opts.etcd_urls(given.get("etcd")), tls_opts.etcd_tls(args)),
        peer_tls=tls_opts.peer_tls(args),
        node=args.node if args.etcd and args.node else "",
        mirror=list(args.mirror or []),  # --etcd and --node: a node of a group (docs/ha.md)
        **({"ha_suspect_s": given["suspect_ms"] / 1000} if "suspect_ms" in given else {}),
        **{k: given[k] for k in _PASSED_ON if k in given},
    )


def check_tails(cfg: GatewayConfig) -> None:
    """Refuse a stream whose last segment ends in a corrupt batch (not a torn write, which recovery cuts)."""
    from gateway.errors import JournalError
    from gateway.journal import tail_fault

    for stream in cfg.streams:
        fault = tail_fault(cfg.journal, stream)
        if fault is not None:
            raise JournalError(
                f"stream {stream!r}: {fault.describe()}; starting would discard it. See and cut it with "
                f"`zeps journal repair {cfg.journal}`, or start with --accept-corrupt-tail"
            )


def _run(args: argparse.Namespace) -> int:
    import zmq

    from gateway.client.endpoints import FIRST_CONNECT_TIMEOUT_MS
    from gateway.client.replay_client import DEFAULT_FEATURES, ReplayClient
    from gateway.sequencer.gateway import Gateway
    from gateway.wire import protocol as P

    cfg = configure(args)
    if not args.accept_corrupt_tail:
        check_tails(cfg)
    replica = (*DEFAULT_FEATURES, P.FEATURE_UNCOMMITTED)  # a follower copies its leader's uncommitted records too
    curve = keyopts.client_curve(args)  # to the leader's sidecar, when the group's sidecars require CURVE
    # A connect to the leader's sidecar with no answer is made again after a client's first connect timeout
    # (libzmq reconnects), not at the kernel's 1 s SYN retry: the follower's ATTACH there has 0.5 s, and
    # commits wait for its copy.
    gateway = Gateway(
        cfg,
        replay=lambda endpoint, stream, timeout, ctx: ReplayClient(
            endpoint,
            stream,
            timeout=timeout,
            ctx=ctx,
            features=replica,
            curve=curve,
            connect_timeout_ms=FIRST_CONNECT_TIMEOUT_MS,
        ),
    )
    signal.signal(signal.SIGTERM, lambda *_: gateway.stop())
    signal.signal(signal.SIGINT, lambda *_: gateway.stop())
    ingest = gateway.router.getsockopt_string(zmq.LAST_ENDPOINT)  # the port bound, if it was 0
    parts = [
        f"listening on {ingest}" + (f", plain PUB at {cfg.ingest_pub}" if cfg.ingest_pub else ""),
        f"streams {', '.join(cfg.streams)}",
        f"journal {cfg.journal}",
        f"multicast {', '.join(cfg.multicast) or 'none (journal only)'}",
        *([f"metrics http://{cfg.metrics}/metrics"] if cfg.metrics else []),
    ]
    say(args, "zeps gateway: " + "; ".join(parts))
    heap.settle()
    gateway.run()
    return 0
