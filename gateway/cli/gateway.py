"""`zeps gateway`: run the broker (ingest -> sequence -> journal -> multicast)."""

from __future__ import annotations

import argparse
import signal
import tomllib
from pathlib import Path

from gateway.cli import keyopts


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "gateway",
        help="run the gateway: ingest, sequence, journal, multicast",
        description="Publishers attach over ZEPS (--ingest) or plain ZeroMQ PUB (--ingest-pub); every record is "
        "journaled before it is multicast. With no --multicast the gateway journals only (TCP-only deployments "
        "are served by the replay sidecar's live tail). Options may also come from a TOML file (--config); "
        "command-line options win.",
    )
    p.add_argument("--config", type=Path, help="TOML file with the same settings (keys as the long options)")
    p.add_argument("--stream", action="append", help="stream to serve (repeatable)")
    p.add_argument("--journal", type=Path, help="journal root directory")
    p.add_argument("--ingest", help="ZEPS endpoint for publishers, e.g. tcp://127.0.0.1:5570")
    p.add_argument("--ingest-pub", help="XSUB endpoint for plain ZeroMQ PUB publishers (frames: key, body)")
    p.add_argument("--multicast", action="append", help="epgm://, norm:// or udp:// endpoint (repeatable: A/B feeds)")
    p.add_argument("--replay-endpoint", help="replay sidecar endpoint advertised in heartbeats")
    p.add_argument("--rate-kbps", type=int, help="multicast rate: PGM ZMQ_RATE, NORM and UDP pacing (default 100000)")
    p.add_argument("--recovery-ivl-ms", type=int, help="PGM recovery interval (default 2000)")
    p.add_argument("--datagram-bytes", type=int, help="udp:// datagram size at most (default 1472: one MTU)")
    p.add_argument("--heartbeat-ms", type=int, help="heartbeat interval (default 100)")
    p.add_argument("--linger-ms", type=int, help="longest wait to fill a batch (default 2)")
    p.add_argument("--batch-records", type=int, help="records per batch at most (default 1024)")
    p.add_argument("--batch-bytes", type=int, help="bytes per batch at most (default 60000)")
    p.add_argument("--max-message-bytes", type=int, help="largest record body accepted (default 1 MiB)")
    p.add_argument("--max-clients", type=int, help="ZEPS publisher sessions at most (default 1024)")
    p.add_argument("--client-timeout", type=float, help="at the client limit, end sessions silent this long (60 s)")
    p.add_argument("--producer-expiry-s", type=float, help="forget a producer silent this long (default 3600)")
    p.add_argument("--max-producers", type=int, help="producers remembered per stream at most (default 100000)")
    p.add_argument("--journal-retry-ms", type=int, help="disk full: refuse publishes this long between tries (1000)")
    p.add_argument("--fsync", choices=("always", "group", "never"), help="journal durability (default group)")
    p.add_argument("--fsync-ms", type=int, help="group commit: fsync at least this often")
    p.add_argument("--retention-bytes", type=int, help="delete old segments beyond this many bytes per stream")
    p.add_argument("--retention-s", type=float, help="delete segments older than this many seconds")
    p.add_argument("--metrics", help="serve Prometheus metrics at HOST:PORT")
    p.add_argument("--stream-key", metavar="FILE", help="sign every multicast message with this key (zeps keygen)")
    keyopts.add_server_options(p)
    p.set_defaults(handler=_run)


def _settings(args: argparse.Namespace) -> dict:
    """Merge the TOML file and the command line (the command line wins) into one flat dict."""
    merged = tomllib.loads(args.config.read_text()) if args.config else {}
    merged = {k.replace("-", "_"): v for k, v in merged.items()}
    for key, value in vars(args).items():
        if value is not None and key not in ("config", "handler", "command", "verbose"):
            merged[key] = value
    return merged


def config_from(settings: dict):
    from gateway.journal import Durability, Retention
    from gateway.mcast import Tuning
    from gateway.server.gateway import GatewayConfig
    from gateway.transport.curve import server_keys
    from gateway.wire.streamkey import StreamKey

    missing = [k for k in ("stream", "journal", "ingest") if not settings.get(k)]
    if missing:
        raise SystemExit(f"zeps gateway: missing {', '.join('--' + m for m in missing)}")
    tuning = {k: settings[k] for k in ("rate_kbps", "recovery_ivl_ms", "datagram_bytes") if k in settings}
    durability = {"mode": settings["fsync"]} if "fsync" in settings else {}
    if "fsync_ms" in settings:
        durability["group_ms"] = settings["fsync_ms"]
    streams = settings["stream"]
    return GatewayConfig(
        streams=[streams] if isinstance(streams, str) else list(streams),
        journal=Path(settings["journal"]),
        ingest=settings["ingest"],
        ingest_pub=settings.get("ingest_pub"),
        multicast=list(settings.get("multicast", [])),
        replay_endpoint=settings.get("replay_endpoint", ""),
        tuning=Tuning(**tuning),
        durability=Durability(**durability),
        retention=Retention(max_bytes=settings.get("retention_bytes"), max_age_s=settings.get("retention_s")),
        metrics=settings.get("metrics"),
        stream_key=StreamKey.load(settings["stream_key"]) if settings.get("stream_key") else None,
        curve=server_keys(settings.get("curve_secret"), settings.get("curve_allow")),
        **{
            k: settings[k]
            for k in (
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
            )
            if k in settings
        },
    )


def _run(args: argparse.Namespace) -> int:
    from gateway.server.gateway import Gateway

    gateway = Gateway(config_from(_settings(args)))
    signal.signal(signal.SIGTERM, lambda *_: gateway.stop())
    signal.signal(signal.SIGINT, lambda *_: gateway.stop())
    gateway.run()
    return 0
