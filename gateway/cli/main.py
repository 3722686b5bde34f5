"""`zeps`: the command line. Each subcommand lives in `gateway.cli` as a thin shell over the library."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from gateway import __version__
from gateway.cli import MODULES


def _user_errors() -> tuple[type[Exception], ...]:
    from gateway.errors import (
        AuthError,
        BatchError,
        ConfigError,
        DiscoveryError,
        JournalError,
        McastError,
        ProtocolError,
        PublishError,
        ReplayError,
    )

    return (
        AuthError,
        BatchError,
        ConfigError,
        DiscoveryError,
        JournalError,
        McastError,
        ProtocolError,
        PublishError,
        ReplayError,
        OSError,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeps",
        description="Reliable multicast pub-sub: gateway, replay sidecar, reconciling subscriber, tools.",
    )
    parser.add_argument("--version", action="version", version=f"zeps {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in MODULES:
        importlib.import_module(f"gateway.cli.{name}").register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return 130
    except _user_errors() as exc:
        # Bad input, a bad journal, an unreachable peer: the message names the cause and the fix.
        print(f"zeps {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
