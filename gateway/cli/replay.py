"""`zeps replay`: the replay sidecar, serving the journal over ZEPS/TCP apart from the gateway."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from gateway.cli import discovery_opts, keyopts


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "replay",
        help="serve the journal over ZEPS/TCP: history, gap fills, and the live tail for clients without multicast",
        description="Reads the journal files the gateway writes (it never writes them) and serves every stream "
        "under --journal to ZEPS clients: SUBSCRIBE from any sequence or time, then the live tail; FETCH ranges "
        "for gap fills; whole batches to clients that ask for them. Prints the bound endpoint on stdout.",
    )
    p.add_argument("--journal", type=Path, required=True, help="the gateway's journal root (one directory per stream)")
    p.add_argument("--bind", required=True, help="ZEPS endpoint, e.g. tcp://127.0.0.1:5571 (port * or 0: any free one)")
    p.add_argument("--metrics", help="serve Prometheus metrics at HOST:PORT")
    p.add_argument(
        "--client-timeout", type=float, default=30.0, help="drop clients silent this many seconds (default 30)"
    )
    p.add_argument("--tail-poll-ms", type=float, default=5.0, help="live-tail poll interval (default 5)")
    p.add_argument("--sndhwm", type=int, default=256, help="frames queued per client before it counts as slow (256)")
    p.add_argument("--max-clients", type=int, default=256, help="sessions at most (default 256)")
    p.add_argument("--max-fetches", type=int, default=16, help="outstanding FETCHes per client (default 16)")
    p.add_argument(
        "--max-command-bytes", type=int, default=65_536, help="larger frames close the connection (default 65536)"
    )
    keyopts.add_server_options(p)
    p.add_argument(
        "--no-snapshots",
        dest="snapshots",
        action="store_false",
        help="keep no last-value index and refuse SNAPSHOT (saves memory per key; see docs/snapshots.md)",
    )
    discovery_opts.add_server_options(p, "default: none, do not announce")
    p.add_argument("--stream-key", metavar="FILE", help="sign the announcements with this key (zeps keygen)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    import zmq

    from gateway.replay import ReplayConfig, ReplayServer
    from gateway.wire.streamkey import StreamKey

    try:
        config = ReplayConfig(
            journal=args.journal,
            bind=args.bind,
            metrics=args.metrics,
            client_timeout=args.client_timeout,
            tail_poll_ms=args.tail_poll_ms,
            sndhwm=args.sndhwm,
            max_clients=args.max_clients,
            max_fetches=args.max_fetches,
            max_command_bytes=args.max_command_bytes,
            curve=keyopts.server_curve(args),
            snapshots=args.snapshots,
            announce=discovery_opts.server_discovery(vars(args)) if args.announce_interface else None,
            stream_key=StreamKey.load(args.stream_key) if args.stream_key else None,
        )
        server = ReplayServer(config)
    except (ValueError, OSError, zmq.ZMQError) as exc:
        print(f"zeps replay: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    print(f"zeps replay: serving {config.journal} at {server.endpoint}", flush=True)
    server.run()
    return 0
