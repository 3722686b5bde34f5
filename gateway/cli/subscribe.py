"""`zeps subscribe`: the reconciling subscriber, printing records as they come."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from datetime import datetime
from typing import cast

from gateway.cli import discovery_opts, keyopts
from gateway.cli.options import (
    Parser,
    add_pgm_engine,
    duration,
    host_port,
    integer,
    mcast_endpoint,
    position,
    positive,
    say,
)
from gateway.cli.output import add_format, write_records
from gateway.client.start_point import StartPoint, ago

_FLUSH_S = 0.1  # a busy stream's output reaches a pipe at least this often
_COUNTERS = ("gaps_detected", "gaps_filled", "duplicates_dropped", "losses", "rejected_packets", "unauthenticated")


def register(commands: argparse._SubParsersAction) -> None:
    p: Parser = commands.add_parser(
        "subscribe",
        help="receive a stream gap-free: multicast merged with replay",
        description="Merges the multicast feed(s) with the replay sidecar by sequence number: late joiners catch "
        "up, lost packets are filled, duplicates dropped. Prints one record a line (--format) and, on exit, a "
        "summary on stderr. Records the journal no longer holds are reported on stderr, never skipped silently.",
    )
    multicast = p.add_argument(
        "--multicast",
        action="append",
        default=[],
        type=mcast_endpoint,
        help="multicast endpoint (repeat: A/B; default: found on --interface by the stream's name)",
    )
    p.from_env(multicast, "ZEPS_MULTICAST")
    keyopts.add_replay(
        p,
        required=False,
        many=True,
        help="replay sidecar, e.g. tcp://10.0.0.2:5580 (repeat: sidecars serving the stream, tried in turn; "
        "default: from heartbeats)",
    )
    keyopts.add_stream(p)
    p.add_argument("--topic", action="append", default=[], help="key prefix to deliver (repeatable; default all)")
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--from",
        dest="start",
        type=position(("earliest", "latest", "snapshot")),
        default=StartPoint(word="latest"),
        help="earliest | latest (default) | snapshot (the last record of every key, then what follows) | SEQ | "
        "-N (the last N records; needs --replay) | ISO-8601 time with a zone",
    )
    start.add_argument("--since", type=duration, help="start with the records of the last DURATION, e.g. 5m, 1h")
    p.add_argument("--count", type=positive, help="exit after this many records")
    p.add_argument("--timeout", type=duration, help="exit after this long without a record, e.g. 10s")
    p.add_argument(
        "--connect-timeout",
        type=duration,
        metavar="DURATION",
        help="exit 1 when the replay sidecar has not answered for this long, e.g. 10s (default: keep trying, so "
        "that start-up order does not matter; scripts want a bound)",
    )
    p.add_argument("--checkpoint", help="file keeping the last sequence handled; resume from it on restart")
    p.add_argument("--max-lag", type=positive, help="records behind the live feed before switching to replay")
    add_pgm_engine(p)
    p.add_argument(
        "--fill-udp",
        metavar="PORT",
        type=integer(0, 65535),
        help="the sidecar's fill port for udp:// gap fills by datagram (docs/protocol.md); default: the replay "
        "endpoint's port on udp:// feeds; 0: fill over TCP only",
    )
    p.add_argument("--summary-only", action="store_true", help="print no records, only the summary")
    add_format(p)
    p.add_argument("--metrics", type=host_port, help="serve Prometheus metrics (counters, lag, state) at HOST:PORT")
    stream_key = p.add_argument(
        "--stream-key",
        action="append",
        default=[],
        metavar="FILE",
        help="accept only multicast signed with this key (repeat while a key is rotated)",
    )
    p.from_env(stream_key, "ZEPS_STREAM_KEY")
    keyopts.add_client_options(p)
    discovery_opts.add_client_options(p)
    p.check(_sources)
    p.set_defaults(handler=_run)


def _sources(args: argparse.Namespace) -> str | None:
    if not args.multicast and not args.replay and not (args.interface or args.etcd or args.directory):
        return (
            "give --multicast, --replay or both (or set ZEPS_MULTICAST / ZEPS_REPLAY), "
            "or --interface IF, --etcd URL or --directory FILE to find the stream by its name"
        )
    if args.start is not None and args.start.back is not None and not args.replay:
        return f"--from -{args.start.back} asks the sidecar for the stream's head: give --replay"
    return None


def _start(args: argparse.Namespace) -> str | int | datetime:
    """--from/--since as the Subscriber's `start` (the same forms: gateway.client.start_point)."""
    pos: StartPoint = ago(args.since) if args.since is not None else args.start
    if pos.back is not None:
        return -pos.back
    if pos.time_ns is not None:
        return pos.when()
    return pos.word if pos.word is not None else cast(int, pos.seq)


