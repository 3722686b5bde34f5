"""`zeps history`: print a stream's journaled records, from the replay sidecar."""

from __future__ import annotations

import argparse
import sys

from gateway.cli import keyopts
from gateway.cli.options import Parser, duration, position, positive, say
from gateway.cli.output import add_format, write_records
from gateway.client.start_point import StartPoint, ago


def register(commands: argparse._SubParsersAction) -> None:
    p: Parser = commands.add_parser(
        "history",
        help="print journaled records (from the replay sidecar)",
        description="Prints the records of a range, one a line (--format), and exits at --to or at the journal's "
        "head as it was when the request was served (the server ends the request there), whichever comes "
        "first. Times are journal times; ts_ns is the record's publish time.",
    )
    replay_arguments(p)
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--from",
        dest="start",
        type=position(),
        help="first sequence; -N: the last N sequences; or an ISO-8601 time with a zone, e.g. 2026-05-01T09:30Z "
        "(default: the first retained record)",
    )
    start.add_argument("--since", type=duration, help="records journaled in the last DURATION, e.g. 5m, 2h, 1d")
    p.add_argument("--to", type=positive, help="last sequence (default: the head)")
    p.add_argument("--topic", default="", help="only keys starting with this prefix (one prefix)")
    add_format(p)
    p.check(_range_in_order)
    p.set_defaults(handler=_run)


def replay_arguments(p: Parser) -> None:
    """--replay, --stream, --timeout and the CURVE keys: what every command reading from the sidecar takes."""
    keyopts.add_replay(p, required=True)
    keyopts.add_stream(p)
    p.add_argument("--timeout", type=duration, default=10.0, help="how long to wait for the server (default 10s)")
    keyopts.add_client_options(p)


def _range_in_order(args: argparse.Namespace) -> str | None:
    if args.start is not None and args.start.seq is not None and args.to is not None and args.start.seq > args.to:
        return f"--from {args.start.seq} is after --to {args.to}: the range would be empty; swap them"
    return None


def _run(args: argparse.Namespace) -> int:
    from gateway.errors import NotGranted
    from gateway.wire.protocol import FEATURE_RANGE

    try:
        return _print_history(args)
    except NotGranted as exc:
        if f"'{FEATURE_RANGE}'" not in str(exc):
            raise
        # Only a replay sidecar serves ranges: this is the gateway's ingest (or another ZEPS server), as with
        # `zeps subscribe`, which the ingest itself tells so.
        raise NotGranted(
            f"{args.replay} serves no history (it grants no '{FEATURE_RANGE}' extension: it is not a replay "
            "sidecar, e.g. the gateway's ingest port): give --replay the endpoint `zeps replay` serves (its --bind)"
        ) from None


def _print_history(args: argparse.Namespace) -> int:
    from gateway.client.replay_client import history
    from gateway.wire.batch import MAX_SEQ

    start: StartPoint = ago(args.since) if args.since is not None else (args.start or StartPoint(seq=0))
    first = start.seq or 0
    if start.back is not None:
        first = max(1, head(args, args.timeout) - start.back + 1)
    records = history(
        args.replay,
        args.stream,
        first=first,
        since_ns=start.time_ns,
        last=MAX_SEQ if args.to is None else args.to,
        pattern=args.topic,
        timeout=args.timeout,
        curve=keyopts.client_curve(args),
    )
    n = write_records(records, sys.stdout.buffer, args.format)
    sys.stdout.flush()
    if args.verbosity > 0:
        say(args, f"zeps history: {n} records")
    return 0


def head(args: argparse.Namespace, timeout: float) -> int:
    """The last sequence of the stream, asked of the sidecar at --replay (for --from -N); of several
    (`zeps subscribe --replay A --replay B`), the first that answers."""
    from gateway.client.replay_client import ReplayClient, ask_head
    from gateway.errors import ReplayError

    endpoints = [args.replay] if isinstance(args.replay, str) else args.replay
    curve = keyopts.client_curve(args)
    for i, endpoint in enumerate(endpoints, 1):
        last = i == len(endpoints)
        try:  # a one-shot question: nothing listening is an answer, not a reason to wait out the timeout
            with ReplayClient(endpoint, args.stream, timeout=timeout, curve=curve, fail_unreachable=True) as client:
                return ask_head(client)
        except ReplayError:
            if last:
                raise
    raise AssertionError("--replay is required, so there is an endpoint")
