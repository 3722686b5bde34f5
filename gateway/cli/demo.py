"""`zeps demo`: the end-to-end run that `make demo` starts."""

from __future__ import annotations

import argparse

from gateway.cli.options import number, positive


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "demo",
        help="run the whole system on a throw-away namespace LAN and print a verdict (root)",
        description="Builds a LAN of network namespaces (gw, pub, early, late), runs the gateway and the replay "
        "sidecar on gw, publishes a paced feed from pub, and checks two reconciling subscribers record by record: "
        "'early' behind packet loss, 'late' joining a third of the way in. Removes the LAN afterwards. "
        "Exit status 0 only when both received the whole feed in order, exactly once.",
    )
    p.add_argument("--records", type=positive, default=60_000, help="records to publish (default 60000)")
    p.add_argument(
        "--rate",
        type=number(0, what="records/s", above=True),
        default=5_000.0,
        help="records per second (default 5000)",
    )
    p.add_argument(
        "--loss",
        type=number(0, 100, "percent"),
        default=5.0,
        help="inbound packet loss at 'early', percent (default 5)",
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.cli import extras

    extras.require("lab", "scapy")  # netlab's packet injection (the rogue sender)
    from gateway.tools.demo import DemoPlan, run

    ok = run(DemoPlan(records=args.records, rate=args.rate, loss_pct=args.loss), say=lambda s: print(s, flush=True))
    return 0 if ok else 1
