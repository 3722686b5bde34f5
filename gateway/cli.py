"""`zeps`: the command line. Each subcommand is a thin shell over a library call."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway import __version__

Handler = Callable[[argparse.Namespace], int]


def _journal_inspect(args: argparse.Namespace) -> int:
    from gateway.journal import inspect_root

    for info in inspect_root(args.dir):
        print(info.describe())
    return 0


def _journal_verify(args: argparse.Namespace) -> int:
    from gateway.journal import verify_root

    report = verify_root(args.dir)
    print(report.describe())
    return 0 if report.clean else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeps",
        description="Reliable multicast pub-sub: gateway, replay sidecar, reconciling subscriber, tools.",
    )
    parser.add_argument("--version", action="version", version=f"zeps {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    journal = commands.add_parser("journal", help="inspect and verify journal directories")
    journal_cmds = journal.add_subparsers(dest="journal_command", metavar="ACTION", required=True)
    inspect = journal_cmds.add_parser("inspect", help="streams, sequence and time ranges, segments, bytes")
    inspect.add_argument("dir", type=Path, help="journal root directory (one subdirectory per stream)")
    inspect.set_defaults(handler=_journal_inspect)
    verify = journal_cmds.add_parser(
        "verify", help="check every checksum and sequence continuity; exit 0 only if clean"
    )
    verify.add_argument("dir", type=Path, help="journal root directory (one subdirectory per stream)")
    verify.set_defaults(handler=_journal_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