def _run(args: argparse.Namespace) -> int:
    from gateway.client.metrics import SubscriberMetrics
    from gateway.client.subscriber import Subscriber
    from gateway.errors import DataLoss, ZepsError
    from gateway.mcast import Tuning
    from gateway.wire.streamkey import StreamKey

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    out = sys.stdout.buffer
    n = 0
    sources = {"live": 0, "replay": 0, "snapshot": 0}  # what this command handed on, by where it came from
    keys = [StreamKey.load(path) for path in args.stream_key]
    directory = discovery_opts.client_directory(args, keys) if not (args.multicast or args.replay) else None
    try:
        with Subscriber(
            args.stream,
            multicast=args.multicast,
            replay=args.replay,
            topics=args.topic,
            start=_start(args),
            checkpoint=args.checkpoint,
            max_lag=args.max_lag,
            stream_key=keys,
            curve=keyopts.client_curve(args),
            interface=args.interface,
            directory=directory,
            discovery_timeout=args.discovery_timeout,
            tuning=Tuning(libzmq_pgm=args.pgm_engine == "libzmq") if args.pgm_engine else None,
            fill_udp=args.fill_udp,
        ) as sub:
            metrics = SubscriberMetrics(sub) if args.metrics else None
            if metrics:
                metrics.serve(args.metrics)
            idle_since = flushed = time.monotonic()
            while not stop and (args.count is None or n < args.count):
                try:
                    rec = sub.next(timeout=0.2)
                except DataLoss as exc:
                    print(f"zeps subscribe: {exc}", file=sys.stderr)
                    continue
                except ZepsError as exc:  # final (an unknown stream, refused keys, ...): retrying would not help
                    out.flush()
                    print(f"zeps subscribe: {exc}", file=sys.stderr)
                    return 1
                if rec is None:
                    out.flush()  # idle: whatever was printed reaches a pipe now
                    waited = sub.waiting_for_replay
                    if args.connect_timeout is not None and waited is not None and waited > args.connect_timeout:
                        print(
                            f"zeps subscribe: no answer from the replay sidecar at {sub.replay_endpoint} for "
                            f"{waited:.1f} s: check --replay and that the sidecar runs (zeps replay)",
                            file=sys.stderr,
                        )
                        return 1
                    if args.timeout is not None and time.monotonic() - idle_since > args.timeout:
                        break
                    continue
                idle_since = time.monotonic()
                n += 1
                source = rec.source.partition(":")[0]
                sources[source] = sources.get(source, 0) + 1
                if not args.summary_only:
                    write_records((rec,), out, args.format)
                    if idle_since - flushed > _FLUSH_S:
                        out.flush()
                        flushed = idle_since
            out.flush()
            summary = sub.summary()
            if metrics:
                metrics.close()
    finally:
        if directory is not None:
            directory.close()
    # Counted here: the library's delivered/from_* count whole batches taken in, more than --count printed.
    counts = {"records": n, **{f"from_{k}": v for k, v in sources.items()}} | {k: summary[k] for k in _COUNTERS}
    say(args, "zeps subscribe: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return 0
