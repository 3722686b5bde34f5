"""`zeps journal inspect|verify DIR`."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    journal = commands.add_parser("journal", help="inspect and verify journal directories")
    actions = journal.add_subparsers(dest="journal_command", metavar="ACTION", required=True)
    inspect = actions.add_parser("inspect", help="streams, sequence and time ranges, segments, bytes")
    inspect.add_argument("dir", type=Path, help="journal root directory (one subdirectory per stream)")
    inspect.set_defaults(handler=_inspect)
    verify = actions.add_parser("verify", help="check every checksum and sequence continuity; exit 0 only if clean")
    verify.add_argument("dir", type=Path, help="journal root directory (one subdirectory per stream)")
    verify.set_defaults(handler=_verify)


def _inspect(args: argparse.Namespace) -> int:
    from gateway.journal import inspect_root

    for info in inspect_root(args.dir):
        print(info.describe())
    return 0


def _verify(args: argparse.Namespace) -> int:
    from gateway.journal import verify_root

    report = verify_root(args.dir)
    print(report.describe())
    return 0 if report.clean else 1
