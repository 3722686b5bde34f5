"""`zeps publish`: one message, stdin lines, or a generated load."""

from __future__ import annotations

import argparse
import sys

from gateway.cli import keyopts


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "publish",
        help="publish one message, stdin lines, or a generated load",
        description="With --body: one record. With --count: a generated load of --size-byte bodies over --keys "
        "keys at --rate records/s (0: as fast as the gateway takes them). Otherwise: one record per stdin line.",
    )
    p.add_argument("--ingest", required=True, help="gateway ZEPS endpoint, e.g. tcp://127.0.0.1:5570")
    p.add_argument("--stream", required=True)
    p.add_argument("--key", default="", help="routing key (single message and stdin modes)")
    p.add_argument("--body", help="publish this one message")
    p.add_argument("--count", type=int, help="generate this many records")
    p.add_argument("--size", type=int, default=100, help="generated body size in bytes (default 100)")
    p.add_argument("--rate", type=float, default=0.0, help="generated records per second (default: unpaced)")
    p.add_argument("--keys", type=int, default=1, help="generated keys key000.. (default 1)")
    p.add_argument("--confirm", action="store_true", help="wait until the gateway confirms all is journaled")
    keyopts.add_client_options(p)
    p.add_argument(
        "--ttl",
        type=float,
        help="seconds each record stays in snapshots (default: until replaced); an empty --body deletes the key",
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.client.publisher import Publisher
    from gateway.errors import BadRecord, PublishError
    from gateway.tools.load import generated

    if args.body is not None:
        records = iter([(args.key, args.body.encode())])
    elif args.count is not None:
        records = generated(args.count, args.size, args.keys, args.rate)
    else:
        records = ((args.key, line.rstrip(b"\n")) for line in sys.stdin.buffer)
    try:
        with Publisher(args.ingest, args.stream, confirm=args.confirm, curve=keyopts.client_curve(args)) as pub:
            n = 0
            for key, body in records:
                pub.publish(key, body, ttl=args.ttl)
                n += 1
            last = pub.flush()
    except BadRecord as exc:  # a record this command was given cannot be sent (--key too long, --ttl out of range)
        print(f"zeps publish: {exc.reason}", file=sys.stderr)
        return 2
    except PublishError as exc:
        print(f"zeps publish: {exc.reason}", file=sys.stderr)
        return 1
    print(f"published {n} records" + (f", last sequence {last}" if last is not None else ""), file=sys.stderr)
    return 0
