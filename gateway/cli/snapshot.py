"""`zeps snapshot`: print the last record of every key of a stream as JSON lines, from the replay sidecar."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gateway.cli import keyopts
from gateway.cli.history import replay_arguments, write_records

if TYPE_CHECKING:
    from gateway.wire.batch import Record


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "snapshot",
        help="print the last record of every key as JSON lines (the current state; from the replay sidecar)",
        description='Prints {"seq", "ts_ns", "key", "body_b64"} (and "ttl_ms" if set) of the last record of every '
        "key, in sequence order, as of one sequence N, which is reported on stderr. Deleted keys (last record "
        "with an empty body) and records whose TTL has run out are left out. To follow on from it: "
        "zeps subscribe --from N+1, or zeps subscribe --from snapshot, which does both.",
    )
    replay_arguments(p)
    p.add_argument("--topic", action="append", default=[], help="only keys starting with this prefix (repeatable)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.client.replay_client import snapshot
    from gateway.errors import ReplayError

    last: list[int] = []
    curve = keyopts.client_curve(args)

    def records() -> Iterator[Record]:  # the records, keeping the generator's return value (N)
        prefixes = tuple(args.topic)
        last.append(
            (yield from snapshot(args.replay, args.stream, prefixes=prefixes, timeout=args.timeout, curve=curve))
        )

    try:
        write_records(records(), sys.stdout)
    except ReplayError as exc:
        print(f"zeps snapshot: {exc.reason}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    sys.stdout.flush()
    print(f"zeps snapshot: as of sequence {last[0]}; follow on with --from {last[0] + 1}", file=sys.stderr)
    return 0
