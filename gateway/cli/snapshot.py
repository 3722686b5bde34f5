"""`zeps snapshot`: print the last record of every key of a stream, from the replay sidecar."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gateway.cli import keyopts
from gateway.cli.history import replay_arguments
from gateway.cli.options import Parser, say
from gateway.cli.output import add_format, write_records

if TYPE_CHECKING:
    from gateway.wire.batch import Record


def register(commands: argparse._SubParsersAction) -> None:
    p: Parser = commands.add_parser(
        "snapshot",
        help="print the last record of every key (the current state; from the replay sidecar)",
        description="Prints the last record of every key, one a line (--format), in sequence order, as of one "
        "sequence N, which is reported on stderr. Deleted keys (last record with an empty body) and records "
        "whose TTL has run out are left out. To follow on from it: zeps subscribe --from N+1, or zeps subscribe "
        "--from snapshot, which does both.",
    )
    replay_arguments(p)
    p.add_argument("--topic", action="append", default=[], help="only keys starting with this prefix (repeatable)")
    add_format(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.client.replay_client import snapshot

    last: list[int] = []
    curve = keyopts.client_curve(args)

    def records() -> Iterator[Record]:  # the records, keeping the generator's return value (N)
        prefixes = tuple(args.topic)
        last.append(
            (yield from snapshot(args.replay, args.stream, prefixes=prefixes, timeout=args.timeout, curve=curve))
        )

    write_records(records(), sys.stdout.buffer, args.format)
    sys.stdout.flush()
    say(args, f"zeps snapshot: as of sequence {last[0]}; follow on with --from {last[0] + 1}")
    return 0
