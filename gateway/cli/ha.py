"""`zeps ha status|check`: a replicated gateway group as etcd knows it, and do its nodes' journals agree
(docs/ha.md). Each prints one JSON line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gateway.cli import discovery_opts, tls_opts
from gateway.cli.options import Parser, stream_name


def register(commands: argparse._SubParsersAction) -> None:
    ha: Parser = commands.add_parser("ha", help="a replicated gateway group: `zeps ha status`, `zeps ha check`")
    actions = ha.add_subparsers(dest="ha_command", metavar="ACTION", required=True)
    status = actions.add_parser(
        "status",
        help="the group's leader, epoch, in-sync followers and each node's heads, from etcd",
        description="One JSON line with the group's leader, its epoch, the in-sync followers and each node's "
        "role and journal heads (reported every second; `age_s` says how long ago).",
    )
    status.add_argument(
        "--etcd", required=True, metavar="URL", help="etcd client URL, e.g. http://10.0.0.9:2379 (a cluster: URL,URL)"
    )
    status.add_argument("--stream", action="append", required=True, type=stream_name, help="a stream of the group")
    tls_opts.add_etcd_options(status)
    status.set_defaults(handler=_status)
    check = actions.add_parser(
        "check",
        help="prove the nodes' journals agree: one record per sequence, no gap, no record twice; exit 1 if not",
        description="Reads every node's journal (copies, or the live directories: it only reads) and proves, "
        "per stream: wherever a sequence exists it holds the same record; each node holds every sequence below "
        "its head; no producer's record is journaled twice. Prints one JSON line per stream (each node's first "
        "sequence and head, the highest sequence compared, the first divergence if any); on a violation, one "
        "line naming it on stderr and exit status 1.",
    )
    check.add_argument(
        "--journal", action="append", required=True, type=Path, metavar="DIR", help="a node's journal root (repeat)"
    )
    check.add_argument(
        "--stream", action="append", type=stream_name, help="only this stream (repeat; default: every stream found)"
    )
    check.set_defaults(handler=_check)


def _status(args: argparse.Namespace) -> int:
    from gateway.replication.follower import LeaderInfo
    from gateway.replication.group import group_key
    from gateway.replication.replicas import parse_record
    from gateway.transport.etcd import Cluster, Etcd

    cluster = Cluster(discovery_opts.etcd_urls(args.etcd), tls_opts.etcd_tls(args))
    etcd, prefix = Etcd(cluster, timeout_s=2.0), group_key(args.stream)
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


def _check(args: argparse.Namespace) -> int:
    from gateway.errors import NotAJournal
    from gateway.journal import journal_streams
    from gateway.journal.crosscheck import check_group

    streams = args.stream or sorted({s for root in args.journal if _holds_any(root) for s in journal_streams(root)})
    if not streams:
        named = ", ".join(str(j) for j in args.journal)
        raise NotAJournal(f"no journal streams under {named}: pass the nodes' journal roots")
    failed = []
    for stream in streams:
        result = check_group(args.journal, stream)
        print(json.dumps(result.plain()), flush=True)
        if result.violation is not None:
            failed.append(f"stream {stream}: {result.violation}")
    for line in failed:
        print(f"zeps ha check: {line}", file=sys.stderr)
    return 1 if failed else 0


def _holds_any(root: Path) -> bool:
    """False for an empty directory (a node that never journaled anything): not a reason to stop the check."""
    return not root.is_dir() or any(root.iterdir())
