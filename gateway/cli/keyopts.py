"""Options shared by the commands: endpoints and stream names of clients, the stream key (multicast) and CURVE
(TCP; see docs/security.md). Clients take each from an environment variable too; the command line wins."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gateway.cli.options import Parser, stream_name, tcp_endpoint

if TYPE_CHECKING:  # the library is imported when a command runs, not for `zeps --help`
    from gateway.transport.curve import CurveClientKeys, CurveServerKeys

_PLAIN = "without them: plain TCP"


def add_stream(p: Parser, help: str | None = None) -> None:
    p.from_env(p.add_argument("--stream", type=stream_name, help=help), "ZEPS_STREAM")
    p.require("stream")


def add_replay(
    p: Parser, *, required: bool, many: bool = False, help: str = "replay sidecar endpoint, e.g. tcp://127.0.0.1:5571"
) -> None:
    """--replay; `many`: repeatable (a list; the variable separates them with commas)."""
    if many:
        option = p.add_argument("--replay", action="append", default=[], type=tcp_endpoint, help=help)
    else:
        option = p.add_argument("--replay", type=tcp_endpoint, help=help)
    p.from_env(option, "ZEPS_REPLAY")
    if required:
        p.require("replay")


def add_server_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--curve-secret", metavar="FILE", help=f"CURVE: this server's NAME.key_secret ({_PLAIN})")
    p.add_argument("--curve-allow", metavar="DIR", help="CURVE: directory of the allowed clients' public NAME.key")


def add_client_options(p: Parser) -> None:
    key = p.add_argument("--curve-key", metavar="FILE", help=f"CURVE: this client's NAME.key_secret ({_PLAIN})")
    server = p.add_argument("--curve-server", metavar="FILE", help="CURVE: the server's public NAME.key")
    p.from_env(key, "ZEPS_CURVE_KEY")
    p.from_env(server, "ZEPS_CURVE_SERVER")


def server_curve(args: argparse.Namespace) -> CurveServerKeys | None:
    from gateway.transport.curve import server_keys

    return server_keys(args.curve_secret, args.curve_allow)


def client_curve(args: argparse.Namespace) -> CurveClientKeys | None:
    from gateway.transport.curve import client_keys

    return client_keys(args.curve_key, args.curve_server)
