"""Key options shared by the commands: the stream key (multicast) and CURVE (TCP); see docs/security.md."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the library is imported when a command runs, not for `zeps --help`
    from gateway.transport.curve import CurveClientKeys, CurveServerKeys

_PLAIN = "without them: plain TCP"


def add_server_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--curve-secret", metavar="FILE", help=f"CURVE: this server's NAME.key_secret ({_PLAIN})")
    p.add_argument("--curve-allow", metavar="DIR", help="CURVE: directory of the allowed clients' public NAME.key")


def add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--curve-key", metavar="FILE", help=f"CURVE: this client's NAME.key_secret ({_PLAIN})")
    p.add_argument("--curve-server", metavar="FILE", help="CURVE: the server's public NAME.key")


def server_curve(args: argparse.Namespace) -> CurveServerKeys | None:
    from gateway.transport.curve import server_keys

    return server_keys(args.curve_secret, args.curve_allow)


def client_curve(args: argparse.Namespace) -> CurveClientKeys | None:
    from gateway.transport.curve import client_keys

    return client_keys(args.curve_key, args.curve_server)
