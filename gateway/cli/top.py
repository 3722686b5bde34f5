"""`zeps top`: a live terminal view of a deployment, read from its Prometheus metrics endpoints."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from gateway.cli import extras
from gateway.cli.options import duration, host_port
from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.tools.top import Top


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "top",
        help="live view of a deployment from its metrics endpoints (streams, sidecars, subscribers, mirrors)",
        description="Scrapes the --metrics endpoints of gateways, replay sidecars and subscribers every --interval "
        "seconds and shows, refreshed in place: per stream the head, rates, bytes and publishers; multicast "
        "outputs; the sidecars' clients and credit; each subscriber's state, lag, gaps and losses; each site "
        "mirror's heads and how far it is behind its source (records and seconds); and every "
        "error counter that moved. --once --json prints one view as JSON (rates over one --interval) for scripts.",
    )
    p.add_argument(
        "--gateway", action="append", default=[], type=host_port, metavar="HOST:PORT", help="a gateway's --metrics"
    )
    p.add_argument(
        "--replay", action="append", default=[], type=host_port, metavar="HOST:PORT", help="a sidecar's --metrics"
    )
    p.add_argument(
        "--subscriber",
        action="append",
        default=[],
        type=host_port,
        metavar="HOST:PORT",
        help="a subscriber's --metrics",
    )
    p.add_argument(
        "--mirror", action="append", default=[], type=host_port, metavar="HOST:PORT", help="a `zeps mirror`'s --metrics"
    )
    p.add_argument("--interval", type=duration, default=1.0, help="seconds between refreshes (default 1)")
    p.add_argument("--once", action="store_true", help="one view (two scrapes, --interval apart, for rates), then exit")
    p.add_argument("--json", action="store_true", help="JSON instead of tables: one object per refresh, one line each")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.tools.top import Top, targets

    if not args.interval > 0:
        print(f"zeps top: --interval {args.interval:g}: must be more than 0 seconds", file=sys.stderr)
        return 2
    chosen = targets(args.gateway, args.replay, args.subscriber, args.mirror)
    if not chosen:
        print(
            "zeps top: name at least one endpoint: --gateway, --replay, --subscriber or --mirror HOST:PORT",
            file=sys.stderr,
        )
        return 2
    if not args.json and not extras.importable("rich"):
        # As every command short of an extra: exit 2, one line naming it and the pip command (gateway.cli.extras).
        raise ConfigError(f"{extras.missing('top', ('rich',))}, or use --json")
    top = Top(chosen, timeout=min(2.0, max(0.5, args.interval)))
    try:
        if args.once:
            top.view()  # the first scrape: rates need a second
            time.sleep(args.interval)
            view = top.view()
            _print(view, args)
            return 0 if _all_up(view) else 1
        if args.json:
            while True:
                _print(top.view(), args)
                time.sleep(args.interval)
        return _live(top, args.interval)
    except KeyboardInterrupt:
        return 0  # how one leaves a live view
    finally:
        top.close()


def _print(view: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(view, separators=(",", ":")), flush=True)
        return
    from rich.console import Console

    from gateway.tools.top_view import render

    Console().print(render(view, args.interval))


def _live(top: Top, interval: float) -> int:
    from rich.live import Live

    from gateway.tools.top_view import render

    with Live(render(top.view(), interval), auto_refresh=False, screen=True) as live:
        while True:
            time.sleep(interval)
            live.update(render(top.view(), interval), refresh=True)


def _all_up(view: dict[str, Any]) -> bool:
    from gateway.tools.top import KINDS

    return all(entry["up"] for kind in KINDS for entry in view[kind])
