"""`zeps history`: print a stream's journaled records as JSON lines, from the replay sidecar."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from gateway.client.subscriber import Received
    from gateway.wire.batch import Record

from gateway.cli import keyopts


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "history",
        help="print journaled records as JSON lines (from the replay sidecar)",
        description='Prints {"seq", "ts_ns", "key", "body_b64"} per record (and "ttl_ms" if it has one), one JSON '
        "object a line, and exits at --to or at the journal's head as it was when the request was served (the "
        "server ends the request there), whichever comes first. ts_ns is the record's publish time.",
    )
    replay_arguments(p)
    p.add_argument(
        "--from",
        dest="start",
        default="0",
        help="first sequence, or an ISO-8601 time (journal time; UTC unless it has a zone) (default: the first "
        "retained record)",
    )
    p.add_argument("--to", type=int, help="last sequence (default: the head)")
    p.add_argument("--topic", default="", help="only keys starting with this prefix")
    p.set_defaults(handler=_run)


def replay_arguments(p: argparse.ArgumentParser) -> None:
    """--replay, --stream, --timeout and the CURVE keys: what every command reading from the sidecar takes."""
    p.add_argument("--replay", required=True, help="replay sidecar endpoint, e.g. tcp://127.0.0.1:5571")
    p.add_argument("--stream", required=True)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the server (default 10)")
    keyopts.add_client_options(p)


def write_records(records: Iterable[Record | Received], out: TextIO) -> None:
    """One JSON object a line per record: seq, ts_ns (publish time), key, body_b64, and ttl_ms when set."""
    for rec in records:
        line = {"seq": rec.seq, "ts_ns": rec.ts_ns, "key": rec.key, "body_b64": base64.b64encode(rec.body).decode()}
        if rec.ttl_ms:
            line["ttl_ms"] = rec.ttl_ms
        out.write(json.dumps(line, separators=(",", ":")) + "\n")


def _run(args: argparse.Namespace) -> int:
    from gateway.client.position import parse_position
    from gateway.client.replay_client import history
    from gateway.errors import ReplayError
    from gateway.wire.batch import MAX_SEQ

    try:
        first, since_ns = parse_position(args.start)
    except ValueError as exc:
        print(f"zeps history: {exc}", file=sys.stderr)
        return 2
    records = history(
        args.replay,
        args.stream,
        first=first,
        since_ns=since_ns,
        last=MAX_SEQ if args.to is None else args.to,
        pattern=args.topic,
        timeout=args.timeout,
        curve=keyopts.client_curve(args),
    )
    try:
        write_records(records, sys.stdout)
    except ReplayError as exc:
        print(f"zeps history: {exc.reason}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    sys.stdout.flush()
    return 0
