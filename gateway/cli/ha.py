"""`zeps ha status`: a replicated gateway group as etcd knows it, as one JSON line (docs/ha.md)."""

from __future__ import annotations

import argparse
import json
import time

from gateway.cli.options import Parser, stream_name


def register(commands: argparse._SubParsersAction) -> None:
    p: Parser = commands.add_parser(
        "ha",
        help="a replicated gateway group: `zeps ha status`",
        description="status: one JSON line with the group's leader, its epoch, the in-sync followers and each "
        "node's role and journal heads (reported every 0.5 s; `age_s` says how long ago).",
    )
    p.add_argument("action", choices=("status",))
    p.add_argument("--etcd", required=True, metavar="URL", help="etcd client URL, e.g. http://10.0.0.9:2379")
    p.add_argument("--stream", action="append", required=True, type=stream_name, help="a stream of the group")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gateway.server.follower import LeaderInfo
    from gateway.server.ha import group_key
    from gateway.server.replicas import parse_record
    from gateway.transport.etcd import Etcd

    etcd, prefix = Etcd(args.etcd, timeout_s=2.0), group_key(args.stream)
    holder = etcd.holder(f"{prefix}/leader")
    _, insync = parse_record(etcd.get(f"{prefix}/insync"))
    nodes = {}
    for entry in etcd.get_prefix(f"{prefix}/nodes/"):
        status = json.loads(entry.value)
        status["age_s"] = round(time.time() - status.pop("time"), 3)
        nodes[entry.key.rsplit("/", 1)[-1]] = status
    print(
        json.dumps(
            {
                "leader": LeaderInfo.decode(holder.value).node if holder else None,
                "epoch": holder.create_revision if holder else None,
                "insync": sorted(insync),
                "nodes": nodes,
            }
        )
    )
    return 0
