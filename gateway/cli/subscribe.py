"""`zeps subscribe`: the reconciling subscriber, printing records as JSON lines."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from gateway.cli import keyopts
from gateway.cli.history import write_records


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "subscribe",
        help="receive a stream gap-free: multicast merged with replay, as JSON lines",
        description="Merges the multicast feed(s) with the replay sidecar by sequence number: late joiners catch "
        "up, lost packets are filled, duplicates dropped. Prints one JSON object per record and, on exit, a "
        "summary on stderr. Records the journal no longer holds are reported on stderr, never skipped silently.",
    )
    p.add_argument("--multicast", action="append", default=[], help="epgm:// or norm:// endpoint (repeat: A/B)")
    p.add_argument("--replay", help="replay sidecar, e.g. tcp://10.0.0.2:5580 (default: learnt from heartbeats)")
    p.add_argument("--stream", required=True)
    p.add_argument("--topic", action="append", default=[], help="key prefix to deliver (repeatable; default all)")
    p.add_argument(
        "--from",
        dest="start",
        default="latest",
        help="earliest | latest | snapshot (the last record of every key, then what follows) | SEQ | ISO-8601 time",
    )
    p.add_argument("--count", type=int, help="exit after this many records")
    p.add_argument("--timeout", type=float, help="exit after this many seconds without a record")
    p.add_argument("--checkpoint", help="file keeping the last sequence handled; resume from it on restart")
    p.add_argument("--max-lag", type=int, help="records behind the live feed before switching to replay")
    p.add_argument("--quiet", action="store_true", help="print no records, only the summary")
    p.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics (counters, lag, state) here")
    p.add_argument(
        "--stream-key",
        action="append",
        default=[],
        metavar="FILE",
        help="accept only multicast signed with this key (repeat while a key is rotated)",
    )
    keyopts.add_client_options(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.client.metrics import SubscriberMetrics
    from gateway.client.subscriber import Subscriber
    from gateway.errors import DataLoss, ZepsError
    from gateway.wire.streamkey import StreamKey

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    out = sys.stdout
    n = 0
    lost = 0
    try:  # the constructor does no network I/O: what it raises is about the arguments (exit 2)
        sub = Subscriber(
            args.stream,
            multicast=args.multicast,
            replay=args.replay,
            topics=args.topic,
            start=args.start,
            checkpoint=args.checkpoint,
            max_lag=args.max_lag,
            stream_key=[StreamKey.load(path) for path in args.stream_key],
            curve=keyopts.client_curve(args),
        )
    except ValueError as exc:
        print(f"zeps subscribe: {exc}", file=sys.stderr)
        return 2
    with sub:
        metrics = SubscriberMetrics(sub) if args.metrics else None
        if metrics:
            metrics.serve(args.metrics)
        idle_since = time.monotonic()
        while not stop and (args.count is None or n < args.count):
            try:
                rec = sub.next(timeout=0.2)
            except DataLoss as exc:
                lost += exc.hi - exc.lo + 1
                print(f"zeps subscribe: {exc}", file=sys.stderr)
                continue
            except ZepsError as exc:  # final (an unknown stream, refused keys, ...): retrying would not help
                out.flush()
                print(f"zeps subscribe: {exc}", file=sys.stderr)
                return 1
            if rec is None:
                if args.timeout is not None and time.monotonic() - idle_since > args.timeout:
                    break
                continue
            idle_since = time.monotonic()
            n += 1
            if not args.quiet:
                write_records((rec,), out)
        out.flush()
        summary = sub.summary()
        if metrics:
            metrics.close()
    print("zeps subscribe: " + ", ".join(f"{k}={v}" for k, v in summary.items()), file=sys.stderr)
    return 0
