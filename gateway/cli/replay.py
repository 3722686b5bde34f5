"""`zeps replay`: the replay sidecar, serving the journal over ZEPS/TCP apart from the gateway."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import threading
import time
from pathlib import Path

from gateway.cli import config, discovery_opts, heap, keyopts, tls_opts
from gateway.cli.options import (
    Parser,
    byte_size,
    duration,
    host_port,
    integer,
    journal_root,
    number,
    positive,
    say,
    tcp_endpoint,
)

STILL_WAITING_S = (5.0, 30.0)  # a missing journal root: said at start (the sidecar), again after 5 s, every 30 s


def register(commands: argparse._SubParsersAction) -> None:
    p: Parser = commands.add_parser(
        "replay",
        help="serve the journal over ZEPS/TCP: history, gap fills, and the live tail for clients without multicast",
        description="Reads the journal files the gateway writes (it never writes them) and serves every stream "
        "under --journal to ZEPS clients: SUBSCRIBE from any sequence or time, then the live tail; FETCH ranges "
        "for gap fills; whole batches to clients that ask for them. Prints the bound endpoint on stdout. Options "
        "may also come from a TOML file (--config; keys as the long options); command-line options win.",
    )
    p.add_argument("--config", type=Path, help="TOML file with the same settings (keys as the long options)")
    p.add_argument("--journal", type=journal_root, help="the gateway's journal root (one directory per stream)")
    p.add_argument("--bind", type=tcp_endpoint, help="ZEPS endpoint, e.g. tcp://127.0.0.1:5571 (port 0: any free one)")
    p.add_argument("--metrics", type=host_port, help="serve Prometheus metrics at HOST:PORT")
    p.add_argument("--client-timeout", type=duration, help="drop clients silent this long (default 30s)")
    p.add_argument("--tail-poll-ms", type=number(0, 10_000, "ms", above=True), help="live-tail poll interval (5)")
    p.add_argument("--sndhwm", type=positive, help="frames queued per client before it counts as slow (256)")
    p.add_argument("--max-clients", type=positive, help="sessions at most (default 256)")
    p.add_argument("--max-fetches", type=positive, help="outstanding FETCHes per client (default 16)")
    p.add_argument(
        "--max-command-bytes", type=byte_size(1024), help="larger frames close the connection (default 64KiB)"
    )
    keyopts.add_server_options(p)
    p.add_argument(
        "--no-snapshots",
        dest="snapshots",
        action="store_false",
        default=None,
        help="keep no last-value index and refuse SNAPSHOT (saves memory per key; see docs/snapshots.md)",
    )
    discovery_opts.add_server_options(p, "default: none, do not announce")
    p.add_argument(
        "--stream-key", metavar="FILE", help="sign the announcements and fill datagrams with this key (zeps keygen)"
    )
    p.add_argument("--etcd", action="append", metavar="URL", help=discovery_opts.ETCD_SERVER_HELP)
    tls_opts.add_etcd_options(p)
    p.add_argument(
        "--fill-udp",
        metavar="PORT",
        type=integer(0, 65535),
        help="UDP port for fill datagrams (udp:// gap re-requests, docs/protocol.md); default: the --bind port, 0: off",
    )
    p.add_argument(
        "--no-datagram-tail",
        dest="datagram_tail",
        action="store_false",
        default=None,
        help="refuse TAIL-UDP (a site mirror's live tail as datagrams to its own address, docs/mirroring.md); "
        "never granted with CURVE",
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.errors import ConfigError
    from gateway.replay import ReplayConfig, ReplayServer
    from gateway.transport.etcd import Cluster
    from gateway.wire.streamkey import StreamKey

    if args.config is not None:
        config.merge(args, config.load(args.config, args.parser))
    missing = [f"--{k}" for k in ("journal", "bind") if not getattr(args, k)]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)}: give it on the command line or in the --config file")
    fields = {f.name for f in dataclasses.fields(ReplayConfig)}
    skip = ("curve", "announce", "stream_key", "etcd")  # built below from their own options
    given = {k: v for k, v in vars(args).items() if k in fields and v is not None and k not in skip}
    announce = discovery_opts.server_discovery(vars(args)) if args.announce_interface else None
    stream_key = StreamKey.load(args.stream_key) if args.stream_key else None
    server = ReplayServer(
        ReplayConfig(
            **given,
            curve=keyopts.server_curve(args),
            announce=announce,
            stream_key=stream_key,
            etcd=Cluster(discovery_opts.etcd_urls(args.etcd), tls_opts.etcd_tls(args)),
        )
    )
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    if args.verbosity >= 0:  # -q: nothing on stdout either
        print(f"zeps replay: serving {server.config.journal} at {server.endpoint}", flush=True)
    served = threading.Event()
    if not server.config.journal.is_dir():
        threading.Thread(target=_still_waiting, args=(args, server.config.journal, served), daemon=True).start()
    heap.settle()
    try:
        server.run()
    finally:
        served.set()
    return 0


def _still_waiting(args: argparse.Namespace, root: Path, served: threading.Event) -> None:
    """Until the journal root appears: say again what the sidecar waits for, with the time waited (a mistyped
    --journal looks like a sidecar with nothing to serve: clients are told to retry later meanwhile)."""
    began = time.monotonic()
    wait = STILL_WAITING_S[0]
    while not served.wait(wait) and not root.is_dir():
        say(args, f"zeps replay: still no journal at {root.absolute()} after {time.monotonic() - began:.0f} s: "
                  f"start the gateway with --journal {root}, or check the path")  # fmt: skip
        wait = STILL_WAITING_S[1]
