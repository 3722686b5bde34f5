"""`zeps streams`: what is announced on the LAN, or registered in etcd or a directory file (docs/discovery.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from gateway.cli import discovery_opts
from gateway.cli.options import duration

if TYPE_CHECKING:
    from gateway.client.directory import Holder

COLUMNS = ("stream", "copy", "source", "channels", "sidecar", "ingest", "nodes", "head", "rate")


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "streams",
        help="list the streams announced on the LAN (or in etcd, a file): where each one's authoritative copy "
        "lives (copy, source), channels, sidecar, ingest, nodes, head, rate",
        description="Listens to the discovery group on --interface for --wait seconds (gateways and sidecars "
        "announce about once a second), or reads the directory in etcd (--etcd) or a file (--directory), and "
        "prints every stream found: a table, or one JSON object per line. COPY says what each gateway holds: "
        "primary, mirror (of SOURCE, the sidecar its `zeps mirror` reads) or promoted; with several gateways, "
        "COPY@NODE each.",
    )
    discovery_opts.add_client_options(p, timeout=False)
    p.add_argument("--wait", type=duration, default=2.5, help="listen (or wait for etcd) this long (default 2.5 s)")
    p.add_argument("--json", action="store_true", help="one JSON object per stream")
    p.add_argument(
        "--stream-key", action="append", default=[], metavar="FILE", help="list only announcements signed with it"
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.wire.streamkey import StreamKey

    if not (args.interface or args.etcd or args.directory):
        print(
            "zeps streams: give --interface IF (the LAN to listen on), --etcd URL or --directory FILE",
            file=sys.stderr,
        )
        return 2
    directory = discovery_opts.client_directory(args, [StreamKey.load(path) for path in args.stream_key])
    assert directory is not None
    try:
        infos = directory.listen(args.wait)
        dropped = dict(directory.dropped)
    finally:
        directory.close()
    rows = [
        {
            "stream": i.name,
            "copy": _copies(i.holders),
            "source": list(dict.fromkeys(h.source for h in i.holders if h.source)),
            "holders": [{"node": h.node, "copy": h.copy, "source": h.source} for h in i.holders],
            "channels": [str(ch) for ch in i.channels],
            "sidecar": i.sidecar,
            "ingest": i.ingest,
            "nodes": list(i.nodes),
            "head": i.head,
            "rate": i.rate,
        }
        for i in infos
    ]
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        _table(rows)
    if dropped:
        print("zeps streams: dropped " + ", ".join(f"{k}={v}" for k, v in sorted(dropped.items())), file=sys.stderr)
    if not rows:
        print(f"zeps streams: nothing found in {directory.where} in {args.wait:g} s", file=sys.stderr)
        return 1
    return 0


def _copies(holders: tuple[Holder, ...]) -> list[str]:
    """What copy each gateway holds: `mirror` alone, `primary@gw-a`, `mirror@agg` with several."""
    if len(holders) == 1:
        return [holders[0].copy]
    return [f"{h.copy}@{h.node}" for h in holders]


def _table(rows: list[dict]) -> None:
    cells = [[_cell(row[c]) for c in COLUMNS] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(COLUMNS)]
    for line in ([c.upper() for c in COLUMNS], *cells):
        print("  ".join(text.ljust(w) for text, w in zip(line, widths, strict=True)).rstrip())


def _cell(value: object) -> str:
    if isinstance(value, list):
        return ",".join(value) or "-"
    return "-" if value in (None, "") else str(value)
