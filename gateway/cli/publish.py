"""`zeps publish`: one message, stdin lines, or a generated load."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from gateway.cli import discovery_opts, keyopts
from gateway.cli.options import Parser, byte_size, duration, number, positive, say, tcp_endpoint

_LOAD_ONLY = ("size", "keys", "rate")  # options that shape a generated load (--count)
_MiB = 1 << 20
MAX_SIZE = 64 * _MiB - 2 * 65536  # a record must fit one batch (gateway.wire.batch.MAX_BATCH) with its key


def register(commands: argparse._SubParsersAction) -> None:
    p: Parser = commands.add_parser(
        "publish",
        help="publish one message, stdin lines, or a generated load",
        description="With --body: one record. With --count: a generated load of --size-byte bodies over --keys "
        "keys at --rate records/s (default: as fast as the gateway takes them). Otherwise: one record per stdin "
        "line.",
    )
    p.from_env(
        p.add_argument(
            "--ingest",
            action="append",
            default=[],
            type=tcp_endpoint,
            help="gateway endpoint, e.g. tcp://127.0.0.1:5570 (repeat: the nodes of a replicated gateway, tried "
            "in turn; default: found by name)",
        ),
        "ZEPS_INGEST",
    )
    discovery_opts.add_client_options(p)
    p.add_argument("--stream-key", metavar="FILE", help="accept only announcements signed with this key")
    keyopts.add_stream(p)
    p.add_argument("--key", help="routing key (single message and stdin modes; default empty)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--body", help="publish this one message")
    what.add_argument("--count", type=positive, help="generate this many records")
    p.add_argument("--size", type=byte_size(1, MAX_SIZE), help="generated body size, e.g. 100, 4KiB (default 100)")
    p.add_argument("--rate", type=number(0, what="records/s", above=True), help="generated records per second")
    p.add_argument("--keys", type=positive, help="generated keys key000.. (default 1)")
    p.add_argument(
        "--confirm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wait until the gateway confirms all is journaled, so that a refusal is reported (default); "
        "--no-confirm: exit once sent",
    )
    keyopts.add_client_options(p)
    p.add_argument(
        "--ttl",
        type=duration,
        help="how long each record stays in snapshots, e.g. 30s, 5m (default: until replaced); an empty --body "
        "deletes the key",
    )
    p.check(_modes)
    p.set_defaults(handler=_run)


def _modes(args: argparse.Namespace) -> str | None:
    if not args.ingest and not (args.interface or args.etcd or args.directory):
        return (
            "give --ingest ENDPOINT (or ZEPS_INGEST), or --interface IF, --etcd URL or --directory FILE to find the "
            "stream's gateway by its name"
        )
    if args.count is None:
        given = [f"--{name}" for name in _LOAD_ONLY if getattr(args, name) is not None]
        if given:
            return f"{', '.join(given)} shape a generated load: add --count N, or leave them out"
    elif args.key is not None:
        return "--key is for --body and stdin; a generated load (--count) uses --keys N keys key000.."
    return None


def _run(args: argparse.Namespace) -> int:
    from gateway.client.publisher import Publisher
    from gateway.errors import BadRecord
    from gateway.tools.load import generated

    records: Iterator[tuple[str, bytes]]
    if args.body is not None:
        records = iter([(args.key or "", args.body.encode())])
    elif args.count is not None:
        records = generated(args.count, args.size or 100, args.keys or 1, args.rate or 0.0)
    else:
        records = ((args.key or "", line.rstrip(b"\n")) for line in sys.stdin.buffer)
    from gateway.wire.streamkey import StreamKey

    keys = [StreamKey.load(args.stream_key)] if args.stream_key else []
    directory = discovery_opts.client_directory(args, keys) if not args.ingest else None
    n = 0
    try:
        with Publisher(
            args.ingest or None,
            args.stream,
            confirm=args.confirm,
            curve=keyopts.client_curve(args),
            directory=directory,
            discovery_timeout=args.discovery_timeout,
        ) as pub:
            for key, body in records:
                pub.publish(key, body, ttl=args.ttl)
                n += 1
            last = pub.flush()
    except BadRecord as exc:  # a record this command was given cannot be sent (--key too long, --ttl out of range)
        print(f"zeps publish: {exc.reason}", file=sys.stderr)
        return 2
    finally:
        if directory is not None:
            directory.close()
    say(args, f"zeps publish: published {n} records" + (f", last sequence {last}" if last is not None else ""))
    return 0
